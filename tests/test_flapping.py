"""Flap damping: a device changing health over and over is one story for a person."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Change, Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.events import envelope
from watcher.model.flapping import FlapRule, Flaps
from watcher.model.routing import Route

GPU = "nvidia.com/gpu"
RULE = FlapRule(limit=4, window=60, quiet=30)


def _health(kind: Kind, device: str = "GPU-1") -> Change:
    pods = ["ml/trainer-0/trainer"]
    severity = Severity.CRITICAL if kind is Kind.DEVICE_REMOVED else Severity.INFO
    return Change(
        kind, severity, f"{GPU} {device} changed", {"resource": GPU, "device": device, "allocated_to": pods}
    )


def test_more_changes_than_the_limit_in_the_window_is_one_flapping_report_then_one_end() -> None:
    flaps, out_all = Flaps(), []
    for i in range(10):
        kind = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
        flaps, out = flaps.damp(float(i), [_health(kind)], RULE)
        out_all += out
    kinds = [c.kind for c in out_all]
    assert kinds.count(Kind.DEVICE_FLAPPING) == 1 and kinds.index(Kind.DEVICE_FLAPPING) == 5
    assert [
        c.details.get("flapping", False)
        for c in out_all
        if c.kind in (Kind.DEVICE_ADDED, Kind.DEVICE_REMOVED)
    ] == [False, False, False, False, True, True, True, True, True, True]
    assert flaps.next_look(RULE) == 9 + 30
    flaps, out = flaps.damp(38.0, [], RULE)
    assert out == []
    flaps, out = flaps.damp(39.0, [], RULE)
    (ended,) = out
    assert ended.kind is Kind.DEVICE_FLAP_ENDED and ended.details["present"] is True
    assert ended.severity is Severity.INFO and flaps.next_look(RULE) is None


def test_changes_spread_wider_than_the_window_never_flap() -> None:
    flaps, out_all = Flaps(), []
    for i in range(10):
        kind = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
        flaps, out = flaps.damp(i * 20.0, [_health(kind)], RULE)
        out_all += out
    assert all(
        c.kind in (Kind.DEVICE_ADDED, Kind.DEVICE_REMOVED) and "flapping" not in c.details for c in out_all
    )


def test_notification_routes_skip_the_marked_changes_only() -> None:
    from watcher.model.events import envelope

    flaps, changes = Flaps(), []
    for i in range(8):
        kind = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
        flaps, out = flaps.damp(float(i), [_health(kind)], RULE)
        changes += out
    events = [
        envelope(c, seq=i, node="n", cycle="c", before=None, after=None) for i, c in enumerate(changes, 1)
    ]
    notify = Route(skip_flapping=True)
    assert len([e for e in events if notify.matches(e)]) == 4 + 1  # before it flapped, and the report
    assert all(Route().matches(e) for e in events)  # the audit log and webhooks: everything


async def test_a_flapping_device_reaches_notification_sinks_twice_and_the_audit_log_every_time(
    short_tmp: Path,
    start_kubelet: StartKubelet,
) -> None:
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(
        settings, watch=dataclasses.replace(settings.watch, flap_limit=4, flap_window=60, flap_quiet=1.0)
    )
    fake = await start_kubelet(seed=9)
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        gpu = sorted(i for r, i in fake.node.devices if r == GPU)[0]
        for i in range(10):
            fake.set_healthy(GPU, gpu, healthy=i % 2 == 1)
            await run.quiet_cycle()
        await run.recorder.until(lambda: "device.flap_ended" in run.recorder.kinds(mark), timeout=10)
        events = run.recorder.events[mark:]
        health = [e for e in events if e.kind in ("device.added", "device.removed")]
        assert len(health) == 10  # the audit log keeps every change
        notify = Route(skip_flapping=True, resolutions=True)
        seen = [str(e.kind) for e in events if notify.matches(e)]
        assert seen.count("device.flapping") == 1 and seen.count("device.flap_ended") == 1
        assert len([k for k in seen if k in ("device.added", "device.removed")]) == 4


def test_a_dra_device_flapping_in_its_pod_status_is_one_flapping_report_on_its_condition() -> None:
    node = claim_inventory({"ml/llm-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", None)])})
    rid = f"{DRIVER}/node-1/gpu-3"
    health, flaps, told = DeviceHealth(), Flaps(), []
    for i in range(10):
        verdict = UNHEALTHY if i % 2 == 0 else HEALTHY
        pods = [verdict_pod("ml/llm-0", "trainer", [(rid, verdict, "XID 79" if i % 2 == 0 else "")])]
        health, changes = health.observe(float(i), node, pods, unknown_grace=300)
        flaps, out = flaps.damp(float(i), changes, RULE)
        told += out
    kinds = [c.kind for c in told]
    assert kinds.count(Kind.DEVICE_UNHEALTHY) == 5 and kinds.count(Kind.DEVICE_HEALTHY) == 5
    (flapping,) = [c for c in told if c.kind is Kind.DEVICE_FLAPPING]
    assert flapping.details["resource"] == DRIVER and flapping.details["device"] == "node-1/gpu-3"
    assert flapping.details["source"] == "pod-status" and flapping.details["allocated_to"] == [
        "ml/llm-0/trainer"
    ]
    assert [c.details.get("flapping", False) for c in told if c.kind is not Kind.DEVICE_FLAPPING] == [
        False, False, False, False, True, True, True, True, True, True
    ]  # fmt: skip
    # Its page is the device's own condition: flapping opens it, a healthy end closes it.
    first = condition_of(envelope(told[0], seq=1, node="n", cycle="c", before=None, after=None))
    opened = condition_of(envelope(flapping, seq=2, node="n", cycle="c", before=None, after=None))
    assert first is not None and opened is not None and opened.active and opened.key == first.key
    flaps, (ended,) = flaps.damp(9.0 + RULE.quiet, [], RULE)
    assert ended.kind is Kind.DEVICE_FLAP_ENDED and ended.details["present"] is True
    assert "now healthy" in ended.summary and ended.details["source"] == "pod-status"
    closed = condition_of(envelope(ended, seq=3, node="n", cycle="c", before=None, after=None))
    assert closed is not None and not closed.active and closed.key == opened.key


def test_flapping_devices_round_trip_with_their_quiet_counted_from_the_restart() -> None:
    flaps = Flaps()
    for i in range(6):
        flaps, _ = flaps.damp(
            float(i), [_health(Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED)], RULE
        )
    saved = json.loads(json.dumps(flaps.to_json()))
    restored = Flaps.from_json(saved, now=1000.0)
    assert restored.flapping() == flaps.flapping() and restored.next_look(RULE) == 1000.0 + RULE.quiet
    _, (ended,) = restored.damp(1000.0 + RULE.quiet, [], RULE)
    assert ended.kind is Kind.DEVICE_FLAP_ENDED and ended.details["present"] is True
    for junk in (None, {}, [1, {"resource": GPU}], [{"resource": GPU, "device": "x", "changes": "2"}]):
        assert Flaps.from_json(junk, now=0.0) == Flaps()


async def test_a_flap_that_ends_while_the_agent_restarts_still_gets_its_end(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Issue 36 item 3: the episode ends while the agent is down; the restarted agent tells its end."""
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(
        settings, watch=dataclasses.replace(settings.watch, flap_limit=3, flap_window=60.0, flap_quiet=1.0)
    )
    fake = await start_kubelet(seed=18)
    gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        for i in range(5):
            fake.set_healthy(GPU, gpu, i % 2 == 1)
            await run.recorder.until(lambda i=i: run.recorder.kinds().count("device.removed") == i // 2 + 1)
            await run.quiet_cycle()
        assert "device.flapping" in run.recorder.kinds()
    fake.set_healthy(GPU, gpu, True)  # it settles while the agent is away
    async with running_agent(settings, fake) as run:
        await run.recorder.until(lambda: "device.flap_ended" in run.recorder.kinds(), timeout=10)
        (ended,) = [e for e in run.recorder.events if e.kind == "device.flap_ended"]
        assert ended.details["present"] is True and ended.details["device"] == gpu


def test_a_dra_story_ending_unobserved_ends_its_flapping_episode_for_good() -> None:
    def dra(kind: Kind) -> Change:
        return Change(
            kind, Severity.INFO, "x", {"resource": DRIVER, "device": "node-1/gpu-3", "source": "pod-status"}
        )

    flaps = Flaps()
    for i in range(6):
        flaps, _ = flaps.damp(
            float(i), [dra(Kind.DEVICE_UNHEALTHY if i % 2 == 0 else Kind.DEVICE_HEALTHY)], RULE
        )
    flaps, _ = flaps.damp(6.0, [dra(Kind.DEVICE_UNHEALTHY)], RULE)  # it ends unhealthy, still flapping
    assert flaps.flapping()
    flaps, (ended,) = flaps.damp(10.0, [dra(Kind.DEVICE_HEALTH_UNOBSERVED)], RULE)
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED and "flapping" not in ended.details
    assert flaps == Flaps() and flaps.next_look(RULE) is None
    _, out = flaps.damp(10.0 + RULE.quiet, [], RULE)
    assert out == []  # no flap_ended (present: False) to reopen what the end closed


def test_an_episode_saved_before_damping_was_turned_off_ends_at_once() -> None:
    flaps = Flaps()
    for i in range(6):
        flaps, _ = flaps.damp(
            float(i), [_health(Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED)], RULE
        )
    off = FlapRule(limit=0, window=60, quiet=30)
    assert flaps.next_look(off) is None  # no re-query loop on a deadline that never moves
    flaps, (ended,) = flaps.damp(100.0, [], off)
    assert ended.kind is Kind.DEVICE_FLAP_ENDED and flaps == Flaps()
