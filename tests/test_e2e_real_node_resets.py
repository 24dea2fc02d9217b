"""A reset is not a heal (issue 40, point 5), on a real node: upstream's kubelet (peers/cmd/kubelet)
with the device-plugin peer, whose new process lists every device Healthy (it keeps no health
across a restart, as NVIDIA's device plugin), and upstream's DRA test driver, whose restarted
process says Healthy again. A GPU failed at its plugin, then the plugin restarted: exactly one
`device.reset`, the page not resolved before the reset hold-down, resolved after it. The same
for a DRA device and a driver restart. Short hold-downs stand for the default 600 s."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun
from testkit.http_sinks import pd_table
from testkit.node_agent import agent_on_node
from testkit.real_dra import (
    add_dra_driver,
    allocated_device,
    claim_job,
    claim_of,
    job_pod,
    restart_driver_healthy,
    until_status_health,
)
from testkit.real_node import RealNode, held_devices
from testkit.receivers import PagerDutyReceiver

# A whole node starts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"
HOLD = 10.0  # the reset hold-down: stands for the default 600 s, long enough to see no resolve in it


def _agent(
    short_tmp: Path, node: RealNode, pager: PagerDutyReceiver
) -> AbstractAsyncContextManager[AgentRun]:
    """The agent on the real kubelet, paging `pager` (resolves at once: only the reset's own
    hold-down delays them)."""
    config = {"sinks": {"pager": pd_table(pager)}, "watch": {"reset_hold_down": HOLD}}
    return agent_on_node(short_tmp, node, config)


def _actions(pager: PagerDutyReceiver) -> list[str]:
    return [e["event_action"] for e in pager.events]


async def _reset_then_resolved(run: AgentRun, pager: PagerDutyReceiver, mark: int) -> list[Any]:
    """Once the reset is seen: no resolve within the hold-down, one after it; the device events."""
    loop = asyncio.get_running_loop()
    await run.recorder.until(lambda: "device.reset" in run.recorder.kinds(mark), timeout=60)
    reset_at = loop.time()
    assert _actions(pager) == ["trigger"]
    await pager.wait_for(2, timeout=HOLD + 30)
    waited = loop.time() - reset_at
    assert waited >= HOLD - 1.0, waited  # not before the hold-down (1 s for the wake-up's slack)
    await run.quiet_cycle()
    assert _actions(pager) == ["trigger", "resolve"] and pager.incidents_opened() == 1
    assert pager.violations == []
    return [e for e in run.recorder.events[mark:] if e.kind.startswith("device.")]


async def test_a_plugin_restart_healing_a_gpu_is_a_reset_resolved_only_after_the_hold_down(
    real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"reset-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 1}))
    pod = await real_node.wait_pod(namespace, "trainer")
    (held,) = held_devices(pod)
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager) as run:
        mark = len(run.recorder.events)
        await plugin.set_healthy(held, False)
        await pager.wait_for(1, timeout=15)
        # The plugin restarts: the new process knows nothing of the failure and lists it Healthy.
        await plugin.stop()
        await run.recorder.until(lambda: "plugin.unregistered" in run.recorder.kinds(mark), timeout=15)
        await plugin.start()
        await real_node.wait_allocatable(GPU, set(GPUS))
        told = await _reset_then_resolved(run, pager, mark)
        assert [e.kind for e in told] == ["device.removed", "device.reset", "device.added"]
        removed, reset, healed = told
        assert {e.details["device"] for e in told} == {held}
        assert removed.severity.value == "critical" and reset.severity.value == "warning"
        assert healed.details["after_reset"] is True
        kinds = [k for k in run.recorder.kinds(mark) if k != "capacity.changed"]
        assert kinds == [
            "device.removed",
            "plugin.unregistered",
            "plugin.registered",
            "device.reset",
            "device.added",
        ]


async def test_a_plugin_restart_healing_its_only_gpu_is_a_reset_too(
    real_node: RealNode, short_tmp: Path
) -> None:
    """The plugin's only GPU failed: its restart takes nothing out of allocatable (no
    `plugin.unregistered`), and its socket re-created is what tells the agent of the restart."""
    resource = "example.com/onegpu"
    plugin = await real_node.add_plugin(resource, {"solo": (0,)})
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager) as run:
        mark = len(run.recorder.events)
        await plugin.set_healthy("solo", False)
        await pager.wait_for(1, timeout=15)
        await plugin.restart()
        await real_node.wait_allocatable(resource, {"solo"})
        told = await _reset_then_resolved(run, pager, mark)
        assert [e.kind for e in told] == ["device.removed", "device.reset", "device.added"]
        assert "plugin.unregistered" not in run.recorder.kinds(mark)


async def test_a_dra_driver_restart_healing_a_device_is_a_reset_resolved_only_after_the_hold_down(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    dra = await add_dra_driver(node, f"t{uuid.uuid4().hex[:6]}")
    namespace = await node.namespace(f"dreset-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "held")
    pod = await job_pod(node, namespace, "held")
    name = pod["metadata"]["name"]
    device = allocated_device(await claim_of(node, pod))
    await dra.driver.set_health(dra.pool, device, "Healthy")
    await until_status_health(node, namespace, name, "Healthy")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        mark = len(run.recorder.events)
        await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
        await pager.wait_for(1, timeout=30)
        # The driver restarts (a new process, a new registration socket) and says Healthy again.
        await restart_driver_healthy(node, dra, namespace, name, device)
        told = await _reset_then_resolved(run, pager, mark)
        assert [e.kind for e in told] == ["device.unhealthy", "device.reset", "device.healthy"]
        assert told[2].details["after_reset"] is True
