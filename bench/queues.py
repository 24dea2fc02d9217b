"""The sinks' queues under load: what one acknowledgement costs as a queue grows, an audit log
taking a burst, and a webhook's queue draining after its receiver was down.

Everything here is the agent's own code on real files: OutboxDatabase / Store (SQLite, WAL,
synchronous=FULL), the Dispatcher and its SinkWorkers, the file sink and the webhook sink as
`build_sinks` makes them from their settings; receivers are real aiohttp servers on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.receiver import Receiver
from testkit.dispatching import open_outbox
from testkit.ports import free_port
from testkit.waiting import wait_until
from watcher.delivery.dispatcher import Dispatcher
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.secrets import Secret
from watcher.sinks.base import BaseSinkSettings
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.registry import build_sinks
from watcher.sinks.webhook import WebhookSinkSettings
from watcher.store.outbox import OUTBOX_FILE, OutboxDatabase

__all__ = [
    "Ack",
    "AckTimes",
    "Audit",
    "AuditRun",
    "Drain",
    "Timing",
    "Verify",
    "bench_ack",
    "bench_audit",
    "bench_drain",
    "bench_events",
]

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-node"
# Events are committed in chunks like this, as a busy cycle's would be.
CHUNK = 500


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds, medians
    cpu: float


@dataclass(frozen=True)
class AckTimes:
    one: Timing  # acknowledging one event
    batch: Timing  # acknowledging a batch


@dataclass(frozen=True)
class Ack:
    batch: int  # the sinks' default max_batch
    reps: int
    depths: dict[int, AckTimes]  # by queue depth


@dataclass(frozen=True)
class Verify:
    """What `audit verify` said: its exit code, its first line, and the span of records it read."""

    rc: int
    says: str
    records: int
    first: int
    last: int


@dataclass(frozen=True)
class AuditRun:
    events: int
    delivered: int
    dropped: int
    left: int  # still queued when the budget ran out
    budget_s: float
    seconds: float
    per_s: float
    deepest: int
    verify: Verify
    max_queue: int
    batch: int
    fsync: str  # the file sink's fsync policy
    cpu_s: float = float("nan")  # the process's CPU time (every thread) over `seconds`


@dataclass(frozen=True)
class Audit:
    queued: AuditRun  # all queued, then the worker started
    burst: AuditRun  # committed over `spread_s`, the caps enforced
    spread_s: float


@dataclass(frozen=True)
class Drain:
    events: int
    queued_at_up: int
    dropped: int
    outage_s: float
    wait_s: float  # the worker's backoff, from the receiver's return to the first receipt
    drain_s: float
    per_s: float
    per_s_from_up: float
    retries: int


def bench_events(first_seq: int, count: int) -> list[Event]:
    """`count` device events from seq `first_seq` on, 50 to a cycle, as a churning node's."""
    out = []
    for seq in range(first_seq, first_seq + count):
        change = Change(
            Kind.DEVICE_REMOVED if seq % 2 else Kind.DEVICE_ADDED,
            Severity.WARNING if seq % 2 else Severity.INFO,
            f"vendor0.example.com/dev dev-0-{seq % 64} on NUMA node {seq % 8}",
            {"resource": "vendor0.example.com/dev", "device": f"dev-0-{seq % 64}", "numa": [seq % 8]},
        )
        out.append(envelope(change, seq=seq, node=NODE, cycle=f"c{seq // 50}", before=None, after=None))
    return out


# --- what one acknowledgement costs ---


def bench_ack(depths: Sequence[int], reps: int) -> Ack:
    """`OutboxDatabase.queues.ack` (which prunes what no sink needs any more) of one event and of one
    batch (the sinks' default max_batch), at each queue depth: wall time (fsync included, what
    a worker waits for) and this thread's CPU time, medians of `reps`. The queue is topped up
    after each ack (not timed), so every ack sees the same depth."""
    batch = BaseSinkSettings().max_batch
    out: dict[int, AckTimes] = {}
    for depth in depths:
        with tempfile.TemporaryDirectory(prefix="prw-b9a-", dir="/tmp") as tmp:
            db = OutboxDatabase(Path(tmp) / "state" / OUTBOX_FILE)
            db.open()
            db.sinks.register(["sink"])
            next_seq = 1

            def fill(count: int) -> None:
                nonlocal next_seq
                for start in range(0, count, CHUNK):
                    events = bench_events(next_seq, min(CHUNK, count - start))
                    db.queues.commit(events, {"sink": [e.seq for e in events]}, None)
                    next_seq += len(events)

            fill(depth)
            oldest = 1
            timed: dict[str, Timing] = {}
            for label, size in (("one", 1), ("batch", min(batch, depth))):
                walls: list[float] = []
                cpus: list[float] = []
                for _ in range(reps):
                    seqs = list(range(oldest, oldest + size))
                    t0, c0 = time.perf_counter(), time.thread_time()
                    db.queues.ack("sink", seqs)
                    cpus.append(time.thread_time() - c0)
                    walls.append(time.perf_counter() - t0)
                    oldest += size
                    fill(size)
                timed[label] = Timing(statistics.median(walls), statistics.median(cpus))
            assert db.sinks.stats("sink").depth == depth, "the queue did not keep its depth"
            db.close()
        out[depth] = AckTimes(timed["one"], timed["batch"])
    return Ack(batch, reps, out)


# --- an audit log taking a burst ---


class _Delivered:
    """Counts what a dispatcher's workers delivered, and when the last of it went."""

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.last_cpu = 0.0
        self.changed = asyncio.Event()

    def __call__(self, _sink: str, result: str, events: Sequence[Event], _seconds: float) -> None:
        if result == "delivered":
            self.count += len(events)
            self.last = time.monotonic()
            self.last_cpu = time.process_time()
        self.changed.set()


def audit_verify(log: Path) -> Verify:
    """`pod-resources-watcher audit verify` on the log and its rotated files, as an operator runs it."""
    files = [log, *sorted(log.parent.glob(log.name + ".[0-9]*"))]
    done = subprocess.run(
        [sys.executable, "-m", "watcher", "audit", "verify", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    says = done.stdout.strip().splitlines()[0] if done.stdout.strip() else done.stderr.strip()
    span = re.match(r"OK: (\d+) records intact \(records (\d+)\.\.(\d+)\)", says)
    records, first, last = (int(g) for g in span.groups()) if span else (0, 0, 0)
    return Verify(done.returncode, says, records, first, last)


async def _audit_run(root: Path, n: int, spread_s: float | None, budget_s: float) -> AuditRun:
    """`n` events through the file sink at its default settings. `spread_s` None: all queued
    before its worker starts (its own speed; no cap applies before the agent's next commit);
    else committed evenly over that many seconds, the queue caps enforced after every commit
    as the agent does. No longer than `budget_s` from the start."""
    state = root / "state"
    async with open_outbox(state / OUTBOX_FILE) as store:
        settings = FileSinkSettings(name="audit", path=state / "audit.jsonl")
        sinks = build_sinks([settings], node=NODE, state_dir=state, store=store)
        stop = asyncio.Event()
        dispatcher = Dispatcher(store, sinks, stop=stop)
        delivered = _Delivered()
        dispatcher.observers.append(delivered)
        await store.register(["audit"])
        deepest = 0
        task: asyncio.Task[None] | None = None
        try:
            if spread_s is None:
                for start in range(1, n + 1, CHUNK):
                    await dispatcher.commit(bench_events(start, min(CHUNK, n + 1 - start)), None)
                t0, cpu0 = time.monotonic(), time.process_time()
                task = asyncio.create_task(dispatcher.run())
                deepest = n
            else:
                task = asyncio.create_task(dispatcher.run())
                ticks = max(1, round(spread_s * 10))  # a commit every 100 ms
                per_tick = -(-n // ticks)
                t0, cpu0 = time.monotonic(), time.process_time()
                for i, start in enumerate(range(1, n + 1, per_tick)):
                    await asyncio.sleep(max(0.0, t0 + i * spread_s / ticks - time.monotonic()))
                    await dispatcher.commit(bench_events(start, min(per_tick, n + 1 - start)), None)
                    await dispatcher.hand_over()
                    deepest = max(deepest, (await store.stats("audit")).depth)

            # Until every event was delivered or dropped (the queue is empty), or the budget is spent
            # (a slow sink: then what it delivered by then is the figure, and the rest is left queued).
            deadline = t0 + budget_s
            while (stats := await store.stats("audit")).depth and time.monotonic() < deadline:
                delivered.changed.clear()
                # Drops tell no observer: look at the queue again now and then.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(delivered.changed.wait(), 0.5)
            count, last = delivered.count, delivered.last
        finally:
            stop.set()
            if task is not None:
                await task
            await dispatcher.close()
    elapsed = last - t0 if count else float("nan")
    return AuditRun(
        events=n,
        delivered=count,
        dropped=stats.dropped,
        left=stats.depth,
        budget_s=budget_s,
        seconds=elapsed,
        per_s=count / elapsed,
        deepest=deepest,
        verify=audit_verify(settings.path),
        max_queue=settings.max_queue,
        batch=dispatcher.workers["audit"].batch_size,
        fsync=settings.fsync,
        cpu_s=delivered.last_cpu - cpu0 if count else float("nan"),
    )


async def bench_audit(n: int, spread_s: float, budget_s: float = 60.0) -> Audit:
    """The audit log's own speed over `n` queued events, then `n` events arriving over
    `spread_s` seconds at the default caps."""
    runs = []
    for spread in (None, spread_s):
        with tempfile.TemporaryDirectory(prefix="prw-b9b-", dir="/tmp") as tmp:
            runs.append(await _audit_run(Path(tmp), n, spread, budget_s))
    return Audit(runs[0], runs[1], spread_s)


# --- a webhook's queue draining after an outage ---


async def bench_drain(n: int | None = None, outage_s: float = 2.0) -> Drain:
    """`n` events (default: a sink's default max_queue, a full queue) queued for a webhook
    whose receiver is down; once the worker has failed at least once and `outage_s` passed,
    the receiver comes up on that port. Events/s from its first receipt to its last, and how
    long the worker's retry backoff kept it waiting first."""
    n = n if n is not None else BaseSinkSettings().max_queue
    port = free_port()
    # As section 6 configures its webhook: batches of 500, 1,000 messages/s.
    settings = WebhookSinkSettings(
        name="hook", url=Secret(value=f"http://127.0.0.1:{port}/"), batch=True, max_batch=500, rate=1000
    )
    receiver = Receiver()
    server = receiver.server(port)  # started once the outage is over
    with tempfile.TemporaryDirectory(prefix="prw-b9c-", dir="/tmp") as tmp:
        state = Path(tmp) / "state"
        async with open_outbox(state / OUTBOX_FILE) as store:
            sinks = build_sinks([settings], node=NODE, state_dir=state, store=store)
            stop = asyncio.Event()
            dispatcher = Dispatcher(store, sinks, stop=stop)
            await store.register(["hook"])
            task = asyncio.create_task(dispatcher.run())
            try:
                down_since = time.monotonic()
                for start in range(1, n + 1, CHUNK):
                    await dispatcher.commit(bench_events(start, min(CHUNK, n + 1 - start)), None)
                    await dispatcher.hand_over()
                worker = dispatcher.workers["hook"]
                await wait_until(lambda: worker.counts["retry"] >= 1, 30, what="the worker retried")
                await asyncio.sleep(max(0.0, down_since + outage_s - time.monotonic()))
                queued = (await store.stats("hook")).depth
                await server.start()
                up = time.monotonic()
                await receiver.until(lambda: receiver.count >= n, max(120.0, n / 100))
                dropped = (await store.stats("hook")).dropped
            finally:
                stop.set()
                await task
                await dispatcher.close()
                await server.close()
    first, last = min(receiver.ids.values()), max(receiver.ids.values())
    return Drain(
        events=n,
        queued_at_up=queued,
        dropped=dropped,
        outage_s=up - down_since,
        wait_s=first - up,
        drain_s=last - first,
        per_s=n / (last - first) if last > first else float("inf"),
        per_s_from_up=n / (last - up),
        retries=worker.counts["retry"],
    )
