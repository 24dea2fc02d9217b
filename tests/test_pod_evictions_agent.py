"""A pod evicted for a device taint, through the whole agent against the fake kubelet: the fake
evicts as upstream's device taint eviction controller and the kubelet do (the DisruptionTarget
condition in the Pods API's status, the containers killed, the pod deleted), a toy source gives the
device's NoExecute taint as the ResourceSlice source would. One `pod.evicted` naming the Job, the
device and the taint; no page beyond the device's own; never told again after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from testkit.agent import Running, make_settings, running_agent, with_config
from testkit.http_sinks import pd_table
from testkit.inventories import DRIVER, dra_job_pod
from testkit.receivers import PagerDutyReceiver
from watcher.model.devicehealth.affected import owner_text
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.inventory import Inventory
from watcher.sim.fake_evictions import evict_for_device_taint
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sources.base import Evidence

POOL, DEVICE = "node-a", "gpu-3"
POD = "llm-pretrain-0-abcde"
XID = DeviceTaint(DRIVER, POOL, DEVICE, "gpu.example.com/xid", "79", "NoExecute")


class Taints:
    """The device taints as the ResourceSlice source would give them, set by the test."""

    name = "test-taints"
    status_key = "test_taints"

    def __init__(self, taints: tuple[DeviceTaint, ...]) -> None:
        self.taints = taints
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.stop.wait()

    async def first_look(self) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"taints": len(self.taints)}

    def evidence(self, after: Inventory) -> Evidence:
        return Evidence(taints=self.taints)


@asynccontextmanager
async def _agent(root: Path, fake: FakeKubelet, pager: PagerDutyReceiver) -> AsyncIterator[Running]:
    settings = with_config(make_settings(root), {"sinks": {"pager": pd_table(pager)}})
    source = Taints((XID,))
    try:
        async with running_agent(settings, fake, sources=[source]) as run:
            await run.pods_watching()
            yield run
    finally:
        source.stop.set()


async def test_a_pod_evicted_for_its_devices_taint_is_one_warning_naming_job_device_and_taint(
    short_tmp: Path,
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=40)
    pod = dra_job_pod(POOL, DEVICE, labels={"team": "research"})
    fake.node.add_pod(pod)
    async with fake, PagerDutyReceiver() as pager, _agent(short_tmp, fake, pager) as run:
        # The taint is the device's own story first: one page.
        await run.recorder.until(lambda: "device.unhealthy" in run.recorder.kinds(), 10)
        await pager.wait_for(1, timeout=10)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        await evict_for_device_taint(fake, "ml", POD)
        await run.recorder.until(lambda: "pod.evicted" in run.recorder.kinds(mark), 10)
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), 10)
        await run.quiet_cycle()
        assert sorted(run.recorder.kinds(mark)) == ["allocation.removed", "pod.evicted"]
        (event,) = [e for e in run.recorder.events[mark:] if e.kind == "pod.evicted"]
        assert event.severity.value == "warning"
        assert event.summary.startswith(f"pod ml/{POD} evicted: its device")
        assert owner_text(event.details) == "Job ml/llm-pretrain (team research)"  # what Slack puts first
        assert "gpu.example.com/xid=79 (NoExecute)" in event.summary
        d = event.details
        assert (d["pod"], d["owner"]["kind"], d["owner"]["name"]) == (POD, "Job", "llm-pretrain")
        assert (d["driver"], d["pool"], d["device_name"]) == (DRIVER, POOL, DEVICE)
        taints = [(t["key"], t["value"], t["effect"]) for t in d["taints"]]
        assert taints == [("gpu.example.com/xid", "79", "NoExecute")]
        assert d["pod_uid"] == pod.uid
        assert [p["event_action"] for p in pager.events] == ["trigger"]  # the device's, no other


async def test_an_eviction_is_told_once_across_an_agent_restart(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=41)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE))
    async with fake, PagerDutyReceiver() as pager:
        async with _agent(short_tmp, fake, pager) as run:
            await run.recorder.until(lambda: "device.unhealthy" in run.recorder.kinds(), 10)
            # Marked, killed, not deleted yet: the Pods API still shows it, condition and all.
            await evict_for_device_taint(fake, "ml", POD, delete=False)
            await run.recorder.until(lambda: "pod.evicted" in run.recorder.kinds(), 10)
            await run.quiet_cycle()
            assert run.recorder.kinds().count("pod.evicted") == 1
        async with _agent(short_tmp, fake, pager) as again:
            watch = again.agent.pods_watch
            assert watch is not None
            held = watch.index.get("ml", POD)
            assert held is not None and held.disruption == "DeletionByDeviceTaintManager"  # seen again
            await again.quiet_cycle()
            await again.quiet_cycle()
            assert "pod.evicted" not in again.recorder.kinds()
        assert [p["event_action"] for p in pager.events] == ["trigger"]


async def test_an_eviction_is_told_once_across_a_fresh_pods_api_stream(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=42)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE))
    async with fake, PagerDutyReceiver() as pager, _agent(short_tmp, fake, pager) as run:
        await run.recorder.until(lambda: "device.unhealthy" in run.recorder.kinds(), 10)
        await evict_for_device_taint(fake, "ml", POD, delete=False)
        await run.recorder.until(lambda: "pod.evicted" in run.recorder.kinds(), 10)
        watch, api = run.agent.pods_watch, fake.pods_api
        assert watch is not None and api is not None
        # The Pods API goes away and comes back: a new stream, its snapshot diffed against the index.
        await api.stop()
        await api.start()
        await run.recorder.until(lambda: watch.connects >= 2 and watch.state == "watching", 15)
        await run.quiet_cycle()
        await run.quiet_cycle()
        assert run.recorder.kinds().count("pod.evicted") == 1
