"""The outbox at its bounds: batched audit writes, acks that cost the same at any depth, queues and
dead letters capped by count and by age (on a clock no wall-clock step moves), and no silent drop:
every drop is counted and logged, and the audit log records it as a gap that `audit verify` names.

Real SQLite files, the real file sink, the real dispatcher and workers, the real CLI. The clocks
are the outbox's seam (`Clocks`): a test steps the wall clock or the boot clock through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from testkit.dispatching import Deliveries, open_outbox
from testkit.dispatching import dispatching as running_dispatcher
from testkit.old_outboxes import HISTORY
from testkit.receivers import WebhookReceiver
from watcher.cli import main
from watcher.delivery.dispatcher import Dispatcher
from watcher.kubelet.decoding import Decoder
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.model.gaps import Gap
from watcher.ops.metrics import Metrics
from watcher.settings_file import parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import large_node
from watcher.sinks.audit import verify_files
from watcher.sinks.base import Sink
from watcher.sinks.file import FileSink, FileSinkSettings
from watcher.sinks.registry import build_sink
from watcher.store.ages import Clocks
from watcher.store.hooks import StoreHooks, install_hooks
from watcher.store.outbox import Caps, OutboxDatabase
from watcher.store.saved_state import StateRecord, StateWrite
from watcher.store.store import Store

GPU = "nvidia.com/gpu"
DAY = 86400.0
WEEK = 7 * DAY


def _events(first: int, last: int, cycle: str = "c") -> list[Event]:
    change = Change(
        Kind.DEVICE_ADDED, Severity.INFO, f"{GPU} GPU-x joined", {"resource": GPU, "device": "GPU-x"}
    )
    return [
        envelope(change, seq=s, node="n", cycle=cycle, before=None, after=None)
        for s in range(first, last + 1)
    ]


class FakeClocks:
    """A wall clock and a boot clock the test moves by hand."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.boot_id = "boot-1"
        self.boot = 1_000.0

    def clocks(self) -> Clocks:
        return Clocks(wall=lambda: self.wall, boot=lambda: (self.boot_id, self.boot))


@contextlib.asynccontextmanager
async def dispatching(store: Store, sinks: Sequence[Sink]) -> AsyncIterator[tuple[Dispatcher, Deliveries]]:
    """The real Dispatcher running its workers until the block ends, its sinks registered first."""
    await store.register([s.name for s in sinks])
    async with running_dispatcher(store, sinks, seed=5) as run:
        yield run.dispatcher, run.deliveries


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_outbox(tmp_path / "outbox.db") as outbox:
        yield outbox


def _log_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_bytes().splitlines()]


def _audit(log: Path, **settings: Any) -> FileSink:
    return FileSink(FileSinkSettings(name="audit", path=log, **settings), log)


async def _until_dropped(dispatcher: Dispatcher, store: Store, sink: str, count: int) -> None:
    """Apply the caps until `count` events went: while the blocked worker's attempt is in flight
    they wait for it, and nothing but the outcome says when it is done."""
    async with asyncio.timeout(10):
        while (await store.stats(sink)).dropped < count:
            await dispatcher.enforce_caps()
            await asyncio.sleep(0.01)


# --- 1. batching in the audit sink ---


async def test_a_burst_larger_than_a_batch_is_written_in_batches_once_in_order_and_verifies(
    tmp_path: Path, store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "audit.jsonl"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    burst = _events(1, 1234)
    await store.register(["audit"])
    await store.commit(burst, {"audit": [e.seq for e in burst]}, None)
    async with dispatching(store, [_audit(log)]) as (dispatcher, observed):
        await observed.wait_for(lambda o: len(o.seqs("delivered")) == 1234)
        # More while it runs: they follow, in the same chain.
        more = _events(1235, 1300, cycle="c2")
        await dispatcher.commit(more, None)
        await dispatcher.hand_over()
        await observed.wait_for(lambda o: len(o.seqs("delivered")) == 1300)
        stats = await store.stats("audit")
    # The worker handed the sink up to max_batch (500) events at a time, each acked at once.
    assert [len(seqs) for _, _, seqs in observed.seen[:3]] == [500, 500, 234]
    assert max(len(seqs) for _, _, seqs in observed.seen) <= 500
    assert (stats.depth, stats.delivered, stats.dropped) == (0, 1300, 0)
    # One fsync of the log per batch (not per event), and one head file per batch.
    log_syncs = [p for p in synced if p == os.path.realpath(log)]
    assert len(log_syncs) == len(observed.seen) < 10
    records = _log_lines(log)
    assert [r["event"]["seq"] for r in records] == list(range(1, 1301))
    assert [r["n"] for r in records] == list(range(1, 1301))
    assert main(["audit", "verify", str(log)]) == 0
    out = capsys.readouterr().out
    assert "OK: 1300 records intact (records 1..1300)" in out
    assert "matches the last record, 1300" in out


async def test_a_batch_sent_again_after_a_crash_is_written_once(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = _audit(log)
    assert (await sink.deliver(_events(1, 500))).delivered
    await sink.close()
    # The agent died before the ack: the next run sends the batch again, with what came after.
    sink = _audit(log)
    assert (await sink.deliver(_events(1, 700))).delivered
    await sink.close()
    assert [r["event"]["seq"] for r in _log_lines(log)] == list(range(1, 701))
    result = verify_files([log])
    assert result.complete and result.records == 700, result.problem


async def test_a_batch_crossing_the_rotation_size_keeps_one_chain(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = _audit(log, max_bytes=64 * 1024, keep=50)
    assert (await sink.deliver(_events(1, 600))).delivered
    await sink.close()
    files = sorted(tmp_path.glob("audit.jsonl*"))
    assert len(files) > 2
    result = verify_files(files)
    assert result.complete and result.records == 600, result.problem
    assert all(f.stat().st_size <= 64 * 1024 for f in files)


# --- 2. flat outbox costs ---


def _shape(statement: str) -> str:
    """A statement with its values taken out, to EXPLAIN each kind once."""
    return re.sub(r"'[^']*'|-?\b\d+(\.\d+)?(e-?\d+)?\b", "?", statement)


async def test_acks_commits_and_caps_search_indexes_and_never_scan_a_table(tmp_path: Path) -> None:
    connections: list[sqlite3.Connection] = []
    previous = install_hooks(StoreHooks(connected=connections.append))
    try:
        db = OutboxDatabase(tmp_path / "outbox.db")
        db.open()
    finally:
        install_hooks(previous)
    (conn,) = connections
    db.sinks.register(["slow", "fast"])
    backlog = _events(1, 3000)
    # The saved state, a row per pod: the traced commit below writes the one pod that changed.
    fake, decoder = FakeKubelet("/nonexistent", large_node(pods=50), seed=3), Decoder()
    before, _ = decoder.decode(
        fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()
    )
    db.queues.commit(
        backlog,
        {"slow": [e.seq for e in backlog], "fast": [e.seq for e in backlog[:10]]},
        StateRecord({"seq": 3000}, before),
    )
    fake.free("ns-4", "pod-4")
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    after, _ = decoder.decode(
        fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()
    )
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    # The hot paths: a worker takes and acks, a producer commits, caps drop, dead letters, gaps.
    assert db.queues.take("fast", 500, gaps=True)
    db.queues.ack("fast", list(range(1, 11)))
    db.queues.commit(_events(3001, 3002), {"fast": [3001, 3002]}, StateRecord({"seq": 3002}, after))
    assert db.last_state_write == StateWrite(pods_written=1, pods_deleted=1)
    db.queues.take("fast", 500)
    db.dead_letters.add("fast", [3001, 3002], 400, "bad request")
    db.caps.enforce("slow", Caps(100, WEEK, 10, WEEK), gaps=True)
    db.caps.enforce("fast", Caps(100, WEEK, 1, WEEK), gaps=True)
    gap = db.gaps.first("slow")
    assert gap is not None
    db.gaps.recorded("slow", gap)
    db.sinks.stats("slow")
    conn.set_trace_callback(None)
    plans: dict[str, list[str]] = {}
    for statement in traced:
        if statement.split()[0].upper() in {"BEGIN", "COMMIT", "ROLLBACK"}:
            continue
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}")]
        plans.setdefault(_shape(statement), plan)
    db.close()
    scans = {shape: plan for shape, plan in plans.items() if any(step.startswith("SCAN") for step in plan)}
    assert not scans, f"statements that scan a table: {scans}"
    # Nor count a sink's rows (a search over all of them): its depth is kept in its row.
    assert not [shape for shape in plans if "COUNT(" in shape.upper()]
    # The prune that used to scan the events table is among them, as one search per released seq.
    prunes = [shape for shape in plans if shape.startswith("DELETE FROM events")]
    assert prunes and all("NOT IN" not in shape for shape in prunes)


# --- 2. dead letters capped by count and by age, counted ---


async def test_dead_letters_over_their_cap_drop_the_oldest_and_are_counted(
    tmp_path: Path, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    async with WebhookReceiver(ok_status=400) as receiver:
        (cfg,) = parse_settings(
            {
                "sinks": {
                    "hook": {
                        "type": "webhook",
                        "url": receiver.url("/hook"),
                        "max_dead_letters": 5,
                        "rate": 1000,
                    }
                }
            }
        ).sinks
        sink = build_sink(cfg, node="n", state_dir=tmp_path, store=store)
        events = _events(1, 12)
        with structlog.testing.capture_logs() as logs:
            async with dispatching(store, [sink]) as (dispatcher, observed):
                await dispatcher.commit(events, None)
                await dispatcher.hand_over()
                await observed.wait_for(lambda o: o.seqs("dead_letter") == list(range(1, 13)))
                stats = await store.stats("hook")
                kept = [d.seq for d in await store.dead_letters("hook")]
    # The newest five are kept; the seven oldest went, each drop counted and logged with its seqs.
    assert kept == [8, 9, 10, 11, 12]
    assert (stats.dead, stats.dead_letters, stats.dead_dropped, stats.depth) == (12, 5, 7, 0)
    drops = [e for e in logs if e["event"].startswith("dead letters over their cap")]
    assert sorted(s for e in drops for s in range(e["first_seq"], e["last_seq"] + 1)) == list(range(1, 8))
    assert {e["reason"] for e in drops} == {"max_dead_letters"} and all(e["sink"] == "hook" for e in drops)
    metrics = Metrics()
    metrics.set_outbox({"hook": stats})
    assert metrics.value("dead_letters_dropped_total", sink="hook") == 7
    assert metrics.value("dead_letters", sink="hook") == 5
    assert main(["outbox", "list", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "DEAD-KEPT" in out and "DEAD-DROPPED" in out
    header, row = out.splitlines()[:2]
    assert header.split() == [
        "SINK",
        "QUEUED",
        "OLDEST",
        "DELIVERED",
        "DROPPED",
        "DEAD",
        "DEAD-KEPT",
        "DEAD-DROPPED",
        "DISABLED",
    ]
    assert row.split() == ["hook", "0", "-", "0", "0", "12", "5", "7", "-"]
    # The dead letters listed are the five kept.
    assert [line.split()[2] for line in out.splitlines() if line.startswith("hook ") and " seq " in line] == [
        "8",
        "9",
        "10",
        "11",
        "12",
    ]


def test_dead_letters_older_than_their_cap_age_are_dropped_by_the_boot_clock(tmp_path: Path) -> None:
    clock = FakeClocks()
    db = OutboxDatabase(tmp_path / "outbox.db", clocks=clock.clocks())
    db.open()
    caps = Caps(max_queue=100, max_age=30 * DAY, max_dead_letters=100, max_dead_letter_age=WEEK)
    db.queues.commit(_events(1, 4), {"hook": [1, 2, 3, 4]}, None)
    db.dead_letters.add("hook", [1, 2], 400, "bad")
    clock.boot += 5 * DAY
    db.dead_letters.add("hook", [3], 400, "bad")
    clock.wall += 30 * DAY  # the wall clock has nothing to do with it
    assert db.caps.enforce("hook", caps).dropped == []
    clock.boot += 2 * DAY + 1  # 1 and 2 are now a week old, 3 is two days old
    (drop,) = db.caps.enforce("hook", caps).dropped
    assert (drop.reason, drop.first, drop.last, drop.count) == ("max_dead_letter_age", 1, 2, 2)
    assert [d.seq for d in db.dead_letters.held("hook")] == [3]
    stats = db.sinks.stats("hook")
    assert (stats.dead, stats.dead_letters, stats.dead_dropped, stats.depth) == (3, 1, 2, 1)
    db.close()


# --- 2. max_age on a clock that no wall-clock step moves ---


def test_a_wall_clock_step_forward_expires_nothing_the_boot_clock_does(tmp_path: Path) -> None:
    clock = FakeClocks()
    db = OutboxDatabase(tmp_path / "outbox.db", clocks=clock.clocks())
    db.open()
    caps = Caps(max_queue=100, max_age=WEEK, max_dead_letters=100, max_dead_letter_age=WEEK)
    db.queues.commit(_events(1, 5), {"hook": [1, 2, 3, 4, 5]}, None)
    clock.boot += 60
    clock.wall += 8 * DAY  # NTP, a wrong RTC put right, an operator: the events are a minute old
    assert db.caps.enforce("hook", caps).dropped == []
    stats = db.sinks.stats("hook")
    assert stats.depth == 5 and stats.oldest_age == pytest.approx(60)
    clock.wall -= 30 * DAY  # and back: nothing gets younger or older either
    assert db.sinks.stats("hook").oldest_age == pytest.approx(60)
    clock.boot += WEEK  # a week really passed
    (drop,) = db.caps.enforce("hook", caps).dropped
    assert (drop.reason, drop.first, drop.last, drop.count) == ("max_age", 1, 5, 5)
    assert db.sinks.stats("hook").depth == 0 and db.queues.pending("hook") == []
    db.close()


def test_ages_carry_over_restarts_and_reboots_and_never_count_a_wall_clock_step(tmp_path: Path) -> None:
    clock = FakeClocks()
    path = tmp_path / "outbox.db"
    db = OutboxDatabase(path, clocks=clock.clocks())
    db.open()
    db.queues.commit(_events(1, 2), {"hook": [1, 2]}, None)
    db.close()
    # The agent was stopped for three days, the machine stayed up: the time counts.
    clock.boot += 3 * DAY
    clock.wall += 40 * DAY
    db = OutboxDatabase(path, clocks=clock.clocks())
    db.open()
    assert db.sinks.stats("hook").oldest_age == pytest.approx(3 * DAY)
    db.close()
    # A reboot: the boot clock starts again. The age carries on from the last saved reading (the
    # time the node was down is not counted, so it can only be late, never early) ...
    clock.boot_id, clock.boot = "boot-2", 12.0
    clock.wall -= 400 * DAY
    db = OutboxDatabase(path, clocks=clock.clocks())
    db.open()
    assert db.sinks.stats("hook").oldest_age == pytest.approx(3 * DAY)
    caps = Caps(max_queue=100, max_age=WEEK, max_dead_letters=100, max_dead_letter_age=WEEK)
    assert db.caps.enforce("hook", caps).dropped == []
    # ... and events queued now are younger than the ones from before the reboot.
    db.queues.commit(_events(3, 3), {"hook": [3]}, None)
    clock.boot += 4 * DAY + 1
    (drop,) = db.caps.enforce("hook", caps).dropped
    assert (drop.first, drop.last, drop.count) == (1, 2, 2)
    assert [e.seq for e in db.queues.pending("hook")] == [3]
    db.close()


def test_an_outbox_from_before_the_age_clock_keeps_its_rows_and_their_ages(tmp_path: Path) -> None:
    clock = FakeClocks()
    path = tmp_path / "outbox.db"
    old = sqlite3.connect(path)
    old.executescript(HISTORY[1])  # the first release: no ages, no gaps, no saved state
    events = _events(1, 3)
    old.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?)", [(e.seq, e.id, clock.wall, e.to_json()) for e in events]
    )
    old.executemany("INSERT INTO queue VALUES ('hook', ?, ?)", [(1, clock.wall - 3600), (2, clock.wall - 60)])
    old.execute("INSERT INTO dead_letters VALUES ('hook', 3, ?, 400, 'bad')", (clock.wall - 2 * DAY,))
    old.execute("INSERT INTO sinks (name, delivered, dead) VALUES ('hook', 7, 1)")
    old.commit()
    old.close()
    db = OutboxDatabase(path, clocks=clock.clocks())
    db.open()
    stats = db.sinks.stats("hook")
    assert (stats.depth, stats.delivered, stats.dead, stats.dead_letters) == (2, 7, 1, 1)
    assert stats.oldest_age == pytest.approx(3600)
    assert [e.seq for e in db.queues.pending("hook")] == [1, 2]
    caps = Caps(max_queue=100, max_age=3000, max_dead_letters=100, max_dead_letter_age=DAY)
    dropped = db.caps.enforce("hook", caps).dropped
    assert [(d.reason, d.first, d.last) for d in dropped] == [
        ("max_age", 1, 1),
        ("max_dead_letter_age", 3, 3),
    ]
    db.close()


# --- 2. what a worker has in flight ---


def test_the_caps_wait_for_the_batch_in_flight_then_drop_the_oldest(tmp_path: Path) -> None:
    db = OutboxDatabase(tmp_path / "outbox.db")
    db.open()
    caps = Caps(max_queue=2, max_age=WEEK, max_dead_letters=100, max_dead_letter_age=WEEK)
    db.queues.commit(_events(1, 5), {"hook": [1, 2, 3, 4, 5]}, None)
    batch = db.queues.take("hook", 1)
    assert isinstance(batch, list) and [e.seq for e in batch] == [1]
    # Seq 1 is being delivered: nothing is dropped while it may still arrive.
    waited = db.caps.enforce("hook", caps)
    assert waited.deferred and waited.dropped == [] and db.sinks.stats("hook").depth == 5
    db.queues.ack("hook", [1])  # it arrived: then the oldest beyond the cap go
    after = db.caps.enforce("hook", caps)
    assert not after.deferred and [(d.first, d.last, d.count) for d in after.dropped] == [(2, 3, 2)]
    stats = db.sinks.stats("hook")
    assert (stats.delivered, stats.dropped, stats.depth) == (1, 2, 2)
    db.close()


# --- 3. nothing dropped silently: the audit log records a gap ---


def test_drops_while_blocked_are_one_gap_and_one_extended_while_written_keeps_the_rest(
    tmp_path: Path,
) -> None:
    db = OutboxDatabase(tmp_path / "outbox.db")
    db.open()
    caps = Caps(max_queue=2, max_age=WEEK, max_dead_letters=100, max_dead_letter_age=WEEK)

    def commit(first: int, last: int) -> None:
        db.queues.commit(_events(first, last), {"audit": list(range(first, last + 1))}, None)
        db.caps.enforce("audit", caps, gaps=True)

    commit(1, 5)
    commit(6, 7)  # nothing queued lies between the two drops: one gap, 1..5
    gap = db.queues.take("audit", 500, gaps=True)
    assert isinstance(gap, Gap) and (gap.first, gap.last, gap.count, gap.reasons) == (1, 5, 5, ("max_queue",))
    commit(8, 9)  # dropped while the gap is being written: it grows
    db.gaps.recorded("audit", gap)  # what was written goes; what was added stays, as its own gap
    rest = db.queues.take("audit", 500, gaps=True)
    assert isinstance(rest, Gap) and (rest.first, rest.last, rest.count) == (6, 7, 2)
    db.gaps.recorded("audit", rest)
    events = db.queues.take("audit", 500, gaps=True)
    assert isinstance(events, list) and [e.seq for e in events] == [8, 9]
    db.queues.ack("audit", [8, 9])
    assert db.gaps.first("audit") is None
    stats = db.sinks.stats("audit")
    assert (stats.dropped, stats.delivered, stats.depth) == (7, 2, 0)
    # A sink that keeps no stream of its own gets no gap rows: its drops are counted and logged.
    db.queues.commit(_events(10, 14), {"hook": [10, 11, 12, 13, 14]}, None)
    assert [d.count for d in db.caps.enforce("hook", caps).dropped] == [3]
    assert db.gaps.first("hook") is None and db.sinks.stats("hook").dropped == 3
    db.close()


async def test_a_blocked_audit_log_over_its_cap_records_a_gap_that_verify_names(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(short_tmp / "outbox.db")
    await store.open()
    log = short_tmp / "audit.jsonl"
    elsewhere = short_tmp / "elsewhere"
    elsewhere.write_text("")
    log.symlink_to(elsewhere)  # refused: the sink is blocked, its events stay queued
    sink = _audit(log, max_queue=5, retry_max_delay=0.05)
    try:
        with structlog.testing.capture_logs() as logs:
            async with dispatching(store, [sink]) as (dispatcher, observed):
                await dispatcher.commit(_events(1, 20), None)
                await dispatcher.hand_over()
                await _until_dropped(dispatcher, store, "audit", 15)
                log.unlink()  # the operator fixes it
                await observed.wait_for(lambda o: o.seqs("delivered") == [16, 17, 18, 19, 20])
                stats = await store.stats("audit")
    finally:
        await store.close()
    assert elsewhere.read_text() == ""
    assert (stats.depth, stats.dropped, stats.delivered) == (0, 15, 5)
    records = _log_lines(log)
    assert [r.get("gap") for r in records[:1]] == [
        {"first": 1, "last": 15, "dropped": 15, "reasons": ["max_queue"], "time": records[0]["gap"]["time"]}
    ]
    assert [r["event"]["seq"] for r in records[1:]] == [16, 17, 18, 19, 20]
    (drop,) = [e for e in logs if e["event"].startswith("sink queue over its cap")]
    assert (drop["first_seq"], drop["last_seq"], drop["dropped"], drop["gap_recorded"]) == (1, 15, 15, True)
    result = verify_files([log])
    assert result.ok and not result.complete and result.records == 6
    assert [(g.n, g.gap.first, g.gap.last, g.gap.count) for g in result.gaps] == [(1, 1, 15, 15)]
    assert main(["audit", "verify", str(log)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("GAPS: 6 records intact (records 1..6), but 1 gap record(s): 15 event(s)")
    assert (
        "gap: record 1 at " in out and "seq 1..15: 15 events dropped by the queue's caps (max_queue)" in out
    )
    assert "OK" not in out


async def test_events_older_than_max_age_become_a_gap_the_wall_clock_cannot_cause(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClocks()
    store = Store(short_tmp / "outbox.db", clocks=clock.clocks())
    await store.open()
    log = short_tmp / "audit.jsonl"
    elsewhere = short_tmp / "elsewhere"
    elsewhere.write_text("")
    log.symlink_to(elsewhere)
    sink = _audit(log, max_age=3600, retry_max_delay=0.05)
    try:
        async with dispatching(store, [sink]) as (dispatcher, observed):
            await dispatcher.commit(_events(1, 10), None)
            clock.wall += 30 * DAY  # a wall-clock step: no event is older for it
            await dispatcher.commit(_events(11, 11, cycle="c2"), None)
            await dispatcher.hand_over()
            assert (await store.stats("audit")).dropped == 0
            clock.boot += 3601  # an hour on the boot clock: 1..11 are all too old now
            await dispatcher.commit(_events(12, 13, cycle="c3"), None)
            await _until_dropped(dispatcher, store, "audit", 11)
            log.unlink()
            await observed.wait_for(lambda o: o.seqs("delivered") == [12, 13])
    finally:
        await store.close()
    records = _log_lines(log)
    assert records[0]["gap"]["reasons"] == ["max_age"]
    assert (records[0]["gap"]["first"], records[0]["gap"]["last"], records[0]["gap"]["dropped"]) == (
        1,
        11,
        11,
    )
    assert [r["event"]["seq"] for r in records[1:]] == [12, 13]
    assert main(["audit", "verify", str(log)]) == 3
    assert "seq 1..11: 11 events dropped by the queue's caps (max_age)" in capsys.readouterr().out


async def test_a_gap_the_log_already_covers_is_left_out_or_cut_to_what_is_missing(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = _audit(log)
    assert (await sink.deliver(_events(1, 5))).delivered
    # Written, then dropped before the ack (the agent stopped between the two): not a gap.
    assert (await sink.record_gap(Gap(2, 5, 4, ("max_queue",), "2027-01-01T00:00:00.000Z"))).delivered
    assert len(_log_lines(log)) == 5
    # Partly written: only what the log lacks is named.
    assert (await sink.record_gap(Gap(4, 9, 6, ("max_queue",), "2027-01-01T00:00:00.000Z"))).delivered
    await sink.close()
    gap = _log_lines(log)[-1]["gap"]
    assert (gap["first"], gap["last"], gap["dropped"]) == (6, 9, 4)
    result = verify_files([log])
    assert result.ok and [(g.gap.first, g.gap.last) for g in result.gaps] == [(6, 9)]
