"""DRA through upstream code on a real node: upstream's DRA test driver registered with upstream's
kubelet, claims from templates made by the resourceclaim controller and allocated by the real
kube-scheduler for a Job's pod, prepared by the kubelet through the driver; the device's health
from the driver's health stream, through the kubelet's DRA manager into the Pod status, to the
agent's events and pages. Each scenario counts the agent's events exactly."""

from __future__ import annotations

import asyncio
import signal
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun
from testkit.http_sinks import pd_table
from testkit.kube_testcluster import KubeTestCluster
from testkit.node_agent import agent_on_node
from testkit.real_dra import (
    add_dra_driver,
    allocated_device,
    claim_job,
    claim_of,
    job_pod,
    until_status_health,
)
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"


def _tag() -> str:
    return f"t{uuid.uuid4().hex[:6]}"


def _agent(
    short_tmp: Path,
    node: RealNode,
    pager: PagerDutyReceiver,
    *,
    kubernetes: bool = False,
    slices_interval: float = 30.0,
    **pods: Any,
) -> AbstractAsyncContextManager[AgentRun]:
    config = {
        "sinks": {"pager": pd_table(pager)},
        "pods": pods,
        "resource_slices": {"interval": slices_interval},
    }
    return agent_on_node(short_tmp, node, config, kubernetes=kubernetes)


async def test_a_jobs_pod_scheduled_with_a_plugin_gpu_is_one_allocation_added_naming_uid_and_job(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    await node.add_plugin(GPU, GPUS)
    namespace = await node.namespace(f"job-{uuid.uuid4().hex[:6]}")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        mark = len(run.recorder.events)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "trainer", "namespace": namespace},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": node.name},
                        "containers": [{"name": "main", "image": "registry.test/trainer:1",
                                        "resources": {"limits": {GPU: 1}}}],
                    }
                },
            },
        }  # fmt: skip
        await node.apply(job)
        pod = await job_pod(node, namespace, "trainer")
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark), timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert added.details["pod_uid"] == pod["metadata"]["uid"]
        assert added.details["owner"]["kind"] == "Job" and added.details["owner"]["name"] == "trainer"
        assert pager.events == []


async def test_a_claims_device_failing_at_the_driver_is_one_page_with_its_words_and_heals(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"dra-{uuid.uuid4().hex[:6]}")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        await claim_job(node, dra, namespace, "llm")
        pod = await job_pod(node, namespace, "llm")
        claim = await claim_of(node, pod)
        device = allocated_device(claim)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
        await until_status_health(node, namespace, pod["metadata"]["name"], "Unhealthy")
        await pager.wait_for(1, timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.unhealthy"]
        event = run.recorder.events[mark]
        assert event.severity.value == "critical"
        d = event.details
        assert (d["driver"], d["pool"], d["device_name"], d["claim"], d["message"]) == (
            dra.name, dra.pool, device, claim["metadata"]["name"], XID,
        )  # fmt: skip
        assert (
            d["pods"][0]["owner"] == {"kind": "Job", "name": "llm"} or d["pods"][0]["owner"]["name"] == "llm"
        )
        (page,) = pager.events
        assert page["event_action"] == "trigger" and XID in page["payload"]["summary"]

        await dra.driver.set_health(dra.pool, device, "Healthy")
        await pager.wait_for(2, timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.unhealthy", "device.healthy"]
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]


async def test_a_driver_that_reports_no_health_leaves_its_devices_unknown_and_nothing_is_said(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    """Unknown is the kubelet's default for a device no driver speaks for: not a fault. Even past
    the Unknown grace (1 s here), the agent says nothing of it."""
    node = scheduled_node
    dra = await add_dra_driver(node, _tag(), health=False)
    namespace = await node.namespace(f"mute-{uuid.uuid4().hex[:6]}")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager, health_unknown_grace=1.0) as run:
        mark = len(run.recorder.events)
        await claim_job(node, dra, namespace, "quiet")
        pod = await job_pod(node, namespace, "quiet")
        entry = await until_status_health(node, namespace, pod["metadata"]["name"], "Unknown")
        assert entry["name"] == "claim:gpu"
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark), timeout=15)
        # The positive control: the agent has the verdict and tied it to the claim's device.
        watch = run.agent.pods_watch
        assert watch is not None
        await run.recorder.until(lambda: watch.index.get(namespace, pod["metadata"]["name"]) is not None, 15)
        await run.quiet_cycle()
        assert run.agent.committer.state.device_health.pending == ()
        # An absence cannot be awaited: wait well past the Unknown grace, when a warning would be due.
        await asyncio.sleep(3.0)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.added"]
        assert pager.events == []


async def test_kubelet_restarts_with_pods_and_claims_in_place_are_one_kubelet_restarted_each(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    """SIGTERM, then SIGKILL: the kubelet restores devices and claims from its checkpoints, deletes
    its node's ResourceSlices and the driver publishes them again, the plugin registers again:
    nothing but kubelet.restarted, and no page."""
    node = scheduled_node
    plugin_gpus = await node.add_plugin(GPU, GPUS)
    assert plugin_gpus.devices
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"rst-{uuid.uuid4().hex[:6]}")
    await node.apply(node.pod(namespace, "plugin-holder", {GPU: 1}))
    await node.wait_pod(namespace, "plugin-holder")
    await claim_job(node, dra, namespace, "claim-holder")
    pod = await job_pod(node, namespace, "claim-holder")
    device = allocated_device(await claim_of(node, pod))
    await dra.driver.set_health(dra.pool, device, "Healthy")
    await until_status_health(node, namespace, pod["metadata"]["name"], "Healthy")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        for n, how in enumerate((signal.SIGTERM, signal.SIGKILL)):
            await node.restart(how)

            def restarted(count: int = n + 1) -> bool:
                return run.recorder.kinds(mark).count("kubelet.restarted") == count

            await run.recorder.until(restarted, timeout=60)
            await node.wait_allocatable(GPU, set(GPUS), timeout=30)
            await run.released()
            await run.pods_watching(timeout=30)
        await until_status_health(node, namespace, pod["metadata"]["name"], "Healthy")
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"] * 2
        assert run.agent.inventory == before
        assert pager.events == []


async def test_a_dra_driver_restart_pages_nobody(scheduled_node: RealNode, short_tmp: Path) -> None:
    """The driver stops (its health stream closes: the kubelet forgets the health it reported, and
    the holder's status says Unknown at its next sync) and starts again, reporting Healthy: the
    agent sees the Unknown (its index) and says nothing, since the device comes back within its
    Unknown grace (the default 120 s); no page."""
    node = scheduled_node
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"drv-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "held")
    pod = await job_pod(node, namespace, "held")
    name = pod["metadata"]["name"]
    device = allocated_device(await claim_of(node, pod))
    await dra.driver.set_health(dra.pool, device, "Healthy")
    await until_status_health(node, namespace, name, "Healthy")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        mark = len(run.recorder.events)
        await dra.driver.stop()
        await until_status_health(node, namespace, name, "Unknown", 60, nudge=True)
        watch = run.agent.pods_watch
        assert watch is not None

        def agent_saw(health: str) -> bool:
            held = watch.index.get(namespace, name)
            return held is not None and any(v.health == health for v in held.verdicts if v.is_claim)

        await run.recorder.until(lambda: agent_saw("Unknown"), timeout=15)  # the window was seen
        await dra.driver.start()
        await dra.driver.set_health(dra.pool, device, "Healthy")  # a new process says it again

        async def registered() -> bool:
            return bool((await dra.driver.state()).get("registered"))

        await wait_until(registered, 30, interval=0.2, what="the restarted driver registered")
        await until_status_health(node, namespace, name, "Healthy", 60, nudge=True)
        await run.recorder.until(lambda: agent_saw("Healthy"), timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == []
        assert pager.events == []


@pytest.mark.timeout(180)
async def test_a_driver_that_stops_reporting_is_unknown_after_the_grace_a_warning_never_a_page(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    """The driver stays registered but sends no more health reports. The kubelet times a device's
    health out 30 s after its last report (DefaultHealthTimeout, the driver giving none of its own)
    and shows Unknown when it next syncs the pod: a periodic resync (1 to 1.5 min) or any update of
    the pod, here an annotation, so the test need not wait for the resync. The agent: after its
    Unknown grace, one warning; no page."""
    node = scheduled_node
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"stale-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "stale")
    pod = await job_pod(node, namespace, "stale")
    name = pod["metadata"]["name"]
    device = allocated_device(await claim_of(node, pod))
    await dra.driver.set_health(dra.pool, device, "Healthy")
    await until_status_health(node, namespace, name, "Healthy")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager, health_unknown_grace=2.0) as run:
        mark = len(run.recorder.events)
        await dra.driver.mute()
        muted_at = asyncio.get_running_loop().time()

        # The kubelet's own 30 s timeout, shown at the pod's next sync (nudged: an annotation).
        await until_status_health(node, namespace, name, "Unknown", 90, nudge=True)
        stale_after = asyncio.get_running_loop().time() - muted_at
        assert stale_after >= 25, stale_after  # the kubelet's own 30 s timeout, not before
        await run.recorder.until(lambda: "device.health_unknown" in run.recorder.kinds(mark), timeout=20)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.health_unknown"]
        assert run.recorder.events[mark].severity.value == "warning"
        assert pager.events == []


async def test_a_resource_slice_taint_and_the_pod_status_saying_the_same_are_one_story(
    reporting: KubeTestCluster, scheduled_node: RealNode, short_tmp: Path
) -> None:
    """The driver taints the device in its ResourceSlice (NoExecute) and reports it Unhealthy: one
    critical device.unhealthy, one page; both sources hold it; untainted and Healthy: one heal."""
    node = scheduled_node
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"taint-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "tainted")
    pod = await job_pod(node, namespace, "tainted")
    name = pod["metadata"]["name"]
    device = allocated_device(await claim_of(node, pod))
    async with (
        PagerDutyReceiver() as pager,
        _agent(short_tmp, node, pager, kubernetes=True, slices_interval=1.0) as run,
    ):
        mark = len(run.recorder.events)

        def health() -> list[Any]:
            return [e for e in run.recorder.events[mark:] if e.kind.startswith("device.")]

        await dra.driver.taint(device, "gpu.test.example.com/xid", "79", "NoExecute")
        await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
        await until_status_health(node, namespace, name, "Unhealthy")
        await pager.wait_for(1, timeout=20)

        def sources() -> list[str]:
            devices = run.agent.committer.state.device_health.to_json()["devices"]
            return sorted({s for d in devices for s in d["sources"]})

        await run.recorder.until(lambda: sources() == ["pod-status", "resource-slice"], 20)
        await run.quiet_cycle()
        assert [e.kind for e in health()] == ["device.unhealthy"]
        assert health()[0].severity.value == "critical"
        await dra.driver.untaint(device, "gpu.test.example.com/xid")
        await dra.driver.set_health(dra.pool, device, "Healthy")
        await run.recorder.until(lambda: len(health()) >= 2, 30)
        await pager.wait_for(2, timeout=20)
        await run.quiet_cycle()
        assert [e.kind for e in health()] == ["device.unhealthy", "device.healthy"]
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]
