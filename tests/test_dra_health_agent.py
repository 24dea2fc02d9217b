"""A DRA GPU's health, from its holder's Pod status, through the whole agent to the receivers that
enforce Slack's, PagerDuty's and a webhook's rules: one page naming the Job, the claim and the
driver's words within a second, its resolve on heal, one warning and no page for Unknown, and a
DRA-backed nvidia.com/gpu that is never called missing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.inventories import dra_job_pod
from testkit.receivers import PagerDutyReceiver, SlackReceiver, WebhookReceiver
from watcher.settings_file import parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import (
    FakeClaimDevice,
    FakeOwner,
    FakePod,
    dra_backed_gpu_pod,
)

DRIVER, POOL, DEVICE = "gpu.nvidia.com", "node-a", "gpu-3"
XID = "critical XID 79 reported by NVML"
PD_KEY = "R0UT1NGKEY0123456789ABCDEFGHIJKL"


@dataclasses.dataclass
class Receivers:
    slack: SlackReceiver
    pager: PagerDutyReceiver
    hook: WebhookReceiver

    def hook_events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for r in self.hook.accepted:
            body = json.loads(r.body)
            out.extend(body if isinstance(body, list) else [body])
        return out

    def hook_kinds(self) -> list[str]:
        return [e["kind"] for e in self.hook_events() if e["kind"].startswith("device.")]


@asynccontextmanager
async def _agent(
    root: Path, fake: FakeKubelet, grace: float = 120.0, unheld: float = 900.0
) -> AsyncIterator[tuple[Running, Receivers]]:
    async with SlackReceiver(rate=1000.0) as slack, PagerDutyReceiver() as pager, WebhookReceiver() as hook:
        sinks = parse_settings(
            {
                "sinks": {
                    # Ends at once: the hold-down before them is tests/test_flap_pages.py's.
                    "slack": {
                        "type": "slack",
                        "url": slack.url("/services/T0/B0/X"),
                        "rate": 100.0,
                        "resolve_hold_down": 0,
                    },
                    "pager": {
                        "type": "pagerduty",
                        "routing_key": PD_KEY,
                        "endpoint": pager.url("/v2/enqueue"),
                        "resolve_hold_down": 0,
                    },
                    "hook": {"type": "webhook", "url": hook.url("/hook")},
                },
                "pods": {"health_unknown_grace": grace, "unheld_grace": unheld},
            }
        )
        settings = dataclasses.replace(make_settings(root), sinks=sinks.sinks, pods=sinks.pods)
        async with running_agent(settings, fake) as run:
            yield run, Receivers(slack, pager, hook)


async def test_a_dra_gpu_failing_pages_once_naming_the_job_claim_and_message_and_heal_resolves(
    short_tmp: Path,
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=11)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE, labels={"team": "research"}))
    async with fake, _agent(short_tmp, fake) as (run, rx):
        await run.pods_watching()
        changed_at = time.monotonic()
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", XID)
        await rx.pager.wait_for(1, timeout=5)
        await rx.slack.wait_for(lambda rs: len(rs) >= 2, timeout=5)  # started, then the failure
        await rx.hook.wait_for(lambda _: "device.unhealthy" in rx.hook_kinds(), timeout=5)
        # Within a second of the status change, at each of the three.
        (page,) = rx.pager.events
        slack_msg = rx.slack.accepted[-1]
        hook_req = next(r for r in rx.hook.accepted if b"device.unhealthy" in r.body)
        for arrived in (rx.pager.accepted[0].at, slack_msg.at, hook_req.at):
            assert arrived - changed_at < 1.0
        assert page["event_action"] == "trigger"
        summary = page["payload"]["summary"]
        assert summary.startswith("Job ml/llm-pretrain (team research)")
        assert XID in summary and "llm-pretrain-0-gpu" in summary
        text = json.dumps(slack_msg.parsed)
        assert "Job ml/llm-pretrain" in text and XID in text
        (event,) = [e for e in rx.hook_events() if e["kind"] == "device.unhealthy"]
        assert event["severity"] == "critical"
        d = event["details"]
        assert (d["driver"], d["pool"], d["device_name"], d["claim"], d["message"]) == (
            DRIVER,
            POOL,
            DEVICE,
            "llm-pretrain-0-gpu",
            XID,
        )
        assert d["pods"][0]["owner"]["kind"] == "Job" and d["pods"][0]["name"] == "llm-pretrain-0-abcde"

        fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy")
        await rx.pager.wait_for(2, timeout=5)
        trigger, resolve = rx.pager.events
        assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == trigger["dedup_key"]
        await run.quiet_cycle()
        assert rx.hook_kinds() == ["device.unhealthy", "device.healthy"]
        assert rx.pager.violations == [] and rx.slack.violations == []


async def test_unknown_is_one_warning_after_the_grace_and_never_a_page(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=12)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE, labels={"team": "research"}))
    async with fake, _agent(short_tmp, fake, grace=0.5) as (run, rx):
        await run.pods_watching()
        mark = len(run.recorder.events)
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unknown", "no health report within 30s")
        await run.recorder.until(lambda: "device.health_unknown" in run.recorder.kinds(mark), 5)
        for _ in range(3):  # later looks add nothing
            await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.health_unknown"]
        (warning,) = run.recorder.events[mark:]
        assert warning.severity == "warning"
        await rx.slack.wait_for(
            lambda rs: any(b"health_unknown" in r.body or b"Unknown" in r.body for r in rs)
        )
        assert rx.pager.events == []  # never a page
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy")
        await run.recorder.until(lambda: "device.healthy" in run.recorder.kinds(mark), 5)
        assert rx.pager.events == []


@pytest.mark.parametrize("pods_api", [True, False], ids=["pods-api", "pod-resources-only"])
async def test_a_dra_backed_gpu_is_never_called_missing(
    short_tmp: Path, pods_api: bool, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=13, pods_api=pods_api)
    gpu = FakeClaimDevice(DRIVER, POOL, "gpu-5", ["nvidia.com/gpu=gpu-5"])
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        fake.add_pod(dra_backed_gpu_pod("ml", "plain-gpu-request", [gpu], owners=[FakeOwner("Job", "plain")]))
        await run.quiet_cycle()  # the fake writes no DRA state file: a look of our own
        assert "allocation.added" in run.recorder.kinds(mark)
        fake.dra.set_health(DRIVER, POOL, "gpu-5", "Unhealthy", XID)  # no verdict reaches its status
        await fake.restart(downtime=0.1)  # and through a restart's warm-up
        await run.recorder.until(lambda: "kubelet.restarted" in run.recorder.kinds(mark), 10)
        await run.settled()
        inv = run.agent.inventory
        assert inv is not None and inv.missing_devices == ()
        assert not [e for e in run.recorder.events[mark:] if e.kind in ("device.removed", "device.unhealthy")]
        assert all(c.unavailable == 0 for c in inv.capacity)


def _next_holder(name: str, device: str = DEVICE) -> FakePod:
    """Another pod of the Job holding `device` (its own uid, its own claim), its status Healthy."""
    return dra_job_pod(POOL, device, name=name, claim=f"{name}-gpu")


async def test_a_failed_gpus_page_is_resolved_by_its_next_holder_and_a_later_failure_pages_again(
    short_tmp: Path,
) -> None:
    """Issue 36 item 1: the holder of a failed DRA GPU is deleted, the repaired GPU goes to a new
    pod that says Healthy (the resolve), and a later failure is a new page, not an update."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=14)
    first = dra_job_pod(POOL, DEVICE)
    fake.node.add_pod(first)
    async with fake, _agent(short_tmp, fake) as (run, rx):
        await run.pods_watching()
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", XID)
        await rx.pager.wait_for(1, timeout=5)
        mark = len(run.recorder.events)
        fake.free(first.namespace, first.name)
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), 5)
        await run.quiet_cycle()
        assert [e["event_action"] for e in rx.pager.events] == ["trigger"]  # a pod going is no heal
        fake.add_pod(_next_holder("llm-pretrain-0-fghij"))
        await rx.pager.wait_for(2, timeout=5)
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", "XID 48")
        await rx.pager.wait_for(3, timeout=5)
        actions = [(e["event_action"], e["dedup_key"]) for e in rx.pager.events]
        key = actions[0][1]
        assert actions == [("trigger", key), ("resolve", key), ("trigger", key)]
        assert "XID 48" in rx.pager.events[2]["payload"]["summary"]
        kinds = [k for k in rx.hook_kinds() if k.startswith("device.")]
        assert kinds == ["device.unhealthy", "device.healthy", "device.unhealthy"]
        assert rx.pager.violations == []


async def test_a_gpu_nobody_takes_closes_its_page_unconfirmed_after_the_unheld_grace(
    short_tmp: Path,
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=15)
    first = dra_job_pod(POOL, DEVICE)
    fake.node.add_pod(first)
    async with fake, _agent(short_tmp, fake, unheld=0.5) as (run, rx):
        await run.pods_watching()
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", XID)
        await rx.pager.wait_for(1, timeout=5)
        fake.free(first.namespace, first.name)
        await rx.pager.wait_for(2, timeout=5)
        trigger, resolve = rx.pager.events
        assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == trigger["dedup_key"]
        ended = [e for e in run.recorder.events if e.kind == "device.health_unobserved"]
        assert len(ended) == 1 and ended[0].details["last_reported"] == "Unhealthy"


async def test_a_driver_that_reports_no_health_says_nothing(short_tmp: Path) -> None:
    """Issue 36 item 18: Unknown is what the kubelet writes for every device of a driver without
    a health service; a device never seen Healthy is silent however long it stays Unknown."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=16)
    pod = dra_job_pod(POOL, DEVICE)
    pod.containers[0].claims[0].devices[0].health = "Unknown"
    fake.node.add_pod(pod)
    async with fake, _agent(short_tmp, fake, grace=0.2) as (run, rx):
        await run.pods_watching()
        mark = len(run.recorder.events)
        deadline = time.monotonic() + 1.0  # five graces
        while time.monotonic() < deadline:
            await run.quiet_cycle()
        assert run.recorder.kinds(mark) == []
        assert not [e for e in run.recorder.events if e.kind.startswith("device.")]
        assert rx.pager.events == []


def _job_pods(count: int) -> list[FakePod]:
    """`count` pods of one Job, each holding one GPU of the driver (gpu-0, gpu-1, ...)."""
    return [_next_holder(f"llm-pretrain-{i}-abcde", f"gpu-{i}") for i in range(count)]


@pytest.mark.parametrize("spread", [0.0, 0.015], ids=["at-once", "one-pod-sync-after-another"])
async def test_a_driver_crash_reaching_eight_pods_statuses_is_one_incident(
    short_tmp: Path, spread: float
) -> None:
    """Issue 36 item 8: 8 devices of one driver turn Unhealthy in one broadcast, which reaches the
    pods' statuses one after another: one device.incident, one page, not a page per device."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=19)
    for pod in _job_pods(8):
        fake.node.add_pod(pod)
    async with fake, _agent(short_tmp, fake) as (run, rx):
        await run.pods_watching()
        mark = len(run.recorder.events)
        for i in range(8):
            fake.dra.set_health(DRIVER, POOL, f"gpu-{i}", "Unhealthy", "driver crashed")
            if spread:
                await asyncio.sleep(spread)  # the kubelet's pod workers: one status after another
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("device.unhealthy") == 8, 5)
        await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds.count("device.incident") == 1, kinds
        await rx.pager.wait_for(1, timeout=5)
        await run.quiet_cycle()
        assert [(e["event_action"], e["payload"]["class"]) for e in rx.pager.events] == [
            ("trigger", "device.incident")
        ]
