"""The watch loop against the fake kubelet, with real inotify on real directories."""

from __future__ import annotations

import asyncio
import atexit
import bisect
import contextlib
import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.processes import fake_kubelet_process
from testkit.waiting import wait_until
from watcher.kubelet import watching
from watcher.kubelet.identity import FileIdentity, is_replacement, probe_socket, replaced_since
from watcher.sim.fake_kubelet import FakeKubelet

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"


@pytest.fixture
async def fake(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(short_tmp / "kubelet", seed=42)
    yield kubelet
    await kubelet.stop(remove_socket=True)


def _agent(fake: FakeKubelet, short_tmp: Path, **overrides: Any) -> AbstractAsyncContextManager[Running]:
    return running_agent(make_settings(short_tmp, **overrides), fake)


async def _started(
    fake: FakeKubelet, short_tmp: Path, **overrides: Any
) -> AbstractAsyncContextManager[Running]:
    await fake.start()
    return _agent(fake, short_tmp, **overrides)


@pytest.mark.parametrize("downtime", [0.0, 0.2, 3.0], ids=["rename-in-place", "200ms", "3s"])
async def test_each_kubelet_restart_is_reported_once_and_requeried_at_once(
    fake: FakeKubelet, short_tmp: Path, downtime: float
) -> None:
    async with await _started(fake, short_tmp) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        reconnects = run.agent.metrics.value("reconnects_total")
        await fake.restart(downtime=downtime)
        assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
        # A fresh channel was dialled for the new socket.
        assert run.agent.metrics.value("reconnects_total") == reconnects + 1
        assert fake.started_at is not None
        await run.recorder.until(lambda: fake.first_call_at is not None)
        assert fake.first_call_at is not None
        # Generous bound; bench/ measures the real figure.
        assert fake.first_call_at - fake.started_at < 1.0
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"]


async def test_a_new_socket_while_the_old_kubelet_hangs_in_a_query_is_asked_at_once(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    # The old kubelet still up but hung in List (its shutdown), the new one's socket renamed into
    # place: the hung call is given up at once, not after its 10 s deadline, and the new kubelet
    # asked with its own rate budget.
    async with await _started(fake, short_tmp, pods_api=False, max_rpc_rate=2.0) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        fake.faults.set_delay("List", 60)
        run.agent.wake("hung")
        await wait_until(lambda: fake.faults.held == 1, 5, what="a List held by the old kubelet")
        successor = FakeKubelet(short_tmp / "kubelet", seed=42)
        try:
            started = time.monotonic()
            await successor.start()
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
            await run.recorder.until(lambda: successor.first_call_at is not None, 5)
            assert successor.first_call_at is not None and successor.first_call_at - started < 2.0
            assert fake.faults.held == 0  # the old call was cancelled, not waited for
        finally:
            await successor.stop(remove_socket=True)


async def test_delete_and_create_in_one_batch_is_a_restart(fake: FakeKubelet, short_tmp: Path) -> None:
    # The Pods API off: its stream's end would have the restart found first, by the socket's identity.
    async with await _started(fake, short_tmp, pods_api=False) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        # Unlink, listen on a temporary name, rename into place: all within a
        # millisecond, far inside one 50 ms batch of directory events.
        await fake.stop(remove_socket=True)
        await fake.start()
        assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
        assert run.recorder.events[-1].details["seen_by"] == "directory watch"


async def test_a_restart_missed_by_the_directory_watch_still_counts(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    # Polling every minute: the watch will never see it; the identity check on the timer must. The
    # Pods API off: its stream's end would have the watch look at the directory's mtime at once.
    async with await _started(
        fake, short_tmp, force_polling=True, poll_interval=60, interval=0.3, pods_api=False
    ) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        await fake.restart()
        assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
        assert run.recorder.events[-1].details["seen_by"] == "identity check"


async def test_device_and_allocation_changes_produce_exactly_the_expected_events(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    inference_gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
    steps = [
        ("hot-plug", lambda: fake.add_device(GPU, "GPU-hotplug", (1,)), {("device.added", "info")}),
        ("unplug free", lambda: fake.remove_device(GPU, "GPU-hotplug"), {("device.removed", "warning")}),
        (
            "health loss in use",
            lambda: fake.make_unhealthy(GPU, inference_gpu),
            {("device.removed", "critical")},
        ),
        ("healing", lambda: fake.heal(GPU, inference_gpu), {("device.added", "info")}),
        (
            "allocation",
            lambda: fake.allocate("team", "job-1", "main", devices={NIC: ["0000:86:02.2"]}),
            {("allocation.added", "info")},
        ),
        ("release", lambda: fake.free("team", "job-1"), {("allocation.removed", "info")}),
    ]
    async with await _started(fake, short_tmp) as run:
        await run.recorder.kinds_after(0, 1)
        for name, act, expected in steps:
            mark = len(run.recorder.events)
            act()
            await run.recorder.kinds_after(mark, 2)
            await run.quiet_cycle()
            got = {(str(e.kind), str(e.severity)) for e in run.recorder.events[mark:]}
            assert got == expected | {("capacity.changed", "info")}, name
            assert len(run.recorder.events) == mark + 2, name
            if name == "health loss in use":
                removed = next(e for e in run.recorder.events[mark:] if e.kind == "device.removed")
                assert removed.details["allocated_to"] == ["ml/inference-7f9c/server"]
                assert "ml/inference-7f9c/server" in removed.summary


async def test_shuffled_unchanged_answers_produce_no_events(fake: FakeKubelet, short_tmp: Path) -> None:
    async with await _started(fake, short_tmp, max_rpc_rate=50) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        parsed_before = run.agent.decoder.stats.parsed
        rebuilt_before = run.agent.decoder.stats.pods_rebuilt
        for _ in range(100):
            await run.quiet_cycle()
        assert run.recorder.kinds(mark) == []
        # Every answer came shuffled, so each one was decoded and found equal,
        # without building a single pod again.
        assert run.agent.decoder.stats.parsed - parsed_before == 100
        assert run.agent.decoder.stats.pods_rebuilt == rebuilt_before


async def test_identical_bytes_take_the_fast_path(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    fake = await start_kubelet(shuffle=False)
    async with _agent(fake, short_tmp) as run:
        await run.recorder.kinds_after(0, 1)
        parsed = run.agent.decoder.stats.parsed
        for _ in range(10):
            await run.quiet_cycle()
        assert run.agent.decoder.stats.parsed == parsed
        assert run.agent.decoder.stats.same_bytes >= 10


async def test_state_file_change_is_reported_within_a_second(fake: FakeKubelet, short_tmp: Path) -> None:
    # The Pods API off: the state file must be what triggers the re-query.
    async with await _started(fake, short_tmp, interval=3600, pods_api=False) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        cycles = len(run.recorder.reasons)
        changed_at = time.monotonic()
        fake.add_device(GPU, "GPU-late", (0,))  # rewrites device-plugins/kubelet_internal_checkpoint
        await run.recorder.kinds_after(mark, 1, timeout=5)
        assert time.monotonic() - changed_at < 1.0
        assert any(
            r.startswith("state-file:kubelet_internal_checkpoint")
            for rs in run.recorder.reasons[cycles:]
            for r in rs
        )


async def test_agent_restart_reports_only_real_changes_and_seq_continues(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    await fake.start()
    settings = make_settings(short_tmp)
    seqs: list[int] = []
    async with running_agent(settings, fake) as run:
        assert await run.recorder.kinds_after(0, 1) == ["watcher.started"]
        seqs += [e.seq for e in run.recorder.events]
    fake.add_device(GPU, "GPU-while-away", (1,))
    async with running_agent(settings, fake) as run:
        kinds = await run.recorder.kinds_after(0, 3)
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started", "device.added", "capacity.changed"]
        assert run.recorder.events[0].details["changes_since_last_run"] == 2
        assert kinds[1:] == ["device.added", "capacity.changed"]
        seqs += [e.seq for e in run.recorder.events]
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started"]
        seqs += [e.seq for e in run.recorder.events]
    assert seqs == list(range(1, len(seqs) + 1))
    # The audit file holds the same events, in order.
    lines = (short_tmp / "state" / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"]["seq"] for line in lines] == seqs


async def test_corrupt_outbox_is_moved_aside_and_a_fresh_baseline_taken(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    (short_tmp / "state").mkdir()
    (short_tmp / "state" / "outbox.db").write_bytes(b"this is not a database" * 100)
    await fake.start()
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            await run.quiet_cycle()
            assert run.recorder.kinds() == ["watcher.started"]
            assert run.recorder.events[0].details["baseline"] == "fresh"
    assert any("corrupt" in e["event"] and e["log_level"] == "error" for e in logs)
    assert list((short_tmp / "state").glob("outbox.db.corrupt-*"))
    # The old seq went with the database: continue from the clock, never from 1 again
    # (an audit log that holds seq 1..n would otherwise skip the new events).
    assert run.recorder.events[0].seq > 1_000_000_000


async def test_unreadable_saved_state_warns_and_seq_never_repeats(fake: FakeKubelet, short_tmp: Path) -> None:
    await fake.start()
    settings = make_settings(short_tmp)
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        first_seq = run.recorder.events[0].seq
    db = sqlite3.connect(short_tmp / "state" / "outbox.db")
    with db:
        db.execute("UPDATE saved_state SET value = '{\"version\": 999}' WHERE part = 'head'")
    db.close()
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            assert run.recorder.events[0].details["baseline"] == "fresh"
            assert run.recorder.events[0].seq > first_seq
    assert any(e["event"].startswith("saved state is unreadable") for e in logs)


async def test_socket_directory_missing_at_start(fake: FakeKubelet, short_tmp: Path) -> None:
    settings = make_settings(short_tmp, state_file_triggers=False)
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            assert await run.recorder.kinds_after(0, 1) == ["watcher.started"]
            assert run.recorder.events[0].details["kubelet"]["reachable"] is False
            await fake.start()  # creates the directory and the socket
            assert await run.recorder.kinds_after(1, 1) == ["kubelet.connected"]
            await run.quiet_cycle()
            assert run.recorder.kinds() == ["watcher.started", "kubelet.connected"]
    waiting = [
        e for e in logs if e["event"] == "directory does not exist, waiting for it" and e["watch"] == "socket"
    ]
    assert len(waiting) == 1


async def test_path_that_is_not_a_socket(fake: FakeKubelet, short_tmp: Path) -> None:
    sock = fake.socket_path
    sock.parent.mkdir(parents=True)
    settings = make_settings(short_tmp, state_file_triggers=False)
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            sock.write_text("oops")  # a file bind-mounted in the socket's place
            await run.recorder.until(lambda: any("not a socket" in e["event"] for e in logs), timeout=5)
            await fake.start()  # the real kubelet replaces it
            assert await run.recorder.kinds_after(1, 1) == ["kubelet.connected"]


async def test_unreachable_after_grace_then_reachable(fake: FakeKubelet, short_tmp: Path) -> None:
    async with await _started(fake, short_tmp, unreachable_grace=0.5) as run:
        await run.recorder.kinds_after(0, 1)
        await fake.stop()  # the stale socket stays, nobody answers
        run.agent.wake("test")
        assert await run.recorder.kinds_after(1, 1) == ["kubelet.unreachable"]
        assert run.recorder.events[-1].severity == "critical"
        await fake.start()
        assert sorted(await run.recorder.kinds_after(2, 2)) == ["kubelet.reachable", "kubelet.restarted"]
        await run.quiet_cycle()
        assert run.recorder.kinds().count("kubelet.unreachable") == 1


async def test_list_only_mode_when_allocatable_is_disabled(fake: FakeKubelet, short_tmp: Path) -> None:
    fake.faults.disable("GetAllocatableResources")
    async with await _started(fake, short_tmp) as run:
        kinds = await run.recorder.kinds_after(0, 2)
        assert kinds == ["watcher.started", "api.degraded"]
        assert "free capacity per resource and NUMA node" in run.recorder.events[1].details["lost"]
        mark = len(run.recorder.events)
        fake.allocate("team", "job-2", "main", devices={NIC: ["0000:86:02.2"]})
        await run.recorder.kinds_after(mark, 2)
        await run.quiet_cycle()
        # Allocations are still seen; capacity only as "allocated" (allocatable unknown).
        assert run.recorder.kinds(mark) == ["allocation.added", "capacity.changed"]
        capacity = run.recorder.events[-1].details
        assert capacity["after"]["allocatable"] is None
        assert capacity["before"]["allocated"] + 1 == capacity["after"]["allocated"]


async def test_rate_limited_queries_back_off_and_nothing_is_lost(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    # A kubelet whose shared bucket other clients have nearly drained.
    fake = await start_kubelet(rate=4, burst=2)
    async with _agent(fake, short_tmp, max_rpc_rate=50) as run:
        await run.recorder.kinds_after(0, 1, timeout=20)
        mark = len(run.recorder.events)
        for _ in range(5):
            run.agent.wake("burst", urgent=True)
            await asyncio.sleep(0)
        fake.add_device(GPU, "GPU-x", (0,))
        await run.recorder.kinds_after(mark, 2, timeout=20)
        await run.quiet_cycle(timeout=20)
        assert sorted(run.recorder.kinds(mark)) == ["capacity.changed", "device.added"]
        assert fake.rejected > 0
        assert run.agent.metrics.value("requeries_total", result="rate_limited") > 0
        # Backing off, not hammering: without backoff the 50/s cap alone would
        # let about 50 calls a second into a bucket that refills 4/s.
        assert fake.rejected < 15


async def test_own_rpc_rate_is_capped(fake: FakeKubelet, short_tmp: Path) -> None:
    async with await _started(fake, short_tmp, max_rpc_rate=5) as run:
        await run.recorder.kinds_after(0, 1)
        before = sum(fake.calls.values())
        started = time.monotonic()
        for _ in range(8):
            await run.quiet_cycle()
        elapsed = time.monotonic() - started
        calls = sum(fake.calls.values()) - before
        assert calls == 16
        # 5/s sustained with a burst of 2 (one re-query): 16 calls need >= (16 - 2) / 5 s.
        assert elapsed >= (calls - 2) / 5 * 0.9
        # And as the kubelet sees them: no window of one second holds more than 5 arrivals.
        arrivals = list(fake.call_times)[-calls:]
        assert max(bisect.bisect_left(arrivals, t + 1.0) - i for i, t in enumerate(arrivals)) <= 5


MAX_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


@contextlib.contextmanager
def _no_new_inotify_instances() -> Iterator[None]:
    """Make inotify_init fail for this user, as on a node whose agents used up the limit.

    Setting the per-user limit to 0 (root only) is deterministic where using up
    the instances is not: another thread may release one at any moment. The
    old value is restored however the test ends.
    """
    if os.geteuid() != 0 or not os.access(MAX_INSTANCES, os.W_OK):
        pytest.skip("needs root to lower fs.inotify.max_user_instances")
    old = MAX_INSTANCES.read_text()
    atexit.register(MAX_INSTANCES.write_text, old)  # even if the test run is killed mid-way
    MAX_INSTANCES.write_text("0\n")
    try:
        yield
    finally:
        MAX_INSTANCES.write_text(old)
        atexit.unregister(MAX_INSTANCES.write_text)


@pytest.mark.chaos  # the host's limit, for every process: alone in `make chaos` (CI runs both)
async def test_falls_back_to_polling_when_inotify_is_exhausted(fake: FakeKubelet, short_tmp: Path) -> None:
    with _no_new_inotify_instances():
        await _falls_back_to_polling(fake, short_tmp)


async def test_falls_back_to_polling_when_this_process_gets_no_inotify(
    fake: FakeKubelet, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above in `make test`, where other tests run beside it: the kernel's refusal is made
    in this process only (lowering the host's limit would refuse theirs too)."""
    real = watching.RustNotify

    def refused(paths: list[str], debug: bool, force_polling: bool, *rest: Any) -> Any:
        if not force_polling:
            raise OSError(errno.EMFILE, "Too many open files (os error 24)")
        return real(paths, debug, force_polling, *rest)

    monkeypatch.setattr(watching, "RustNotify", refused)
    await _falls_back_to_polling(fake, short_tmp)


async def _falls_back_to_polling(fake: FakeKubelet, short_tmp: Path) -> None:
    await fake.start()
    with capture_logs() as logs:
        # The Pods API off: its reconnect would find the restart first, by the socket's identity.
        settings = make_settings(short_tmp, poll_interval=0.05, pods_api=False)
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            mark = len(run.recorder.events)
            await fake.restart()
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
            assert run.recorder.events[-1].details["seen_by"] == "directory watch"
    # One watch for every directory: one fallback, naming all it serves.
    fallbacks = [e for e in logs if e["event"] == "inotify limits exhausted, falling back to polling"]
    assert len(fallbacks) == 1
    assert set(fallbacks[0]["watches"]) == {"socket", "device-plugins", "kubelet-root"}


def test_run_stops_cleanly_on_sigterm_and_sigint(short_tmp: Path) -> None:
    """The real command: events on stdout, a clean exit on each signal."""
    root = short_tmp / "kubelet"
    with fake_kubelet_process(root):
        config = short_tmp / "watcher.toml"
        config.write_text(
            f'node = "node-a"\nstate_dir = "{short_tmp / "state"}"\n'
            f'[kubelet]\nsocket = "{root / "pod-resources" / "kubelet.sock"}"\nroot_dir = "{root}"\n'
            '[http]\nlisten = "127.0.0.1:0"\n'
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            agent = subprocess.Popen(
                [sys.executable, "-m", "watcher", "run", "--config", str(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert agent.stdout is not None
            first = json.loads(agent.stdout.readline())
            assert first["kind"] == "watcher.started"
            agent.send_signal(sig)
            started = time.monotonic()
            _, err = agent.communicate(timeout=15)
            assert agent.returncode == 0, err
            assert time.monotonic() - started < 10
            assert "watcher stopped" in err
            assert "Traceback" not in err


async def test_chmod_of_the_socket_is_not_a_restart(fake: FakeKubelet, short_tmp: Path) -> None:
    async with await _started(fake, short_tmp) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        fake.socket_path.chmod(0o700)  # a new ctime, the same socket
        await run.quiet_cycle()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == []
        assert run.agent.metrics.value("reconnects_total") == 1  # the first connection only


async def test_list_disabled_is_reported_once_and_the_agent_keeps_trying(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    fake.faults.disable("List")
    async with await _started(fake, short_tmp, interval=0.2) as run:
        kinds = await run.recorder.kinds_after(0, 2)
        assert kinds == ["watcher.started", "api.degraded"]
        assert run.recorder.events[1].severity == "critical"
        assert run.recorder.events[1].details["method"] == "List"
        fake.faults.enable("List")
        await run.recorder.until(lambda: run.queries_ok() > 0)
        await run.quiet_cycle()
        assert run.recorder.kinds().count("api.degraded") == 1


@pytest.mark.parametrize(
    ("old", "new", "name_events", "replaced"),
    [
        ((1, 10, 100, 100), (1, 11, 200, 200), False, True),  # another inode
        ((1, 10, 100, 100), (1, 10, 200, 200), False, True),  # ext4 reused the inode: new mtime
        ((1, 10, 100, 100), (1, 10, 200, 100), True, True),  # same mtime, but the name was replaced
        ((1, 10, 100, 100), (1, 10, 200, 100), False, False),  # chmod/chown/relabel: ctime only
        ((1, 10, 100, 100), (1, 10, 100, 100), True, False),  # unchanged
    ],
)
def test_restart_decision(
    old: tuple[int, int, int, int], new: tuple[int, int, int, int], name_events: bool, replaced: bool
) -> None:
    assert is_replacement(FileIdentity(*old), FileIdentity(*new), name_events=name_events) is replaced


async def test_an_answer_is_dropped_only_when_another_socket_took_the_path_meanwhile(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """The check after each query (a kubelet replaced while we asked): another socket at the path
    counts; none, something that is not a socket, or the same socket chmod-ed does not."""
    path = short_tmp / "kubelet.sock"
    assert not replaced_since(None, path)  # nothing there
    path.write_text("")
    assert not replaced_since(None, path)  # not a socket: the socket watch says so, not this
    path.unlink()
    first = await start_kubelet(root=short_tmp, seed=1)
    assert replaced_since(None, first.socket_path)  # the first socket, unseen before
    seen = probe_socket(first.socket_path).identity
    first.socket_path.chmod(0o700)
    assert not replaced_since(seen, first.socket_path)
    await first.restart()
    assert replaced_since(seen, first.socket_path)


async def test_reconnects_at_once_even_after_failing_queries_during_the_downtime(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    """gRPC shares subchannels (and their reconnect backoff) between channels unless told not
    to: a fresh channel after many failures waited out the old backoff, seconds, in the benchmark."""
    async with await _started(fake, short_tmp) as run:
        await run.recorder.kinds_after(0, 1)
        await fake.stop()
        for _ in range(8):
            failed = run.agent.metrics.value("requeries_total", result="failed")
            run.agent.wake("probe")
            await run.recorder.until(
                lambda f=failed: run.agent.metrics.value("requeries_total", result="failed") > f
            )
            await asyncio.sleep(0.5)  # the old subchannel's backoff grows with time between attempts
        await fake.start()
        assert fake.started_at is not None
        await run.recorder.until(lambda: fake.first_call_at is not None)
        assert fake.first_call_at is not None
        assert fake.first_call_at - fake.started_at < 1.0


async def test_a_dra_state_change_triggers_a_requery(fake: FakeKubelet, short_tmp: Path) -> None:
    async with await _started(fake, short_tmp, interval=3600) as run:
        await run.recorder.kinds_after(0, 1)
        cycles = len(run.recorder.reasons)
        tmp = fake.root / "dra_manager_state.tmp"
        tmp.write_text("{}")
        tmp.rename(fake.root / "dra_manager_state")  # as the kubelet writes it: temp + rename
        await run.recorder.until(
            lambda: any("state-file:dra_manager_state" in rs for rs in run.recorder.reasons[cycles:])
        )


async def test_the_outage_is_timed_from_the_socket_going_away_and_said_in_words(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    grace = 1.0
    async with await _started(fake, short_tmp, unreachable_grace=grace, interval=3600) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        gone = time.monotonic()
        await fake.stop(remove_socket=True)
        assert await run.recorder.kinds_after(1, 1, timeout=10) == ["kubelet.unreachable"]
        assert time.monotonic() - gone < grace + 1.0  # not a timer period later
        unreachable = run.recorder.events[-1]
        assert unreachable.summary.endswith("its socket is gone")
        assert "Error" not in unreachable.summary
        await fake.start()
        came_back = time.monotonic()
        assert "kubelet.reachable" in await run.recorder.kinds_after(2, 2)
        (reachable,) = [e for e in run.recorder.events if e.kind == "kubelet.reachable"]
        assert abs(reachable.details["down_seconds"] - (came_back - gone)) < 0.5


async def test_invalid_utf8_in_a_device_id_is_repaired_not_a_blind_agent(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    """One bad byte chosen by a device plugin: the answer is repaired, reported once, and every
    other change keeps flowing; never kubelet.unreachable."""
    async with await _started(fake, short_tmp, unreachable_grace=0.5) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        fake.faults.substitute(b"GPU-evil", b"GPU\xffevil")
        fake.add_device(GPU, "GPU-evil", (0,))
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark))
        for _ in range(3):
            await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds.count("api.invalid_text") == 1 and "kubelet.unreachable" not in kinds
        (added,) = [e for e in run.recorder.events[mark:] if e.kind == "device.added"]
        assert added.details["device"] == "GPU\\xffevil"  # the same id on every answer
        assert [e.details["strings"] for e in run.recorder.events[mark:] if e.kind == "api.invalid_text"] == [
            ["GPU\\xffevil"]
        ]
        later = len(run.recorder.events)
        victim = next(i for r, i in fake.node.devices if r == GPU and i != "GPU-evil")
        fake.make_unhealthy(GPU, victim)
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(later))
        assert run.agent.kubelet_health.failing_since is None


async def test_a_restart_is_queried_at_once_even_after_failed_calls_at_the_stale_socket(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    """Calls at a kubelet that is down reach nobody: they must not spend the RPC budget that the
    re-query of its replacement needs (the cap is 5 calls a second)."""
    async with await _started(fake, short_tmp, max_rpc_rate=5.0) as run:
        await run.recorder.kinds_after(0, 1)
        await fake.stop()  # the stale socket stays
        for n in range(3):  # six calls that nobody answers, inside one second
            failed = run.agent.metrics.value("requeries_total", result="failed")
            run.agent.wake(f"probe-{n}", urgent=True)
            await run.recorder.until(
                lambda f=failed: run.agent.metrics.value("requeries_total", result="failed") > f
            )
        await fake.start()
        started = fake.started_at
        assert started is not None
        await run.recorder.until(lambda: fake.first_call_at is not None)
        # At once, not after the rate window the unanswered calls would have spent (up to ~1 s);
        # 0.6 s leaves room for a loaded machine running the suite in several workers.
        assert fake.first_call_at - started < 0.6
