"""Mass failures: many devices of one resource failing at once are one page."""

from __future__ import annotations

from pathlib import Path

from testkit.agent import make_settings, running_agent
from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Change, Kind, Severity
from watcher.model.device_health import DeviceHealth
from watcher.model.events import envelope
from watcher.model.incidents import Incidents
from watcher.model.pod_meta import HEALTHY, UNHEALTHY, PodMeta
from watcher.model.routing import Route
from watcher.sim.fake_kubelet import FakeKubelet

GPU = "nvidia.com/gpu"
PAGING = Route(min_severity=Severity.WARNING, resolutions=True, skip_incident_devices=True)


def _device(kind: Kind, device: str, pods: list[str] | None = None) -> Change:
    details = {"resource": GPU, "device": device, "allocated_to": pods or []}
    return Change(kind, Severity.CRITICAL if pods else Severity.WARNING, f"{device}", details)


def test_a_mass_failure_is_one_incident_resolved_when_all_are_back() -> None:
    gone = [_device(Kind.DEVICE_REMOVED, f"GPU-{i}", ["ml/job/c"] if i < 3 else None) for i in range(64)]
    incidents, out = Incidents().group("c1", gone, threshold=8)
    (opened,) = [c for c in out if c.kind is Kind.DEVICE_INCIDENT]
    assert opened.details["count"] == 64 and opened.details["allocated_to"] == ["ml/job/c"]
    assert opened.severity is Severity.CRITICAL
    assert all(c.details.get("incident") == "nvidia.com/gpu/c1" for c in out if c.kind is Kind.DEVICE_REMOVED)
    incidents, out = incidents.group("c2", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(63)], 8)
    assert not any(c.kind is Kind.DEVICE_INCIDENT_RESOLVED for c in out)
    incidents, out = incidents.group("c3", [_device(Kind.DEVICE_ADDED, "GPU-63")], 8)
    assert [c.kind for c in out] == [Kind.DEVICE_ADDED, Kind.DEVICE_INCIDENT_RESOLVED]
    assert incidents.open == ()


def test_fewer_than_the_threshold_are_paged_one_by_one() -> None:
    gone = [_device(Kind.DEVICE_REMOVED, f"GPU-{i}") for i in range(7)]
    incidents, out = Incidents().group("c1", gone, threshold=8)
    assert out == gone and incidents.open == ()


async def test_a_whole_node_of_gpus_failing_is_one_page_and_one_resolve(short_tmp: Path) -> None:
    async with (
        FakeKubelet(short_tmp / "kubelet", seed=11) as fake,
        running_agent(make_settings(short_tmp), fake) as run,
    ):
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        gpus = [d for (r, _), d in fake.node.devices.items() if r == GPU]
        assert len(gpus) >= 8
        for d in gpus:  # the driver died: every GPU at once, one checkpoint rewrite
            d.healthy = False
        fake.write_state_files()
        await run.recorder.until(lambda: "device.incident" in run.recorder.kinds(mark))
        for d in gpus:
            d.healthy = True
        fake.write_state_files()
        await run.recorder.until(lambda: "device.incident_resolved" in run.recorder.kinds(mark))
        events = run.recorder.events[mark:]
        assert sum(e.kind == "device.removed" for e in events) == len(gpus)  # the audit log: each one
        paged = [str(e.kind) for e in events if PAGING.matches(e)]
        assert paged.count("device.incident") == 1 and paged.count("device.incident_resolved") == 1
        assert not any(k in ("device.removed", "device.added") for k in paged)


def test_many_dra_devices_of_one_driver_unhealthy_at_once_are_one_incident() -> None:
    gpus = [("node-1", f"gpu-{i}", None) for i in range(8)]
    node = claim_inventory({"ml/llm-0": ("trainer", "gpu-claim", gpus)})

    def pods(health: str, last: str | None = None) -> list[PodMeta]:
        verdicts = [(f"{DRIVER}/node-1/gpu-{i}", last if last and i == 7 else health, "") for i in range(8)]
        return [verdict_pod("ml/llm-0", "trainer", verdicts)]

    health, changes = DeviceHealth().observe(0.0, node, pods(UNHEALTHY), unknown_grace=300)
    incidents, out = Incidents().group("c1", changes, threshold=8)
    (opened,) = [c for c in out if c.kind is Kind.DEVICE_INCIDENT]
    assert opened.severity is Severity.CRITICAL and opened.details["count"] == 8
    assert opened.details["resource"] == DRIVER and opened.details["source"] == "pod-status"
    assert opened.details["allocated_to"] == ["ml/llm-0/trainer"] and "turned unhealthy" in opened.summary
    events = [envelope(c, seq=i, node="n", cycle="c1", before=None, after=None) for i, c in enumerate(out, 1)]
    assert [str(e.kind) for e in events if PAGING.matches(e)] == ["device.incident"]  # one page
    assert sum(e.kind == "device.unhealthy" for e in events) == 8  # the audit log: each one
    health, changes = health.observe(1.0, node, pods(HEALTHY, last=UNHEALTHY), unknown_grace=300)
    incidents, out = incidents.group("c2", changes, 8)
    assert [c.kind for c in out] == [Kind.DEVICE_HEALTHY] * 7
    health, changes = health.observe(2.0, node, pods(HEALTHY), unknown_grace=300)
    incidents, out = incidents.group("c3", changes, 8)
    assert [c.kind for c in out] == [Kind.DEVICE_HEALTHY, Kind.DEVICE_INCIDENT_RESOLVED]
    assert "healthy again" in out[1].summary and incidents.open == ()
