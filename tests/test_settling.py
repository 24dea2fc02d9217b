"""Settling: the kubelet's warm-up after restarts, and plugin restarts, never reach a person.

The pure rules first (watcher.model.settling), then the agent against a fake kubelet that warms
up like a real one: plugins re-register after a delay, List fills in pod by pod.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher.model.build import build
from watcher.model.changes import Kind
from watcher.model.inventory import Inventory
from watcher.model.settling import DEPARTURE_S, PODS_STABLE_S, Settling
from watcher.ratelimit import TokenBucket
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sim.fake_plugins import Warmup, plugin_socket_name

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
# `make chaos` runs the acceptance figures: 50 restarts, plugins back over 0-5 s.
RESTARTS = int(os.environ.get("PRW_WARMUP_RESTARTS", "4"))
PLUGIN_DELAY = float(os.environ.get("PRW_WARMUP_MAX_S", "0.6"))


def _node_inventories() -> tuple[Inventory, Inventory, frozenset[str]]:
    """The default node settled, and the same node right after a kubelet restart (no devices,
    no pods yet), with its plugin sockets."""
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    settled = build(fake.allocatable_response(), fake.list_response())
    fake.plugins.down = {r for r, _ in fake.node.devices}
    fake.plugins.hidden_pods = set(fake.node.pods)
    empty = build(fake.allocatable_response(), fake.list_response())
    sockets = frozenset(plugin_socket_name(r) for r, _ in fake.node.devices)
    return settled, empty, sockets


def test_a_kubelet_restart_holds_everything_until_plugins_and_pods_are_back() -> None:
    settled, empty, sockets = _node_inventories()
    s = Settling(sockets=sockets).kubelet_restarted(100.0, settled)
    s, changes = s.observe(100.0, settled, empty, frozenset(), grace=60)
    assert changes == [] and s.holding
    assert s.present(settled, empty) is settled  # nothing to report
    s, changes = s.observe(101.0, settled, settled, sockets, grace=60)  # all back
    assert changes == [] and not s.held and s.pods_since is not None  # pods: not stable for long yet
    s, changes = s.observe(101.0 + PODS_STABLE_S, settled, settled, sockets, grace=60)
    assert changes == [] and not s.holding


def test_a_plugin_that_never_returns_is_released_after_the_grace() -> None:
    settled, _, sockets = _node_inventories()
    without_gpus = Inventory(
        tuple(d for d in settled.devices if d.resource != GPU), settled.cpu_ids, settled.memory, settled.pods
    )
    gone = sockets - {plugin_socket_name(GPU)}
    s, changes = Settling(sockets=sockets).observe(10.0, settled, without_gpus, gone, grace=30)
    assert [c.kind for c in changes] == [Kind.PLUGIN_UNREGISTERED]
    assert s.present(settled, without_gpus) is settled
    s, changes = s.observe(39.0, settled, without_gpus, gone, grace=30)
    assert changes == [] and s.held_resources() == {GPU}
    s, changes = s.observe(40.0, settled, without_gpus, gone, grace=30)
    assert changes == [] and not s.holding  # released as it is: the diff reports the loss
    assert s.present(settled, without_gpus) is without_gpus


def _without(settled: Inventory, resource: str) -> Inventory:
    kept = tuple(d for d in settled.devices if d.resource != resource)
    return Inventory(kept, settled.cpu_ids, settled.memory, settled.pods)


def test_devices_leaving_a_moment_after_their_plugins_socket_are_its_departure() -> None:
    """The kubelet drops a departed plugin's devices when its stream ends: a look in between sees
    the socket gone and every device there; the drop at the next look is still the plugin going."""
    settled, _, sockets = _node_inventories()
    gone = sockets - {plugin_socket_name(GPU)}
    s, changes = Settling(sockets=sockets).observe(10.0, settled, settled, gone, grace=60)
    assert changes == [] and not s.holding
    s, changes = s.observe(10.0 + DEPARTURE_S - 0.1, settled, _without(settled, GPU), gone, grace=60)
    assert [c.kind for c in changes] == [Kind.PLUGIN_UNREGISTERED] and s.held_resources() == {GPU}


def test_devices_leaving_after_the_departure_window_are_a_loss_even_without_a_look_between() -> None:
    """The window is timed from the socket's going, not ended by a look: a drop first seen after
    DEPARTURE_S (the next look being the timer) is not explained by that plugin any more."""
    settled, _, sockets = _node_inventories()
    gone = sockets - {plugin_socket_name(GPU)}
    s, _ = Settling(sockets=sockets).observe(10.0, settled, settled, gone, grace=60)
    s, changes = s.observe(10.0 + DEPARTURE_S + 20, settled, _without(settled, GPU), gone, grace=60)
    assert changes == [] and not s.holding  # reported by the diff as it is: devices removed


def test_each_departed_socket_has_its_own_window() -> None:
    """A second plugin leaving later gets its full window: the first one's neither ends it nor
    lets it run on."""
    settled, _, sockets = _node_inventories()
    nic_gone = sockets - {plugin_socket_name(NIC)}
    both_gone = nic_gone - {plugin_socket_name(GPU)}
    s, _ = Settling(sockets=sockets).observe(10.0, settled, settled, nic_gone, grace=60)
    later = 10.0 + DEPARTURE_S + 1  # the NIC plugin's window is over, nothing looked since
    s, changes = s.observe(later, settled, settled, both_gone, grace=60)
    assert changes == []
    s, changes = s.observe(later + 0.5, settled, _without(settled, GPU), both_gone, grace=60)
    assert [(c.kind, c.details["resource"]) for c in changes] == [(Kind.PLUGIN_UNREGISTERED, GPU)]


def test_a_device_that_vanishes_while_its_plugin_stays_is_not_held() -> None:
    settled, _, sockets = _node_inventories()
    one_less = Inventory(settled.devices[1:], settled.cpu_ids, settled.memory, settled.pods)
    s, changes = Settling(sockets=sockets).observe(10.0, settled, one_less, sockets, grace=30)
    assert changes == [] and not s.holding
    assert s.present(settled, one_less) is one_less
    # Every device of a resource gone, yet no plugin socket went away: a real loss, at once.
    no_gpu = Inventory(
        tuple(d for d in settled.devices if d.resource != GPU), settled.cpu_ids, settled.memory, settled.pods
    )
    s, changes = Settling(sockets=sockets).observe(10.0, settled, no_gpu, sockets, grace=30)
    assert changes == [] and not s.holding


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    """A fake kubelet where the agent harness looks for it."""
    async with FakeKubelet(short_tmp / "kubelet", seed=42) as fake:
        yield fake


@pytest.mark.chaos  # long: `make chaos` runs it (CI runs both), `make test` leaves it out
@pytest.mark.timeout(900)
async def test_restarts_with_warm_up_and_no_change_report_only_the_restarts(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=5)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.settled()
        # From now on every restart warms up.
        fake.plugins.warmup = Warmup(plugin_delay=(0.0, PLUGIN_DELAY), pods_delay=(0.0, PLUGIN_DELAY / 2))
        mark = len(run.recorder.events)
        for n in range(RESTARTS):
            await fake.restart(downtime=0.05)
            await run.recorder.until(
                lambda n=n: run.recorder.kinds(mark).count("kubelet.restarted") == n + 1, timeout=30
            )
            await run.settled()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"] * RESTARTS
        assert run.agent.inventory == build(fake.allocatable_response(), fake.list_response())


async def test_a_node_reboot_reports_nothing_the_warm_up_explains(short_tmp: Path) -> None:
    """The agent and the kubelet start together on a saved inventory, nothing changed."""
    settings = make_settings(short_tmp)
    first = FakeKubelet(short_tmp / "kubelet", seed=6)
    async with first, running_agent(settings, first) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
    warmup = Warmup(plugin_delay=(0.1, 0.8), pods_delay=(0.0, 0.4))
    rebooted = FakeKubelet(short_tmp / "kubelet", seed=6, warmup=warmup)
    async with rebooted, running_agent(settings, rebooted) as run:
        await run.settled()
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started", "kubelet.restarted"]


async def test_a_plugin_restart_gives_only_plugin_lifecycle_events(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        kubelet.plugins.restart_plugin(GPU, downtime=0.3)
        await run.recorder.until(lambda: "plugin.registered" in run.recorder.kinds(mark), timeout=10)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["plugin.unregistered", "plugin.registered"]
        assert all(e.details["resource"] == GPU for e in run.recorder.events[mark:])


async def test_a_plugin_whose_stream_ends_after_its_socket_is_gone_is_seen_without_the_timer(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    """The kubelet drops a departed plugin's devices when its ListAndWatch stream ends, a moment
    after the socket is gone, and writes no file then: the re-query the socket's removal triggers
    comes too early, and only the follow-up looks catch the drop (the timer is an hour here)."""
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        # The drop comes 1 s after the socket goes: the look the removal triggers, and the 0.5 s
        # follow-up, both see every device still there.
        kubelet.plugins.restart_plugin(GPU, downtime=5.0, stream_ends_after=1.0)
        await run.recorder.until(lambda: bool(run.recorder.kinds(mark)), timeout=4)
        assert run.recorder.kinds(mark) == ["plugin.unregistered"]  # not its devices "removed"


async def test_a_plugin_that_never_returns_is_reported_once_after_the_grace(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(settings, kubelet=dataclasses.replace(settings.kubelet, warmup_grace=1.0))
    async with running_agent(settings, kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        gpus = sorted(i for r, i in kubelet.node.devices if r == GPU)
        kubelet.plugins.restart_plugin(GPU, downtime=None)
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark), timeout=10)
        await run.quiet_cycle()
        removed = [e for e in run.recorder.events[mark:] if e.kind == "device.removed"]
        assert sorted(e.details["device"] for e in removed) == gpus  # each once
        held = [e for e in removed if e.details["allocated_to"]]
        assert held and all(str(e.severity) == "critical" for e in held)
        assert "ml/trainer-0/trainer" in {p for e in held for p in e.details["allocated_to"]}
        kinds = run.recorder.kinds(mark)
        assert kinds[0] == "plugin.unregistered" and "plugin.registered" not in kinds


async def test_a_real_failure_during_another_resources_warm_up_is_reported_at_once(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        kubelet.plugins.restart_plugin(GPU, downtime=30)  # the GPUs stay held throughout
        await run.recorder.until(lambda: "plugin.unregistered" in run.recorder.kinds())
        mark = len(run.recorder.events)
        nic = sorted(i for r, i in kubelet.node.devices if r == NIC)[0]
        loop = asyncio.get_running_loop()
        started = loop.time()
        kubelet.make_unhealthy(NIC, nic)
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark), timeout=5)
        assert loop.time() - started < 1.0
        (removed,) = [e for e in run.recorder.events[mark:] if e.kind == "device.removed"]
        assert removed.details["device"] == nic
        assert run.agent.settling.held_resources() == {GPU}


async def test_a_restart_seen_on_a_rate_limited_look_still_holds_the_warm_up(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    """The kubelet's limiter is shared by every client on the node: when the first look after a
    restart is refused, the restart is known (the socket was replaced) and its warm-up must be
    held all the same, not diffed raw at the next answer: exactly `kubelet.restarted`."""
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        # Plugins back after 1-2 s: the agent's retry after the refusal comes well within it.
        kubelet.plugins.warmup = Warmup(plugin_delay=(1.0, 2.0), pods_delay=(0.0, 0.5))
        # The new kubelet's limiter as another client's burst leaves it: one call, then refusals.
        kubelet.rate, kubelet.burst = 0.5, 1
        await kubelet.restart()
        metrics = run.agent.metrics
        await run.recorder.until(lambda: metrics.value("requeries_total", result="rate_limited") > 0)
        kubelet.bucket = TokenBucket(100.0, 10)  # the other client is done
        await run.settled()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"]
        assert run.agent.inventory == build(kubelet.allocatable_response(), kubelet.list_response())


def test_a_restart_held_before_any_answer_times_its_hold_from_the_first_answer() -> None:
    settled, empty, sockets = _node_inventories()
    s = Settling(sockets=sockets).kubelet_restarted(0.0, settled)
    # The first answer comes 100 s after the restart was seen (the kubelet refused till then):
    # the warm-up it shows is held, the grace counting from here.
    s, changes = s.observe(100.0, settled, empty, frozenset(), grace=30)
    assert changes == [] and s.held_resources() == {d.resource for d in settled.devices}
    assert s.present(settled, empty) == settled


def test_a_restart_not_answered_yet_asks_for_no_look_of_its_own() -> None:
    """Until the first answer after a restart the kubelet's refusals set the pace (their backoff):
    a settle look due at once would re-ask at our cap while the kubelet refuses."""
    settled, empty, sockets = _node_inventories()
    s = Settling(sockets=sockets, last_look=5.0).kubelet_restarted(100.0, settled)
    assert s.holding and s.next_look(grace=30) is None
    s, _ = s.observe(101.0, settled, empty, frozenset(), grace=30)
    assert s.next_look(grace=30) == 102.0
