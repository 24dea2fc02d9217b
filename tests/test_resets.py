"""A reset is not a heal (issue 40, point 5): a failed device back only because its device plugin
(or DRA driver) restarted and forgot is `device.reset`, its page stays open, and the heal follows
only once it has stayed up for `[watch] reset_hold_down`.

The pure rules first (watcher.model.resets), then the agent against the fake kubelet, whose plugin
can restart forgetting its devices' health as NVIDIA's does, to a PagerDuty receiver.
"""

from __future__ import annotations

import time
from pathlib import Path

from testkit.agent import Running, make_settings, running_agent, with_config
from testkit.fake_kubelets import StartKubelet
from testkit.http_sinks import pd_table
from testkit.inventories import dra_job_pod
from testkit.receivers import PagerDutyReceiver
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import envelope
from watcher.model.incidents import Incidents
from watcher.model.resets import RESET_WINDOW_S, Resets
from watcher.settings import Settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.kubernetes.planner import plan

GPU = "nvidia.com/gpu"
FUSE = "smarter-devices/fuse"
DRIVER, POOL, DEVICE = "gpu.nvidia.com", "node-a", "gpu-3"
HOLD = 600.0


def _change(kind: Kind, device: str = "gpu-1", resource: str = GPU) -> Change:
    severity = Severity.CRITICAL if kind in (Kind.DEVICE_REMOVED, Kind.DEVICE_UNHEALTHY) else Severity.INFO
    return Change(kind, severity, f"{resource} {device} {kind}", {"resource": resource, "device": device})


def _kinds(changes: list[Change]) -> list[str]:
    return [str(c.kind) for c in changes]


def test_a_failed_device_back_with_its_plugins_registration_is_a_reset_and_its_heal_waits() -> None:
    resets, out = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], (), HOLD)
    assert _kinds(out) == ["device.removed"]
    resets, out = resets.observe(10.0, [_change(Kind.DEVICE_ADDED)], {GPU}, HOLD)
    (reset,) = out
    assert reset.kind is Kind.DEVICE_RESET and reset.severity is Severity.WARNING
    assert "not a verified heal" in reset.summary
    assert reset.details["device"] == "gpu-1" and reset.details["reset_of"] == "device.added"
    assert resets.next_look(HOLD) == 10.0 + HOLD
    resets, out = resets.observe(10.0 + HOLD - 1, [], (), HOLD)
    assert out == []  # not before the hold-down
    resets, out = resets.observe(10.0 + HOLD, [], (), HOLD)
    (heal,) = out
    assert heal.kind is Kind.DEVICE_ADDED and heal.details["after_reset"] is True
    assert heal.details["healthy_for_s"] == HOLD
    assert resets.next_look(HOLD) is None
    resets, out = resets.observe(10.0 + 2 * HOLD, [], (), HOLD)
    assert out == []  # once


def test_a_heal_without_a_restart_is_a_heal_as_before() -> None:
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], (), HOLD)
    added = _change(Kind.DEVICE_ADDED)
    resets, out = resets.observe(5.0, [added], (), HOLD)
    assert out == [added]
    assert resets.next_look(HOLD) is None


def test_a_restart_long_before_the_heal_explains_nothing() -> None:
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], {GPU}, HOLD)
    resets, out = resets.observe(RESET_WINDOW_S + 1, [_change(Kind.DEVICE_ADDED)], (), HOLD)
    assert _kinds(out) == ["device.added"]


def test_a_device_never_failed_that_comes_with_a_restart_is_just_added() -> None:
    added = _change(Kind.DEVICE_ADDED, "gpu-new")
    _, out = Resets().observe(0.0, [added], {GPU}, HOLD)
    assert out == [added]


def test_failing_again_during_the_hold_down_is_one_failure_marked_and_no_heal_follows() -> None:
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], (), HOLD)
    resets, _ = resets.observe(1.0, [_change(Kind.DEVICE_ADDED)], {GPU}, HOLD)
    resets, out = resets.observe(30.0, [_change(Kind.DEVICE_REMOVED)], (), HOLD)
    (again,) = out
    assert again.kind is Kind.DEVICE_REMOVED and again.details["failed_again"] is True
    resets, out = resets.observe(1.0 + 2 * HOLD, [], (), HOLD)
    assert out == []
    # A genuine heal later, no restart near it: the heal, at once.
    resets, out = resets.observe(3 * HOLD, [_change(Kind.DEVICE_ADDED)], (), HOLD)
    assert _kinds(out) == ["device.added"] and "after_reset" not in out[0].details


def test_hold_down_zero_turns_resets_off() -> None:
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], (), 0.0)
    _, out = resets.observe(1.0, [_change(Kind.DEVICE_ADDED)], {GPU}, 0.0)
    assert _kinds(out) == ["device.added"]


def test_a_dra_driver_whose_registration_socket_is_replaced_restarted() -> None:
    dra = f"{POOL}/{DEVICE}"
    resets, _ = Resets().observe(
        0.0, [_change(Kind.DEVICE_UNHEALTHY, dra, DRIVER)], (), HOLD, {DRIVER: "1:1"}
    )
    # The same socket: no restart, a heal is a heal.
    _, out = resets.observe(1.0, [_change(Kind.DEVICE_HEALTHY, dra, DRIVER)], (), HOLD, {DRIVER: "1:1"})
    assert _kinds(out) == ["device.healthy"]
    # Gone, then back with another identity: its driver registered again.
    resets, _ = resets.observe(1.0, [], (), HOLD, {})
    resets, out = resets.observe(2.0, [_change(Kind.DEVICE_HEALTHY, dra, DRIVER)], (), HOLD, {DRIVER: "2:2"})
    assert _kinds(out) == ["device.reset"]
    # The first look says nothing: the agent did not see the driver start.
    fresh, _ = Resets().observe(0.0, [_change(Kind.DEVICE_UNHEALTHY, dra, DRIVER)], (), HOLD)
    _, out = fresh.observe(1.0, [_change(Kind.DEVICE_HEALTHY, dra, DRIVER)], (), HOLD, {DRIVER: "3:3"})
    assert _kinds(out) == ["device.healthy"]


def test_the_held_heal_and_the_failed_devices_outlive_an_agent_restart_and_are_told_once() -> None:
    resets, _ = Resets().observe(
        0.0, [_change(Kind.DEVICE_REMOVED), _change(Kind.DEVICE_REMOVED, "gpu-2")], (), HOLD
    )
    resets, _ = resets.observe(1.0, [_change(Kind.DEVICE_ADDED)], {GPU}, HOLD)
    restored = Resets.from_json(resets.to_json(), now=500.0)
    assert restored.failed == ((("nvidia.com/gpu", "gpu-2"), 500.0),)
    assert restored.next_look(HOLD) == 500.0 + HOLD  # counted again from the restart: never early
    restored, out = restored.observe(500.0 + HOLD, [], (), HOLD)
    assert _kinds(out) == ["device.added"] and out[0].details["after_reset"] is True
    assert Resets.from_json(restored.to_json(), now=0.0).next_look(HOLD) is None
    assert Resets.from_json({"held": [{"resource": 1}], "failed": [[1, 2]]}, now=0.0) == Resets()
    assert Resets.from_json("garbage", now=0.0) == Resets()


def test_a_mass_failure_its_plugin_resets_stays_one_incident_when_its_devices_fail_again() -> None:
    """Eight GPUs fail at once (one incident), the plugin restarts calling them Healthy (eight
    resets, the incident still open), they fail again: the same incident, no new one, nothing
    paged per device; their held heals are cancelled."""
    gpus = [f"gpu-{i}" for i in range(8)]
    resets, incidents = Resets(), Incidents()
    resets, out = resets.observe(0.0, [_change(Kind.DEVICE_REMOVED, g) for g in gpus], (), HOLD)
    incidents, out = incidents.group("c1", out, 8)
    assert _kinds(out) == ["device.removed"] * 8 + ["device.incident"]
    key = out[-1].details["incident"]
    resets, out = resets.observe(10.0, [_change(Kind.DEVICE_ADDED, g) for g in gpus], {GPU}, HOLD)
    incidents, out = incidents.group("c2", out, 8)
    assert _kinds(out) == ["device.reset"] * 8  # no device.incident_resolved
    resets, out = resets.observe(20.0, [_change(Kind.DEVICE_REMOVED, g) for g in gpus], (), HOLD)
    incidents, out = incidents.group("c3", out, 8)
    assert _kinds(out) == ["device.removed"] * 8
    assert all(c.details["incident"] == key and c.details["failed_again"] for c in out)
    assert resets.next_look(HOLD) is None
    # A genuine heal of all eight later resolves the one incident.
    resets, out = resets.observe(900.0, [_change(Kind.DEVICE_ADDED, g) for g in gpus], (), HOLD)
    _, out = incidents.group("c4", out, 8)
    assert _kinds(out) == ["device.added"] * 8 + ["device.incident_resolved"]


def test_a_device_plugin_socket_replaced_resets_a_resource_whose_devices_had_all_failed() -> None:
    """No `plugin.registered` names a resource the kubelet had no device of to drop: a device
    plugin's socket replaced stands for it (a DRA device's heal is not a device plugin's)."""
    sockets = {"fuse.sock": "1:1"}
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED, "fuse0", FUSE)], (), HOLD, None, sockets)
    same, out = resets.observe(1.0, [_change(Kind.DEVICE_ADDED, "fuse0", FUSE)], (), HOLD, None, sockets)
    assert _kinds(out) == ["device.added"]  # the same socket: a heal
    resets, _ = resets.observe(1.0, [_change(Kind.DEVICE_REMOVED, "fuse0", FUSE)], (), HOLD, None, sockets)
    replaced = {"fuse.sock": "2:2"}
    resets, out = resets.observe(2.0, [_change(Kind.DEVICE_ADDED, "fuse0", FUSE)], (), HOLD, None, replaced)
    assert _kinds(out) == ["device.reset"]
    dra = _change(Kind.DEVICE_UNHEALTHY, f"{POOL}/{DEVICE}", DRIVER)
    healed = _change(Kind.DEVICE_HEALTHY, f"{POOL}/{DEVICE}", DRIVER)
    resets, _ = Resets().observe(0.0, [dra], (), HOLD, None, sockets)
    _, out = resets.observe(1.0, [healed], (), HOLD, None, replaced)
    assert _kinds(out) == ["device.healthy"]
    assert same.plugins == (("fuse.sock", "1:1"),)


def test_the_kubernetes_sink_says_a_reset_on_the_node_and_keeps_the_condition_until_the_heal() -> None:
    removed = Change(
        Kind.DEVICE_REMOVED,
        Severity.CRITICAL,
        f"{GPU} gpu-1 left allocatable while allocated to ml/trainer-0/main",
        {"resource": GPU, "device": "gpu-1", "allocated_to": ["ml/trainer-0/main"], "namespaces": ["ml"]},
    )
    resets, out = Resets().observe(0.0, [removed], (), HOLD)
    resets, reset = resets.observe(1.0, [_change(Kind.DEVICE_ADDED)], {GPU}, HOLD)
    events = [
        envelope(c, seq=i + 1, node="node-a", cycle="c1", before=None, after=None)
        for i, c in enumerate([*out, *reset])
    ]
    report = plan(events, {})
    node = [(e.type, e.reason, e.note) for e in report.events if e.regarding.kind == "Node"]
    assert ("Warning", "DeviceReset", reset[0].summary) in node
    assert reset[0].summary.startswith(f"{GPU} gpu-1 is back after its plugin restarted, not a verified heal")
    assert report.missing == {GPU: {"gpu-1": ["ml/trainer-0/main"]}}  # its condition stays True
    _, healed = resets.observe(1.0 + HOLD, [], (), HOLD)
    after = plan(
        [envelope(healed[0], seq=9, node="node-a", cycle="c2", before=None, after=None)], report.missing
    )
    assert after.missing == {}


# --- the agent against the fake kubelet ---


def _settings(root: Path, pager: PagerDutyReceiver, reset_hold_down: float) -> Settings:
    pager_table = pd_table(pager, rate=100.0)
    return with_config(
        make_settings(root), {"sinks": {"pager": pager_table}, "watch": {"reset_hold_down": reset_hold_down}}
    )


def _actions(pager: PagerDutyReceiver) -> list[str]:
    return [e["event_action"] for e in pager.events]


async def _failed(run: Running, pager: PagerDutyReceiver, fail: object) -> int:
    await run.recorder.kinds_after(0, 1)
    await run.settled()
    await run.quiet_cycle()
    mark = len(run.recorder.events)
    assert callable(fail)
    fail()
    await pager.wait_for(1, timeout=10)
    return mark


async def test_a_plugin_restart_that_forgets_a_failed_gpu_resets_it_and_resolves_after_the_hold_down(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=40)
    gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    hold = 2.0
    async with PagerDutyReceiver() as pager, running_agent(_settings(short_tmp, pager, hold), fake) as run:
        mark = await _failed(run, pager, lambda: fake.make_unhealthy(GPU, gpu))
        fake.plugins.restart_plugin(GPU, downtime=0.3, forgets=True)
        await run.recorder.until(lambda: "device.reset" in run.recorder.kinds(mark), timeout=10)
        reset_seen = time.monotonic()
        (reset,) = [e for e in run.recorder.events[mark:] if e.kind == "device.reset"]
        assert reset.details["device"] == gpu and str(reset.severity) == "warning"
        await run.quiet_cycle()
        assert _actions(pager) == ["trigger"]  # the page stays open
        await pager.wait_for(2, timeout=10)
        assert time.monotonic() - reset_seen >= hold - 0.2
        await run.quiet_cycle()
        assert _actions(pager) == ["trigger", "resolve"]
        kinds = [k for k in run.recorder.kinds(mark) if k != "capacity.changed"]
        assert kinds == [
            "device.removed",
            "plugin.unregistered",
            "plugin.registered",
            "device.reset",
            "device.added",
        ]
        (heal,) = [e for e in run.recorder.events[mark:] if e.kind == "device.added"]
        assert heal.details["after_reset"] is True
        assert pager.violations == []


async def test_a_reset_gpu_failing_again_pages_nothing_new_and_a_genuine_heal_later_resolves(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=41)
    gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    async with PagerDutyReceiver() as pager, running_agent(_settings(short_tmp, pager, 600.0), fake) as run:
        mark = await _failed(run, pager, lambda: fake.make_unhealthy(GPU, gpu))
        fake.plugins.restart_plugin(GPU, downtime=0.3, forgets=True)
        await run.recorder.until(lambda: "device.reset" in run.recorder.kinds(mark), timeout=10)
        fake.make_unhealthy(GPU, gpu)
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("device.removed") == 2, timeout=10)
        again = [e for e in run.recorder.events[mark:] if e.kind == "device.removed"][-1]
        assert again.details["failed_again"] is True
        await run.quiet_cycle()
        assert _actions(pager) == ["trigger"]  # still the one open page
        fake.heal(GPU, gpu)  # no restart near it: a heal, resolved at once
        await pager.wait_for(2, timeout=10)
        assert _actions(pager) == ["trigger", "resolve"] and pager.incidents_opened() == 1


async def test_an_agent_restarted_during_the_reset_hold_down_resolves_once(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=42)
    gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    async with PagerDutyReceiver() as pager:
        settings = _settings(short_tmp, pager, 3.0)
        async with running_agent(settings, fake) as run:
            mark = await _failed(run, pager, lambda: fake.make_unhealthy(GPU, gpu))
            fake.plugins.restart_plugin(GPU, downtime=0.3, forgets=True)
            await run.recorder.until(lambda: "device.reset" in run.recorder.kinds(mark), timeout=10)
        assert _actions(pager) == ["trigger"]
        async with running_agent(settings, fake) as run:
            await pager.wait_for(2, timeout=15)
            await run.quiet_cycle()
            assert run.recorder.kinds().count("device.added") == 1
            assert "device.reset" not in run.recorder.kinds()
        assert _actions(pager) == ["trigger", "resolve"]


async def test_a_dra_driver_restart_that_calls_a_failed_device_healthy_is_a_reset(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=43)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE))
    registry = short_tmp / "kubelet" / "plugins_registry"
    fake.dra.register(DRIVER, registry)
    async with fake, PagerDutyReceiver() as pager:
        settings = _settings(short_tmp, pager, 2.0)
        async with running_agent(settings, fake) as run:
            watch = run.agent.pods_watch
            assert watch is not None
            await run.recorder.kinds_after(0, 1)
            await run.recorder.until(lambda: watch.state == "watching", 10)
            fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy")
            await run.quiet_cycle()

            def fail() -> None:
                fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", "critical XID 79 reported by NVML")

            mark = await _failed(run, pager, fail)
            # The driver restarts: a new registration socket, and it calls every device Healthy.
            fake.dra.restart_driver(DRIVER, registry)
            await run.recorder.until(lambda: "device.reset" in run.recorder.kinds(mark), timeout=10)
            await run.quiet_cycle()
            assert _actions(pager) == ["trigger"]
            await pager.wait_for(2, timeout=10)
            assert _actions(pager) == ["trigger", "resolve"]
            kinds = run.recorder.kinds(mark)
            assert kinds == ["device.unhealthy", "device.reset", "device.healthy"], kinds


def test_a_plugin_back_still_calling_the_device_failed_then_healing_it_is_a_heal() -> None:
    """The restarted plugin reported the failure itself (the device stayed out): its later heal is
    its own word on a device it watched, not a forgotten failure."""
    resets, _ = Resets().observe(0.0, [_change(Kind.DEVICE_REMOVED)], (), HOLD)
    resets, _ = resets.observe(5.0, [_change(Kind.DEVICE_REMOVED)], {GPU}, HOLD)  # failed again, seen with it
    _, out = resets.observe(20.0, [_change(Kind.DEVICE_ADDED)], (), HOLD)
    assert _kinds(out) == ["device.added"]


async def test_a_plugin_restart_that_forgets_every_failed_device_of_its_resource_resets_them(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Every fuse device failed, so the plugin's restart takes nothing out of allocatable (no
    `plugin.unregistered`): its socket replaced is what tells the restart."""
    fake = await start_kubelet(seed=44)
    fuses = sorted(i for r, i in fake.node.devices if r == FUSE)
    async with PagerDutyReceiver() as pager, running_agent(_settings(short_tmp, pager, 600.0), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.settled()
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        for fuse in fuses:
            fake.make_unhealthy(FUSE, fuse)
        await pager.wait_for(len(fuses), timeout=10)
        fake.plugins.restart_plugin(FUSE, downtime=0.3, forgets=True)
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("device.reset") == len(fuses), 10)
        await run.quiet_cycle()
        kinds = [k for k in run.recorder.kinds(mark) if k != "capacity.changed"]
        assert kinds == ["device.removed"] * len(fuses) + ["device.reset"] * len(fuses), kinds
        assert _actions(pager) == ["trigger"] * len(fuses)  # every page stays open
