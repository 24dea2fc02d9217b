"""Mass failures: many devices of one resource failing at once are one page."""

from __future__ import annotations

import json
from pathlib import Path

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, PodMeta
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.events import envelope
from watcher.model.incidents import Incidents
from watcher.model.inventory import Inventory
from watcher.model.routing import Route

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


async def test_a_whole_node_of_gpus_failing_is_one_page_and_one_resolve(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=11)
    async with running_agent(make_settings(short_tmp), fake) as run:
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


def _dra_node(holders: dict[str, int]) -> tuple[Inventory, list[str]]:
    """Pods each holding one DRA GPU (gpu-i), and their keys."""
    node = claim_inventory(
        {
            f"ml/{name}-{i}": ("trainer", f"{name}-{i}-gpu", [("node-1", f"gpu-{i}", None)])
            for name, n in holders.items()
            for i in range(n)
        }
    )
    return node, [f"ml/{name}-{i}" for name, n in holders.items() for i in range(n)]


def _verdicts(keys: list[str], health: dict[int, str]) -> list[PodMeta]:
    return [
        verdict_pod(
            key,
            "trainer",
            [(f"{DRIVER}/node-1/gpu-{i}", health[i], "")],
            claims=(("gpu", f"{key.split('/')[1]}-gpu"),),
        )
        for i, key in enumerate(keys)
        if i in health
    ]


def test_a_stale_incident_never_swallows_a_later_single_failure() -> None:
    """Issue 36 item 2: 8 pods' DRA GPUs fail at once (one incident), the pods go, new pods report
    the GPUs Healthy, then one fails alone: that failure is its own page, not the old incident's."""
    first, first_keys = _dra_node({"llm": 8})
    health, incidents = DeviceHealth(), Incidents()
    health, changes = health.observe(
        0.0, first, _verdicts(first_keys, dict.fromkeys(range(8), UNHEALTHY)), unknown_grace=300
    )
    incidents, out = incidents.group("c1", changes, 8)
    assert [c.kind for c in out].count(Kind.DEVICE_INCIDENT) == 1
    # The pods are deleted; new ones get the repaired GPUs and say Healthy: the incident is over.
    empty = claim_inventory({})
    health, changes = health.observe(1.0, empty, [], unknown_grace=300)
    incidents, out = incidents.group("c2", changes, 8)
    assert out == [] and len(incidents.open) == 1
    second, second_keys = _dra_node({"next": 8})
    health, changes = health.observe(
        2.0, second, _verdicts(second_keys, dict.fromkeys(range(8), HEALTHY)), unknown_grace=300
    )
    incidents, out = incidents.group("c3", changes, 8)
    assert [c.kind for c in out] == [Kind.DEVICE_HEALTHY] * 8 + [Kind.DEVICE_INCIDENT_RESOLVED]
    assert incidents.open == ()
    # One fails alone later: paged on its own.
    failing = dict.fromkeys(range(8), HEALTHY) | {3: UNHEALTHY}
    health, changes = health.observe(3.0, second, _verdicts(second_keys, failing), unknown_grace=300)
    incidents, out = incidents.group("c4", changes, 8)
    (alone,) = out
    assert alone.kind is Kind.DEVICE_UNHEALTHY and "incident" not in alone.details
    assert PAGING.matches(envelope(alone, seq=1, node="n", cycle="c4", before=None, after=None))


def test_an_incident_whose_devices_nobody_takes_ends_saying_so() -> None:
    node, keys = _dra_node({"llm": 8})
    health, changes = DeviceHealth().observe(
        0.0, node, _verdicts(keys, dict.fromkeys(range(8), UNHEALTHY)), unknown_grace=300
    )
    incidents, _ = Incidents().group("c1", changes, 8)
    empty = claim_inventory({})
    health, changes = health.observe(1.0, empty, [], unknown_grace=300, unheld_grace=60)
    incidents, _ = incidents.group("c2", changes, 8)
    health, changes = health.observe(61.0, empty, [], unknown_grace=300, unheld_grace=60)
    incidents, out = incidents.group("c3", changes, 8)
    assert [c.kind for c in out] == [Kind.DEVICE_HEALTH_UNOBSERVED] * 8 + [Kind.DEVICE_INCIDENT_RESOLVED]
    resolved = out[-1]
    assert resolved.details["unobserved"] == [f"node-1/gpu-{i}" for i in range(8)]
    assert "no longer held by any pod" in resolved.summary and "healthy again" in resolved.summary
    # Paging sinks get the incident's end, not eight device ends.
    events = [envelope(c, seq=i, node="n", cycle="c3", before=None, after=None) for i, c in enumerate(out, 1)]
    assert [str(e.kind) for e in events if PAGING.matches(e)] == ["device.incident_resolved"]
    assert incidents.open == ()


def test_open_incidents_round_trip_through_the_saved_state_and_garbage_reads_empty() -> None:
    gone = [_device(Kind.DEVICE_REMOVED, f"GPU-{i}") for i in range(8)]
    incidents, _ = Incidents().group("c1", gone, threshold=8)
    restored = Incidents.from_json(json.loads(json.dumps(incidents.to_json())))
    assert restored == incidents
    _, out = restored.group("c2", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(8)], 8)
    assert (
        out[-1].kind is Kind.DEVICE_INCIDENT_RESOLVED and out[-1].details["incident"] == "nvidia.com/gpu/c1"
    )
    for junk in (None, {}, [1, "x", {"key": 1}], [{"key": "k", "resource": "r", "missing": [], "total": 1}]):
        assert Incidents.from_json(junk) == Incidents()


async def test_an_incident_open_across_an_agent_restart_is_still_resolved(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Issue 36 item 3: 8 GPUs fail (one incident), the agent restarts, the GPUs return: the
    incident's resolve is sent, once."""
    settings = make_settings(short_tmp)
    fake = await start_kubelet(seed=17)
    gpus = [d for (r, _), d in fake.node.devices.items() if r == GPU]
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        for d in gpus:
            d.healthy = False
        fake.write_state_files()
        await run.recorder.until(lambda: "device.incident" in run.recorder.kinds())
    for d in gpus:
        d.healthy = True
    fake.write_state_files()
    async with running_agent(settings, fake) as run:
        await run.recorder.until(lambda: "device.incident_resolved" in run.recorder.kinds())
        await run.quiet_cycle()
        kinds = run.recorder.kinds()
        assert kinds.count("device.added") == len(gpus) and kinds.count("device.incident_resolved") == 1
        paged = [str(e.kind) for e in run.recorder.events if PAGING.matches(e)]
        assert "device.incident_resolved" in paged and "device.added" not in paged


def test_an_incident_saved_before_grouping_was_turned_off_still_resolves_and_none_opens() -> None:
    incidents, _ = Incidents().group("c1", [_device(Kind.DEVICE_REMOVED, f"GPU-{i}") for i in range(8)], 8)
    incidents, out = incidents.group(
        "c2", [_device(Kind.DEVICE_REMOVED, f"GPU-{i}") for i in range(8, 16)], 0
    )
    assert all(c.kind is Kind.DEVICE_REMOVED and "incident" not in c.details for c in out)
    incidents, out = incidents.group("c3", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(8)], 0)
    assert out[-1].kind is Kind.DEVICE_INCIDENT_RESOLVED and incidents.open == ()


def test_an_incidents_resolve_goes_to_the_namespaces_its_page_went_to() -> None:
    ml_only = Route(min_severity=Severity.WARNING, namespaces=("ml",), resolutions=True)
    gone = [_device(Kind.DEVICE_REMOVED, f"GPU-{i}", ["ml/job/c"]) for i in range(8)]
    gone = [Change(c.kind, c.severity, c.summary, {**c.details, "namespaces": ["ml"]}) for c in gone]
    incidents, out = Incidents().group("c1", gone, 8)
    opened = next(c for c in out if c.kind is Kind.DEVICE_INCIDENT)
    incidents, out = incidents.group("c2", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(8)], 8)
    resolved = out[-1]
    assert resolved.kind is Kind.DEVICE_INCIDENT_RESOLVED and resolved.details["namespaces"] == ["ml"]
    for i, c in enumerate((opened, resolved), 1):
        assert ml_only.matches(envelope(c, seq=i, node="n", cycle="c", before=None, after=None))
    # Restored from the saved state, the same.
    again, _ = Incidents().group("c1", gone, 8)
    restored = Incidents.from_json(json.loads(json.dumps(again.to_json())))
    _, out = restored.group("c2", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(8)], 8)
    assert out[-1].details["namespaces"] == ["ml"]


def test_a_stale_incident_that_ends_by_a_device_failing_again_says_so() -> None:
    incidents, _ = Incidents().group("c1", [_device(Kind.DEVICE_REMOVED, f"GPU-{i}") for i in range(8)], 8)
    incidents, _ = incidents.group("c2", [_device(Kind.DEVICE_ADDED, f"GPU-{i}") for i in range(7)], 8)
    incidents, out = incidents.group("c3", [_device(Kind.DEVICE_REMOVED, "GPU-7")], 8)
    assert [c.kind for c in out] == [Kind.DEVICE_REMOVED, Kind.DEVICE_INCIDENT_RESOLVED]
    assert "incident" not in out[0].details
    assert "1 failing again" in out[1].summary and "all 8" not in out[1].summary
