"""Devices that vanish entirely, on a real node (upstream's kubelet, peers/cmd/kubelet): a device
plugin drops a GPU from its ListAndWatch list (as some plugins do with a GPU that fell off the bus),
and the expected count comes from a label on the real API server's Node, read by the agent as its own
service account (the shipped RBAC and admission policy in force). One device.missing, one page and
the Node condition True; the GPU back: one device.missing_resolved, the page resolved, the condition
False. A GPU that only turns unhealthy is still known (the Node's capacity counts it) and a kubelet
restart's warm-up holds: neither is a device.missing."""

from __future__ import annotations

import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from testkit.agent import AgentRun
from testkit.http_sinks import pd_table
from testkit.kube_testcluster import KubeTestCluster
from testkit.node_agent import agent_on_node, node_condition, until_node_condition
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
LABEL = "example.com/gpu.count"
CONDITION = "ExampleGpuDevicesMissing"


def _agent(
    short_tmp: Path, node: RealNode, pager: PagerDutyReceiver
) -> AbstractAsyncContextManager[AgentRun]:
    """The agent on the real kubelet, expecting the count `LABEL` says, reading its Node and writing
    its conditions as its own service account. The pager gets every page: one vanished GPU must be
    one page (its device.removed), never a second one for the same GPU's device.missing."""
    config = {"sinks": {"pager": pd_table(pager)}, "expected": {"labels": {GPU: LABEL}, "interval": 1.0}}
    return agent_on_node(short_tmp, node, config, kubernetes=True)


async def _capacity(node: RealNode) -> str | None:
    seen = await node.get("node", node.name)
    return seen["status"].get("capacity", {}).get(GPU)  # type: ignore[no-any-return]


async def _until_capacity(node: RealNode, count: int) -> None:
    async def says() -> bool:
        return await _capacity(node) == str(count)

    await wait_until(says, timeout=30, interval=0.2, what=f"the kubelet's capacity of {GPU} = {count}")


async def _node_event_reasons(node: RealNode) -> list[str]:
    """The agent's Node Events about missing devices (the Node's Events live in "default")."""
    events = await node.get("events", "-n", "default", "--field-selector", f"involvedObject.name={node.name}")
    return sorted(e["reason"] for e in events["items"] if e["reason"].startswith("DevicesMissing"))


def _expected_read(run: AgentRun, count: int) -> bool:
    said = run.agent.status.readiness().details.get("expected_devices") or {}
    return said.get("expected") == {GPU: count} and said.get("capacity") == {GPU: count}


async def test_a_gpu_dropped_from_its_plugins_list_is_one_missing_one_page_and_the_condition(
    reporting: KubeTestCluster, real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    await _until_capacity(real_node, 2)
    real_node.kubectl("label", "node", real_node.name, f"{LABEL}=2")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager) as run:
        await run.recorder.until(lambda: _expected_read(run, 2), timeout=30)
        await run.quiet_cycle()
        mark = len(run.recorder.events)

        # Unhealthy first: it leaves allocatable, the kubelet still counts it: not missing.
        await plugin.set_healthy("gpu0", False)
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark), timeout=15)
        await _until_capacity(real_node, 2)
        await run.quiet_cycle()
        await plugin.set_healthy("gpu0", True)
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark), timeout=15)
        await run.quiet_cycle()
        assert "device.missing" not in run.recorder.kinds(mark)
        await pager.wait_for(2, timeout=30)  # the unhealthy GPU's own page, and its resolve
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]
        paged = len(pager.events)

        # Dropped from the plugin's list: the kubelet no longer knows it.
        await plugin.remove_device("gpu1")
        await _until_capacity(real_node, 1)
        condition = await until_node_condition(real_node, CONDITION, "True")
        assert "1 of 2" in condition["message"] and condition["reason"] == "DevicesMissing"
        await run.quiet_cycle()
        (missing,) = [e for e in run.recorder.events[mark:] if e.kind == "device.missing"]
        assert missing.details["expected"] == 2 and missing.details["known"] == 1
        assert missing.details["devices"] == ["gpu1"] and missing.details["pages"] is False
        # One page for the vanished GPU: its device.removed's, none for the same GPU's shortfall.
        # (Delivered after the cycle that told it: awaited, then one more cycle for a second.)
        await pager.wait_for(paged + 1, timeout=30)
        await run.quiet_cycle()
        new = pager.events[paged:]
        assert [p["event_action"] for p in new] == ["trigger"], new
        assert "gpu1" in new[0]["dedup_key"]

        await plugin.add_device("gpu1", (1,))
        await pager.wait_for(paged + 2, timeout=30)
        await until_node_condition(real_node, CONDITION, "False")
        await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds.count("device.missing") == 1 and kinds.count("device.missing_resolved") == 1
        new = pager.events[paged:]
        assert [p["event_action"] for p in new] == ["trigger", "resolve"]
        assert len({p["dedup_key"] for p in new}) == 1
    assert await _node_event_reasons(real_node) == ["DevicesMissing", "DevicesMissingResolved"]


async def test_a_kubelet_restart_with_an_expectation_is_no_missing_device(
    reporting: KubeTestCluster, real_node: RealNode, short_tmp: Path
) -> None:
    """The kubelet's capacity of a plugin's resource is 0 from its restart until the plugin
    registers again; the agent's warm-up hold and the larger of the two counts keep that quiet."""
    await real_node.add_plugin(GPU, GPUS)
    await _until_capacity(real_node, 2)
    real_node.kubectl("label", "node", real_node.name, f"{LABEL}=2")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager) as run:
        await run.recorder.until(lambda: _expected_read(run, 2), timeout=30)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        for n, how in enumerate((signal.SIGTERM, signal.SIGKILL)):  # SIGKILL: no clean-up at all
            await real_node.restart(how)

            def restarted(count: int = n + 1) -> bool:
                return run.recorder.kinds(mark).count("kubelet.restarted") == count

            await run.recorder.until(restarted, timeout=60)
            await real_node.wait_allocatable(GPU, set(GPUS), timeout=30)
            await run.released()
            await _until_capacity(real_node, 2)
            await run.recorder.until(lambda: _expected_read(run, 2), timeout=30)
            await run.quiet_cycle()
        assert "device.missing" not in run.recorder.kinds(mark), run.recorder.kinds(mark)
        assert pager.events == []
        condition = await node_condition(real_node, CONDITION)
        assert condition is None or condition["status"] == "False"
