"""The story `python -m testkit.real_node_up start --play` plays on the node it brought up
(testkit/real_node_up.py): a Job holding a device plugin's GPU, a Job holding a DRA claim, the
GPU failing at its plugin and healing, the claim's device failing at its driver with a message
and healing. Each step says what it does, what the cluster shows, and prints the agent's events
as they arrive; a step that does not get the event it waits for fails the story.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO

from testkit.agent import AgentRun
from testkit.kubelet_lite import DevicePlugin
from testkit.node_agent import until_node_condition
from testkit.real_dra import DraSetup, allocated_device, claim_job, claim_of, job_pod, until_status_health
from testkit.real_node import RealNode, held_devices
from watcher.model.events import Event
from watcher.sinks.kubernetes.condition_plan import condition_type
from watcher.sinks.stdout import format_line

__all__ = ["GPU", "GPUS", "Narrator", "Stage", "play"]

GPU = "example.com/gpu"
# Four GPUs, two per NUMA node, as on a two-socket machine.
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}
NAMESPACE = "ml"
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"
# The kubelet, the driver's health stream and the agent each take a moment on a busy machine.
STEP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Stage:
    """What the story acts on: the node, its device plugin and DRA driver, the running agent."""

    node: RealNode
    plugin: DevicePlugin
    dra: DraSetup
    run: AgentRun


class Narrator:
    """Prints each of the agent's events once, as it arrives, under the step that caused it."""

    def __init__(self, run: AgentRun, out: TextIO) -> None:
        self.run = run
        self.out = out
        self.printed = 0

    def attach(self) -> None:
        # The recorder subscribed first: by the time this runs the event is in its list.
        self.run.agent.subscribe(self._on_event)
        self.flush()

    def _on_event(self, _event: Event) -> None:
        self.flush()

    def flush(self) -> None:
        events = self.run.recorder.events
        for event in events[self.printed :]:
            print(f"    agent: {format_line(event)}", file=self.out, flush=True)
        self.printed = len(events)


async def play(stage: Stage, out: TextIO) -> None:
    """The four steps and a summary; AssertionError when a step's outcome never shows."""
    node, run = stage.node, stage.run

    def say(text: str) -> None:
        print(f"    {text}", file=out, flush=True)

    def step(title: str) -> int:
        print(f"\n== {title}", file=out, flush=True)
        return len(run.recorder.events)

    first = len(run.recorder.events)
    namespace = await node.namespace(NAMESPACE)

    mark = step(f"A Job asks for one {GPU} (the device plugin's)")
    await node.apply(_gpu_job(node, namespace, "trainer"))
    trainer = await job_pod(node, namespace, "trainer", timeout=STEP_TIMEOUT_S)
    (held,) = held_devices(trainer, GPU)
    say(f"the scheduler bound {_name(trainer)} to {node.name}; the kubelet gave it {held}")
    await _until_kind(run, mark, "allocation.added")

    mark = step(
        f"A Job asks for a device through a ResourceClaimTemplate (DeviceClass {stage.dra.device_class})"
    )
    await claim_job(node, stage.dra, namespace, "llm")
    llm = await job_pod(node, namespace, "llm", timeout=STEP_TIMEOUT_S)
    claim = await claim_of(node, llm)
    device = allocated_device(claim)
    say(f"claim {claim['metadata']['name']}: {stage.dra.name}/{stage.dra.pool}/{device}, allocated by the")
    say(f"scheduler, prepared by the driver through the kubelet; {_name(llm)} Running")
    await _until_kind(run, mark, "allocation.added")

    condition = condition_type(GPU)
    mark = step(f"GPU {held} fails at its plugin (ListAndWatch says Unhealthy)")
    await stage.plugin.set_healthy(held, False)
    await _until_kind(run, mark, "device.removed")
    failed = await until_node_condition(node, condition, "True", STEP_TIMEOUT_S)
    say(f"Node {node.name}: {condition}=True, {failed['message']!r}")

    mark = step(f"GPU {held} heals")
    await stage.plugin.set_healthy(held, True)
    await _until_kind(run, mark, "device.added")
    await until_node_condition(node, condition, "False", STEP_TIMEOUT_S)
    say(f"Node {node.name}: {condition}=False")

    mark = step(f"DRA device {device} fails at the driver: {XID!r}")
    await stage.dra.driver.set_health(stage.dra.pool, device, "Unhealthy", XID)
    entry = await until_status_health(node, namespace, llm["metadata"]["name"], "Unhealthy", STEP_TIMEOUT_S)
    say(f"the kubelet put it in {_name(llm)}'s status: {entry['name']} {entry['health']}")
    await _until_kind(run, mark, "device.unhealthy")

    mark = step(f"DRA device {device} heals")
    await stage.dra.driver.set_health(stage.dra.pool, device, "Healthy")
    await _until_kind(run, mark, "device.healthy")

    await run.quiet_cycle(STEP_TIMEOUT_S)
    told = Counter(run.recorder.kinds(first))
    print("\n== The story is over", file=out, flush=True)
    say("the agent reported: " + ", ".join(f"{kind} x{count}" for kind, count in sorted(told.items())))
    say(f"its Events and condition are in the API server: kubectl get events -n {namespace},")
    say(f"kubectl describe node {node.name} (--stay keeps it all running to look)")


async def _until_kind(run: AgentRun, mark: int, kind: str) -> None:
    await run.recorder.until(lambda: kind in run.recorder.kinds(mark), STEP_TIMEOUT_S)


def _gpu_job(node: RealNode, namespace: str, name: str) -> dict[str, Any]:
    """A Job whose one pod asks for a GPU, kept to `node` as the DRA Jobs are (testkit.real_dra)."""
    container = {"name": "main", "image": "registry.test/trainer:1", "resources": {"limits": {GPU: 1}}}
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"team": "research"}}, "spec": spec}},
    }


def _name(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
