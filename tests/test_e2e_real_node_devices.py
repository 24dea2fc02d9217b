"""A device plugin's GPU failing on a real node (upstream's kubelet, peers/cmd/kubelet): the agent's
critical event naming the pod, its page, the Pod Event and the Node condition written through the
kubernetes sink to the same API server the kubelet reports to (the shipped RBAC and admission
policy in force); the heal's recovery; a flapping GPU paging once; a plugin restart paging never."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.http_sinks import pd_table
from testkit.kube_testcluster import KubeTestCluster
from testkit.node_agent import agent_on_node, until_node_condition
from testkit.real_node import RealNode, held_devices
from testkit.receivers import PagerDutyReceiver

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
CONDITION = "ExampleGpuDevicesUnavailable"


def _paging(pager: PagerDutyReceiver) -> dict[str, Any]:
    """The agent's config: a PagerDuty sink paging `pager`, its resolves sent at once."""
    return {"sinks": {"pager": pd_table(pager)}}


async def _pod_event_reasons(node: RealNode, namespace: str, pod: str) -> list[str]:
    events = await node.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}")
    return sorted(
        e["reason"]
        for e in events["items"]
        if e["source"].get("component") != "kubelet" and e.get("reportingComponent") != "kubelet"
    )


async def test_a_gpu_failing_at_its_plugin_is_one_page_a_pod_event_and_the_node_condition(
    reporting: KubeTestCluster, real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"fail-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 1}))
    pod = await real_node.wait_pod(namespace, "trainer")
    (held,) = held_devices(pod)
    async with (
        PagerDutyReceiver() as pager,
        agent_on_node(short_tmp, real_node, _paging(pager), kubernetes=True) as run,
    ):
        await until_node_condition(real_node, CONDITION, "False")
        mark = len(run.recorder.events)
        await plugin.set_healthy(held, False)
        await pager.wait_for(1, timeout=15)
        failed = await until_node_condition(real_node, CONDITION, "True")
        assert held in failed["message"] and f"{namespace}/trainer" in failed["message"]
        await run.quiet_cycle()
        critical = [e for e in run.recorder.events[mark:] if e.severity.value == "critical"]
        assert len(critical) == 1, run.recorder.kinds(mark)
        assert critical[0].kind == "device.removed"  # it left allocatable: the kubelet's only word
        assert critical[0].details["allocated_to"] == [f"{namespace}/trainer/main"]
        assert [p["event_action"] for p in pager.events] == ["trigger"]

        await plugin.set_healthy(held, True)
        await until_node_condition(real_node, CONDITION, "False")
        await pager.wait_for(2, timeout=15)
        await run.quiet_cycle()
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]
        kinds = run.recorder.kinds(mark)
    assert kinds == ["device.removed", "capacity.changed", "device.added", "capacity.changed"]
    reasons = await _pod_event_reasons(real_node, namespace, "trainer")
    assert reasons == ["DeviceFailed", "DeviceRecovered"], (reasons, kinds)


async def test_a_flapping_gpu_is_one_page(real_node: RealNode, short_tmp: Path) -> None:
    """Ten failures and heals of a held GPU at its plugin, each seen by the agent: one incident,
    resolved once the flapping ends."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"flap-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 2}))
    await real_node.wait_pod(namespace, "trainer")
    # Short settings standing for the defaults: a 2 s resolve hold-down for 60 s, quiet 1 s for 300 s.
    flaps = {"flap_limit": 4, "flap_window": 60.0, "flap_quiet": 1.0}
    async with PagerDutyReceiver() as pager:
        config = {"sinks": {"pager": pd_table(pager, resolve_hold_down=2.0)}, "watch": flaps}
        async with agent_on_node(short_tmp, real_node, config) as run:
            for n in range(1, 11):
                for healthy, kind in ((False, "device.removed"), (True, "device.added")):
                    await plugin.set_healthy("gpu0", healthy)
                    await run.recorder.until(lambda kind=kind, n=n: run.recorder.kinds().count(kind) >= n, 15)
            await run.recorder.until(lambda: "device.flap_ended" in run.recorder.kinds(), timeout=15)
            await pager.wait_for(
                lambda _: any(e["event_action"] == "resolve" for e in pager.events), timeout=15
            )
            await run.quiet_cycle()
            assert pager.incidents_opened() == 1, [e["event_action"] for e in pager.events]
            assert run.recorder.kinds().count("device.flapping") == 1


async def test_a_device_plugin_restart_pages_never(real_node: RealNode, short_tmp: Path) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"plug-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 1}))
    await real_node.wait_pod(namespace, "trainer")
    async with PagerDutyReceiver() as pager, agent_on_node(short_tmp, real_node, _paging(pager)) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        await plugin.stop()  # the process ends, its socket goes; the kubelet drops its devices
        await run.recorder.until(lambda: "plugin.unregistered" in run.recorder.kinds(mark), timeout=15)
        await plugin.start()
        await real_node.wait_allocatable(GPU, set(GPUS))
        await run.recorder.until(lambda: "plugin.registered" in run.recorder.kinds(mark), timeout=15)
        await run.released()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["plugin.unregistered", "plugin.registered"]
        assert run.agent.inventory == before
        assert pager.events == []
