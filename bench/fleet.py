"""A fleet into NATS JetStream, beside the same load through the webhook sink into one receiver
(`bench/run.py --only fleet`; BENCHMARKS.md, section 10).

Many simulated nodes play the event streams a real fleet's agents would send, through the sinks'
own delivery code, into a real 3-node JetStream cluster on loopback (`tests/nats_cluster.py`:
three `nats-server` processes, a stream with 3 replicas on file storage, created by the sink's own
`ensure_stream` with its defaults):

- Events are the agent's own. Each simulated node walks a script of re-query results made by the
  agent's model: real inventories of the simulated kubelet's node (`watcher.sim`) diffed by
  `watcher.model.diff`, so each step yields exactly the changes the agent would report (a GPU or
  a NIC allocated to a pod and freed, a free GPU failing and healing: each a device or allocation
  event plus the resource's capacity.changed), wrapped by `envelope` with the node's name and one
  increasing `seq` per node. The burst: a share of the nodes each lose a GPU that a pod holds, at
  the same instant (device.removed, critical, and capacity.changed).
- Rate: about 10 events/s per 1,000 nodes at steady state (a node changes every ~200 s), as
  Poisson arrivals of re-queries over the whole fleet, then the burst.
- Delivery as the agent's worker does it: each node has its own queue, and its own nats sink:
  a whole `NatsSink` (its `deliver`: its own connection, the stream checked, the nats sink's
  `Publisher` with `max_in_flight` 1 and the publish timeout at their defaults, a fresh JetStream
  context after a failed publish, nothing published while reconnecting); or a `WebhookSink`
  (`deliver`, batch on; see below). Everything queued, up to the sink's default `max_batch`, goes
  in one delivery; what is not `done` is sent again after the worker's backoff (full jitter from
  0.5 s, doubling), until it is (bounded: events still unsent after `give_up_s` count as lost).
  The delivery worker's rate limit and the outbox are not in the loop: what is measured is the
  sink's publishing and the cluster. Each node starts as an agent does, before the clock: its
  first delivery (watcher.started) connects its sink, checks the stream and publishes.
- Connections: a real fleet has one connection per node, and so has each simulated node here
  when the fleet is no larger than `max_connections` (10,000 in the full run: starting them takes
  seconds and a few hundred MiB of this process, measured and reported); beyond that, nodes share
  connections round-robin, each with its own JetStream context and `Publisher` made as the sink
  makes them (`SharedPublisher`), and the report says how many connections there were. The
  sustained-capacity rows say theirs. What is set up before the clock starts is frozen out of the
  garbage collector's sight (`gc.freeze`): a full collection rescanning 10,000 clients would stop
  this process for most of a second, which no agent (one connection) ever does.
- The reader: a durable pull consumer (each message acknowledged as it arrives) in this same
  process, on a connection of its own, with pull requests kept topped up, records when each event
  id first arrives. Publish to consumer: from the moment the node's worker first handed the event
  to its sink's delivery to its arrival there, on the same monotonic clock.
  Consumer lag: the stream's last sequence minus the consumer's acknowledgement floor, sampled
  every 250 ms; the maximum of each phase and the value once everything was read.
- Sustained capacity: simulated nodes deliver full `max_batch` batches back to back; after a
  warm-up, what the stream holds (stream info, i.e. what the cluster stored) is counted over a
  fixed window. The nodes' events are made before the clock starts (enough for STOCK_RATE
  events/s; a node that runs out makes more as it goes, and the report counts them): an agent
  builds its events in its own cycle on its own node, and one process building envelopes for
  hundreds of simulated nodes would time the simulation, not the sink. A Python process uses
  one core at most, and one generator process tops out near the goal by itself, so a row may
  split its nodes and connections over generator processes (this module's `flood` command); the CPU of the generators and of the three servers (utime + stime,
  /proc) over the window shows where the two cores went. Each row is a lower bound of what the
  cluster takes; the goal is judged on the best row at the sink's defaults (max_in_flight 1).
  When it is not met, that row is run again briefly in this process under cProfile and the top
  entries are reported (likewise the latency run, if its goal is not met).
- Leader kill: during a run (1,000 nodes, 50x the realistic rate, so many publishes are in
  flight), the stream's leader is killed with SIGKILL and restarted on its store later. Every
  node retries until its events are stored; then the whole stream is read back: lost (ids sent
  but absent), duplicated (ids stored twice), and out of order (a node's seq going backwards in
  stream order). The longest publish stall: from an event's first attempt to its acknowledgement
  (the worker's backoff included); and the longest time in which nothing at all was acknowledged.
- Webhook side by side: the same 1,000-node load and burst through `WebhookSink.deliver` (`batch`
  on, the webhook's best case) into ONE aiohttp receiver on loopback (bench/receiver.py) in this
  process, and its capacity the same way. The nodes share 100 sinks (each an aiohttp session with
  up to 4 connections), made before the clock starts: a session's first use builds its TLS context
  (tens of ms of CPU, even for http://), which an agent pays once when it starts, and a thousand
  of them would cost this process half a minute.

Everything shares this machine's cores: the three servers, the generator and the reader. The
figures are therefore a floor for a cluster on machines of its own, and the split of CPU is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import io
import itertools
import json
import math
import pstats
import random
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.receiver import Receiver, serve
from bench.report import FLEET_CAPACITY_GOAL, FLEET_P99_GOAL, capacity_goal_row, pct
from bench.steady import cpu_seconds
from testkit.nats_cluster import NatsCluster, running_cluster
from watcher.backoff import Backoff
from watcher.model import lifecycle
from watcher.model.build import build
from watcher.model.changes import Change
from watcher.model.diff import diff
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.model.inventory import Inventory
from watcher.ops.logs import configure_logging
from watcher.secrets import Secret
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sinks.base import BaseSinkSettings, Sink
from watcher.sinks.nats import (
    NatsSink,
    NatsSinkSettings,
    Publisher,
    StreamError,
    connect,
    ensure_stream,
    publisher_for,
)
from watcher.sinks.webhook import WebhookSink, WebhookSinkSettings

__all__ = ["FULL", "QUICK", "FleetPlan", "Script", "bench_fleet", "script"]

ROOT = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
# The worker's retry backoff (watcher/delivery/worker.py): full jitter from 0.5 s, doubling, up
# to the sinks' default retry_max_delay.
RETRY = Backoff(base=0.5, cap=BaseSinkSettings().retry_max_delay, rng=random.Random(17))
LAG_EVERY = 0.25
PULL_EVERY = 0.02


@dataclass(frozen=True)
class CapacityRow:
    """One sustained-capacity run: `nodes` publishing back to back over `connections`, in
    `processes` generator processes (one Python process uses one core at most)."""

    nodes: int
    connections: int
    max_in_flight: int = 1
    processes: int = 1


@dataclass(frozen=True)
class FleetPlan:
    fleets: tuple[int, ...] = (1_000, 10_000)
    steady_s: float = 20.0
    per_node_rate: float = 0.01  # events/s per node: 10 per 1,000 nodes
    burst_share: float = 0.10
    max_connections: int = 10_000
    capacity: tuple[CapacityRow, ...] = (
        CapacityRow(200, 16),
        CapacityRow(200, 16, processes=2),
        CapacityRow(200, 16, max_in_flight=16),
        CapacityRow(1_000, 1_000),
    )
    warmup_s: float = 1.0  # before the capacity window opens
    capacity_s: float = 10.0
    # Runs of each capacity row; the row reports the median run. One run's figure varies by
    # a fifth or more on a 2-core machine that the three servers share with the generators.
    capacity_runs: int = 3
    failover_nodes: int = 1_000
    failover_rate: float = 500.0  # events/s over the fleet: 50x the realistic rate
    failover_s: float = 15.0
    kill_at: float | None = 4.0  # None: no kill (the harness test's smoke run)
    down_s: float = 5.0
    webhook_nodes: int = 1_000
    webhook_sinks: int = 100  # nodes share them beyond this (each sink: one aiohttp session)
    give_up_s: float = 60.0
    profile_s: float = 5.0  # 0: no profile of a goal not met
    quick: bool = False


FULL = FleetPlan()
# A smoke run: every part once, tiny (the harness test runs it); not for the record.
QUICK = FleetPlan(
    fleets=(40, 120),
    steady_s=1.0,
    per_node_rate=0.5,
    burst_share=0.10,
    max_connections=80,
    capacity=(CapacityRow(20, 4), CapacityRow(20, 4, processes=2), CapacityRow(40, 40)),
    warmup_s=0.3,
    capacity_s=1.0,
    capacity_runs=1,
    failover_nodes=40,
    failover_rate=100.0,
    failover_s=6.0,
    kill_at=1.0,
    down_s=2.0,
    webhook_nodes=40,
    webhook_sinks=10,
    give_up_s=30.0,
    profile_s=0.0,
    quick=True,
)


# --- the events: the agent's model on the simulated kubelet's node ---


@dataclass(frozen=True)
class Cycle:
    """One re-query's changes on a node, with the inventory hashes before and after it."""

    changes: tuple[Change, ...]
    before: str
    after: str


@dataclass(frozen=True)
class Script:
    start: Cycle  # watcher.started: an agent's first event
    steady: tuple[Cycle, ...]  # each node plays these in turn, from a random step
    burst: Cycle  # a GPU that a pod holds fails

    @property
    def mean_events(self) -> float:
        return sum(len(c.changes) for c in self.steady) / len(self.steady)


def script() -> Script:
    """Real inventories of the simulated node, diffed by the agent's model."""
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)

    def inventory() -> Inventory:
        return build(fake.allocatable_response(), fake.list_response())

    held = {
        (res, dev)
        for pod in fake.node.pods.values()
        for c in pod.containers
        for res, devs in c.devices.items()
        for dev in devs
    }
    free = {
        res: [d for (r, d) in sorted(fake.node.devices) if r == res and (r, d) not in held]
        for res in (GPU, NIC)
    }
    gpu_a, gpu_b, nic = free[GPU][0], free[GPU][1], free[NIC][0]
    steps: list[Callable[[], None]] = [
        lambda: fake.allocate("batch", "train-1", "main", devices={GPU: [gpu_a]}),
        lambda: fake.make_unhealthy(GPU, gpu_b),
        lambda: fake.allocate("net", "router-2", "app", devices={NIC: [nic]}),
        lambda: fake.heal(GPU, gpu_b),
        lambda: fake.free("batch", "train-1"),
        lambda: fake.free("net", "router-2"),
    ]
    base = inventory()
    start = Cycle(
        (lifecycle.started(base, baseline="fresh", changes=0, error=None),),
        base.content_hash,
        base.content_hash,
    )
    steady = []
    before = base
    for step in steps:
        step()
        after = inventory()
        steady.append(Cycle(diff(before, after), before.content_hash, after.content_hash))
        before = after
    assert before.content_hash == base.content_hash, "the steady script must come back to its start"
    holder = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
    fake.make_unhealthy(GPU, holder)
    failed = inventory()
    burst = Cycle(diff(base, failed), base.content_hash, failed.content_hash)
    assert all(c.changes for c in steady), "every scripted step is a change"
    assert burst.changes, "the failed GPU is a change"
    return Script(start, tuple(steady), burst)


# --- simulated nodes and their deliveries ---

# A delivery: the events, in order -> (how many were stored, of them duplicates, the error).
Send = Callable[[Sequence[Event]], Awaitable[tuple[int, int, str]]]


class SimNode:
    def __init__(self, name: str, send: Send, step: int) -> None:
        self.name = name
        self.send = send
        self.seq = 0
        self.step = step
        self.queue: list[Event] = []
        self.task: asyncio.Task[None] | None = None

    def events(self, cycle: Cycle) -> list[Event]:
        cycle_id = new_cycle_id()
        out = []
        for change in cycle.changes:
            self.seq += 1
            out.append(
                envelope(
                    change,
                    seq=self.seq,
                    node=self.name,
                    cycle=cycle_id,
                    before=cycle.before,
                    after=cycle.after,
                )
            )
        return out


@dataclass
class Ledger:
    """Per event id (monotonic clock): made, first handed to its sink, stored, received."""

    created: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    stored: dict[str, float] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    abandoned: int = 0
    errors: Counter[str] = field(default_factory=Counter)


class Fleet:
    """Simulated nodes, each delivering its own queue as the agent's worker does."""

    def __init__(self, plan: FleetPlan, play: Script, ledger: Ledger, *, max_batch: int, seed: int) -> None:
        self.plan = plan
        self.script = play
        self.ledger = ledger
        self.max_batch = max_batch
        self.rng = random.Random(seed)
        self.nodes: list[SimNode] = []
        self.busy = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, name: str, send: Send) -> SimNode:
        node = SimNode(name, send, self.rng.randrange(len(self.script.steady)))
        self.nodes.append(node)
        return node

    def change(self, node: SimNode, cycle: Cycle | None = None) -> list[Event]:
        """`node` re-queried and found `cycle` (its next scripted step by default)."""
        if cycle is None:
            cycle = self.script.steady[node.step % len(self.script.steady)]
            node.step += 1
        events = node.events(cycle)
        now = time.monotonic()
        for e in events:
            self.ledger.created[e.id] = now
        node.queue.extend(events)
        if node.task is None:
            self.busy += 1
            self.idle.clear()
            node.task = asyncio.create_task(self._deliver(node))
        return events

    async def _deliver(self, node: SimNode) -> None:
        ledger = self.ledger
        attempt = 0
        give_up = time.monotonic() + self.plan.give_up_s
        try:
            while node.queue:
                batch = node.queue[: self.max_batch]
                now = time.monotonic()
                for e in batch:
                    ledger.sent.setdefault(e.id, now)
                done, _, error = await node.send(batch)
                now = time.monotonic()
                for e in batch[:done]:
                    ledger.stored[e.id] = now
                del node.queue[:done]
                if done == len(batch):
                    attempt = 0
                    continue
                ledger.errors[_short(error)] += 1
                if now >= give_up:
                    ledger.abandoned += len(node.queue)
                    node.queue.clear()
                    break
                ledger.retries += 1
                await asyncio.sleep(min(RETRY.delay(attempt), max(0.0, give_up - now)))
                attempt += 1
        finally:
            node.task = None
            self.busy -= 1
            if self.busy == 0:
                self.idle.set()

    async def play(self, events_per_s: float, seconds: float) -> list[str]:
        """Re-queries with changes at Poisson times over the fleet, `events_per_s` on average."""
        rate = events_per_s / self.script.mean_events
        ids: list[str] = []
        t0 = time.monotonic()
        due = t0
        while True:
            due += self.rng.expovariate(rate)
            if due >= t0 + seconds:
                break
            wait = due - time.monotonic()
            if wait > 0.001:
                await asyncio.sleep(wait)
            ids += [e.id for e in self.change(self.rng.choice(self.nodes))]
        await asyncio.sleep(max(0.0, t0 + seconds - time.monotonic()))
        return ids

    def burst(self, share: float) -> list[str]:
        """A share of the nodes each lose a GPU that a pod holds, at the same instant."""
        hit = self.rng.sample(self.nodes, max(1, round(share * len(self.nodes))))
        return [e.id for node in hit for e in self.change(node, self.script.burst)]

    async def settle(self) -> None:
        """Until every node's queue is delivered (or given up: each delivery is bounded)."""
        async with asyncio.timeout(self.plan.give_up_s + 30):
            await self.idle.wait()


async def _quiet(_err: Exception) -> None:
    """The reader's connection errors (its server killed): the client reconnects on its own."""


def _short(error: str) -> str:
    """An error's kind for counting: up to its first ": " outside parentheses (the details after it
    vary from one attempt to the next)."""
    depth = 0
    for i, ch in enumerate(error):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and error.startswith(": ", i):
            return error[:i][:80]
    return error[:80] or "(none)"


# --- the cluster side ---


def _settings(cluster: NatsCluster, name: str) -> NatsSinkSettings:
    return NatsSinkSettings(
        name="fleet",
        servers=tuple(cluster.urls),
        subject_prefix=f"fleet-{name.lower()}",
        stream=f"FLEET_{name}",
        create_stream=True,
    )


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@dataclass
class Connections:
    clients: list[Client]

    async def close(self) -> None:
        for start in range(0, len(self.clients), 500):
            await asyncio.gather(
                *(nc.close() for nc in self.clients[start : start + 500]), return_exceptions=True
            )


async def open_connections(settings: NatsSinkSettings, count: int) -> Connections:
    """`count` clients made by the sink's own `connect`, a few hundred at a time."""
    clients: list[Client] = []
    try:
        for start in range(0, count, 250):
            clients += await asyncio.gather(
                *(connect(settings, name=f"fleet-{i}") for i in range(start, min(count, start + 250)))
            )
    except BaseException:
        await Connections(clients).close()
        raise
    return Connections(clients)


@contextlib.contextmanager
def setup_frozen() -> Iterator[None]:
    """Everything set up so far (thousands of clients, their tasks and buffers) out of the garbage
    collector's sight while the clock runs: a full collection rescanning 10,000 clients stops this
    process for most of a second, a pause that no agent (one connection) has."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def sink_send(sink: Sink) -> Send:
    """A delivery through a sink's own `deliver`, as the agent's worker makes it."""

    async def send(events: Sequence[Event]) -> tuple[int, int, str]:
        outcome = await sink.deliver(events)
        if outcome.delivered:
            return len(events), 0, ""
        return outcome.done or 0, 0, outcome.error

    return send


class SharedPublisher:
    """A node's delivery over a connection it shares with others: its own JetStream context and
    `Publisher` on it, made as `NatsSink` makes them (the stream checked first, the client's
    pending bound at max_in_flight) and made afresh when a publish says so; nothing published
    while the connection is down."""

    def __init__(self, nc: Client, settings: NatsSinkSettings, node: str) -> None:
        self.nc = nc
        self.settings = settings
        self.node = node
        self.publisher: Publisher | None = None

    async def __call__(self, events: Sequence[Event]) -> tuple[int, int, str]:
        s = self.settings
        if not self.nc.is_connected:
            return 0, 0, "not connected to NATS (the client is reconnecting)"
        if self.publisher is None:
            try:
                self.publisher = await publisher_for(self.nc, s, self.node)
            except (StreamError, nats.errors.Error, OSError, TimeoutError) as err:
                return 0, 0, f"the stream could not be checked: {type(err).__name__}"
        result = await self.publisher.publish(events)
        assert not result.oversized, result.error
        if result.stale:
            self.publisher = None
        return result.done, result.duplicates, result.error


class NatsNodes:
    """How the simulated nodes reach the cluster. With a connection each, each node is a whole
    `NatsSink`, the agent's own (its connection, the stream checked, a fresh JetStream context
    after a failed publish, nothing published while reconnecting); with fewer connections than
    nodes, nodes share them round-robin, each with a `SharedPublisher`."""

    def __init__(self, settings: NatsSinkSettings, names: Sequence[str], connections: int) -> None:
        self.settings = settings
        self.names = list(names)
        self.connections = min(connections, len(self.names))
        self.shared = self.connections < len(self.names)
        self.sinks: list[NatsSink] = []
        self.conns: Connections | None = None

    async def open(self) -> list[Send]:
        """Each node's delivery; the sinks connect on their first one (see `start_nodes`)."""
        if self.shared:
            self.conns = await open_connections(self.settings, self.connections)
            clients = self.conns.clients
            return [
                SharedPublisher(clients[i % len(clients)], self.settings, name)
                for i, name in enumerate(self.names)
            ]
        self.sinks = [NatsSink(self.settings, node=name) for name in self.names]
        return [sink_send(sink) for sink in self.sinks]

    async def close(self) -> None:
        if self.conns is not None:
            await self.conns.close()
        for start in range(0, len(self.sinks), 500):
            await asyncio.gather(*(sink.close() for sink in self.sinks[start : start + 500]))


async def deliver_all(node: SimNode, events: list[Event], give_up_s: float) -> None:
    """`events` delivered by `node`, retried with the worker's backoff until done (bounded)."""
    attempt = 0
    give_up = time.monotonic() + give_up_s
    while events:
        done, _, error = await node.send(events)
        del events[:done]
        if events:
            if time.monotonic() >= give_up:
                raise RuntimeError(f"{node.name} could not deliver its first events: {error}")
            await asyncio.sleep(RETRY.delay(attempt))
            attempt += 1


async def start_nodes(nodes: Sequence[SimNode], play: Script, give_up_s: float) -> dict[str, Any]:
    """Every node starts as an agent does: its first delivery (watcher.started) connects its sink,
    checks the stream and publishes, a few hundred nodes at a time. The wall time and the RSS it
    added to this process; the events' ids, to be found in the stream."""
    rss0, t0 = rss_mib(), time.monotonic()
    ids: list[str] = []
    for start in range(0, len(nodes), 250):
        chunk = [(node, node.events(play.start)) for node in nodes[start : start + 250]]
        ids += [e.id for _, events in chunk for e in events]
        await asyncio.gather(*(deliver_all(node, list(events), give_up_s) for node, events in chunk))
    return {"ids": ids, "start_s": time.monotonic() - t0, "rss_mib": rss_mib() - rss0}


class Reader:
    """A durable pull consumer that records when each event id first arrives.

    Pull requests (a batch each, expiring after a second) are kept topped up from its callback,
    so a message is recorded as it comes off the socket, not when a fetch returns. Each message
    is acknowledged on its own as it arrives (ack policy explicit): a delivery lost on the way
    (to a pull request of a connection that went down with its server) is delivered again after
    `ACK_WAIT`, where acknowledging "everything up to here" would have skipped it for good.
    """

    ACK_WAIT = 2.0

    BATCH = 1000
    EXPIRES = 1.0

    def __init__(self, nc: Client, stream: str, received: dict[str, float]) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=2)
        self.stream = stream
        self.durable = "fleet-reader"
        self.received = received
        self.deliveries = 0
        self.lag: list[tuple[float, int]] = []
        self._requests: deque[list[float]] = deque()  # [expires at, messages still due]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.js.add_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=self.durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.ACK_WAIT,
                deliver_policy=DeliverPolicy.ALL,
                # The burst must not wait on acknowledgements: every message may be outstanding.
                max_ack_pending=1_000_000,
            ),
        )
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)
        self._tasks = [asyncio.create_task(self._tick()), asyncio.create_task(self._sample())]

    def _due(self) -> float:
        return sum(r[1] for r in self._requests)

    async def _pull(self) -> None:
        if self._due() < self.BATCH / 2:
            self._requests.append([time.monotonic() + self.EXPIRES, self.BATCH])
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}",
                b'{"batch":%d,"expires":%d}' % (self.BATCH, int(self.EXPIRES * 1e9)),
                reply=self.inbox,
            )

    async def _on_msg(self, msg: Msg) -> None:
        now = time.monotonic()
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            # 408: a request expired; anything else (409: leadership change, too many waiting)
            # leaves our count of what is due unknown: start over.
            if status == "408" and self._requests:
                self._requests.popleft()
            else:
                self._requests.clear()
        else:
            assert msg.headers is not None
            self.received.setdefault(msg.headers["Nats-Msg-Id"], now)
            self.deliveries += 1
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await self.nc.publish(msg.reply, b"+ACK")
            if self._requests:
                self._requests[0][1] -= 1
                if self._requests[0][1] <= 0:
                    self._requests.popleft()
        with contextlib.suppress(nats.errors.Error):
            await self._pull()

    async def _tick(self) -> None:
        while True:
            now = time.monotonic()
            while self._requests and self._requests[0][0] + 0.2 < now:
                self._requests.popleft()  # expired without a word (its server went away)
            with contextlib.suppress(nats.errors.Error):
                await self._pull()
            await asyncio.sleep(PULL_EVERY)

    async def lag_now(self) -> int | None:
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
            last = (await self.js.stream_info(self.stream)).state.last_seq
        except (nats.errors.Error, TimeoutError):
            return None  # e.g. no leader this moment
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else None
        return int(last - (floor or 0))

    async def _sample(self) -> None:
        while True:
            lag = await self.lag_now()
            if lag is not None:
                self.lag.append((time.monotonic(), lag))
            await asyncio.sleep(LAG_EVERY)

    def max_lag(self, since: float, until: float) -> int:
        return max((lag for t, lag in self.lag if since <= t <= until), default=0)

    async def caught_up(self, ids: Sequence[str], timeout: float) -> None:
        """Until every one of `ids` arrived (bounded)."""
        deadline = time.monotonic() + timeout
        for i in ids:
            while i not in self.received and time.monotonic() < deadline:
                await asyncio.sleep(0.005)

    async def settled(self, ids: Sequence[str]) -> None:
        """The nodes' start read and acknowledged, so that a phase's lag is its own."""
        await self.caught_up(ids, 30)
        await self.end_lag()

    async def end_lag(self) -> int | None:
        """The lag once everything was read: after an acknowledgement of the last message."""
        await asyncio.sleep(2 * PULL_EVERY)
        for _ in range(40):
            lag = await self.lag_now()
            if lag == 0:
                return 0
            await asyncio.sleep(0.05)
        return await self.lag_now()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(nats.errors.Error):
            await self.sub.unsubscribe()


def latency(ids: Sequence[str], ledger: Ledger) -> list[float]:
    return [ledger.received[i] - ledger.sent[i] for i in ids if i in ledger.received and i in ledger.sent]


def phase_row(ids: Sequence[str], ledger: Ledger, seconds: float | None, started: float) -> dict[str, Any]:
    """A phase's figures: events, events/s (over `seconds`, or until its last arrival), latency."""
    got = [i for i in ids if i in ledger.received]
    last = max((ledger.received[i] for i in got), default=started)
    span = seconds if seconds is not None else max(last - started, 1e-6)
    return {
        "events": len(ids),
        "received": len(got),
        "per_s": len(got) / span,
        "span_s": span,
        "latency": latency(ids, ledger),
    }


async def read_stream(cluster: NatsCluster, stream: str, timeout: float = 120) -> list[Msg]:
    """Every message the stream holds, in stream order, through an ephemeral consumer of its own
    (in memory, one replica, no acknowledgements); a fetch refused while that consumer is still
    being placed (503) or timing out is tried again, within `timeout`."""
    nc = await cluster.connect(error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=5)
        want = (await js.stream_info(stream)).state.messages
        sub = await js.pull_subscribe(
            "",
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1),
        )
        out: list[Msg] = []
        async with asyncio.timeout(timeout):
            while len(out) < want:
                try:
                    out.extend(await sub.fetch(min(500, want - len(out)), timeout=1))
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    await asyncio.sleep(0.1)
        return out
    finally:
        await nc.close()


async def stream_check(cluster: NatsCluster, stream: str, sent: Sequence[str]) -> dict[str, Any]:
    """Read the whole stream back: ids sent but absent, ids stored twice, a node's seq going back."""
    messages = await read_stream(cluster, stream)
    ids: Counter[str] = Counter()
    last: dict[str, int] = {}
    backwards = 0
    for m in messages:
        assert m.headers is not None
        ids[m.headers["Nats-Msg-Id"]] += 1
        node, seq = m.headers["Prw-Node"], int(m.headers["Prw-Seq"])
        backwards += seq < last.get(node, 0)
        last[node] = seq
    lost = [i for i in sent if i not in ids]
    twice = [i for i, n in ids.items() if n > 1]
    return {
        "stored": len(messages),
        "lost": len(lost),
        "duplicated": sum(ids[i] - 1 for i in twice),
        "out_of_order": backwards,
        "examples": {"lost": lost[:3], "duplicated": twice[:3]},
    }


async def _nats_fleet(
    cluster: NatsCluster, plan: FleetPlan, play: Script, nodes: int, name: str
) -> dict[str, Any]:
    """`nodes` simulated nodes at the realistic rate, then the burst, into a stream of their own."""
    settings = _settings(cluster, name)
    ways = NatsNodes(settings, _names(0, nodes), plan.max_connections)
    reader_nc = await cluster.connect(error_cb=_quiet)
    ledger = Ledger()
    try:
        await _stream_ready(cluster, reader_nc, settings)
        reader = Reader(reader_nc, settings.stream, ledger.received)
        await reader.start()
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=nodes)
        for node_name, send in zip(ways.names, await ways.open(), strict=True):
            fleet.add(node_name, send)
        started = await start_nodes(fleet.nodes, play, plan.give_up_s)
        await reader.settled(started["ids"])
        with setup_frozen():
            t0 = time.monotonic()
            steady = await fleet.play(plan.per_node_rate * nodes, plan.steady_s)
            await fleet.settle()
            await reader.caught_up(steady, 30)
            t1 = time.monotonic()
            burst = fleet.burst(plan.burst_share)
            await fleet.settle()
            await reader.caught_up(burst, 60)
            t2 = time.monotonic()
        end_lag = await reader.end_lag()
        await reader.stop()
        check = await stream_check(cluster, settings.stream, [*started.pop("ids"), *steady, *burst])
    finally:
        await reader_nc.close()
        await ways.close()
    common = {
        "sink": "nats",
        "nodes": nodes,
        "connections": ways.connections,
        "retries": ledger.retries,
        "abandoned": ledger.abandoned,
        **check,
    }
    return {
        "connect": {"nodes": nodes, "connections": ways.connections, "shared": ways.shared, **started},
        "steady": {
            **common,
            **phase_row(steady, ledger, plan.steady_s, t0),
            "lag_max": reader.max_lag(t0, t1),
            "lag_end": end_lag,
        },
        "burst": {
            **common,
            **phase_row(burst, ledger, None, t1),
            "burst_nodes": len(burst) // len(play.burst.changes),
            "lag_max": reader.max_lag(t1, t2),
            "lag_end": end_lag,
        },
    }


async def _stream_ready(cluster: NatsCluster, nc: Client, settings: NatsSinkSettings) -> None:
    """The run's stream, made by the sink's `ensure_stream` (which waits for its leader)."""
    await ensure_stream(nc.jetstream(timeout=settings.timeout), settings, "gpu-node-00000")
    await cluster.stream_leader(settings.stream)


async def _failover(
    cluster: NatsCluster, plan: FleetPlan, play: Script, say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """A run during which the stream's leader is killed (SIGKILL) and later restarted."""
    settings = _settings(cluster, "FAILOVER")
    ways = NatsNodes(settings, _names(0, plan.failover_nodes), plan.max_connections)
    reader_nc = await cluster.connect(error_cb=_quiet)
    ledger = Ledger()
    killed: dict[str, Any] = {}
    try:
        await _stream_ready(cluster, reader_nc, settings)
        reader = Reader(reader_nc, settings.stream, ledger.received)
        await reader.start()
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=7)
        for node_name, send in zip(ways.names, await ways.open(), strict=True):
            fleet.add(node_name, send)
        started = await start_nodes(fleet.nodes, play, plan.give_up_s)
        await reader.settled(started["ids"])

        async def chaos() -> None:
            if plan.kill_at is None:
                return
            await asyncio.sleep(plan.kill_at)
            leader = await cluster.stream_leader(settings.stream)
            killed["server"] = leader.name
            killed["at"] = time.monotonic()
            cluster.kill(leader)
            say(f"leader kill: {leader.name} killed")
            await asyncio.sleep(plan.down_s)
            killed["restart_at"] = time.monotonic()
            await cluster.restart(leader)
            killed["healthy_at"] = time.monotonic()
            killed["new_leader"] = (await cluster.stream_leader(settings.stream)).name

        with setup_frozen():
            t0 = time.monotonic()
            kill = asyncio.create_task(chaos())
            ids = await fleet.play(plan.failover_rate, plan.failover_s)
            await kill
            say("leader kill: load played; until every node's retries are through")
            await fleet.settle()
            await reader.caught_up(ids, 60)
        end_lag = await reader.end_lag()
        await reader.stop()
        say("leader kill: reading the stream back")
        check = await stream_check(cluster, settings.stream, [*started["ids"], *ids])
    finally:
        await reader_nc.close()
        await ways.close()
    stalls = [ledger.stored[i] - ledger.sent[i] for i in ids if i in ledger.stored]
    acks = sorted(ledger.stored.values())
    return {
        "nodes": plan.failover_nodes,
        "connections": ways.connections,
        "shared": ways.shared,
        "rate": plan.failover_rate,
        "seconds": plan.failover_s,
        "events": len(ids),
        "killed": killed.get("server"),
        "new_leader": killed.get("new_leader"),
        "kill_at_s": killed["at"] - t0 if killed else None,
        "down_s": killed["restart_at"] - killed["at"] if killed else None,
        "rejoin_s": killed["healthy_at"] - killed["restart_at"] if killed else None,
        "max_stall": max(stalls, default=0.0),
        # The longest time in which nothing at all was acknowledged while the run lasted.
        "ack_gap": max((b - a for a, b in itertools.pairwise(acks)), default=0.0),
        "latency": latency(ids, ledger),
        "received": sum(1 for i in ids if i in ledger.received),
        "deliveries": reader.deliveries,
        "lag_max": reader.max_lag(t0, time.monotonic()),
        "lag_end": end_lag,
        "retries": ledger.retries,
        "abandoned": ledger.abandoned,
        "errors": dict(ledger.errors.most_common(4)),
        **check,
    }


# --- sustained capacity ---


# The events/s that a capacity run's events, made before its clock starts, last for over its
# warm-up and window; a faster run makes more as it goes (counted, and said in the report).
STOCK_RATE = 30_000.0


def stock_per_node(nodes: int, seconds: float, batch: int) -> int:
    """Events each of a row's `nodes` makes ahead for `seconds` at STOCK_RATE: whole batches."""
    need = math.ceil(STOCK_RATE * seconds / nodes)
    return max(1, math.ceil(need / batch)) * batch


def make_events(sim: SimNode, play: Script, count: int) -> list[Event]:
    """At least `count` of `sim`'s next events, whole re-queries of its script."""
    events: list[Event] = []
    while len(events) < count:
        events += sim.events(play.steady[sim.step % len(play.steady)])
        sim.step += 1
    return events


def make_stocks(nodes: Sequence[SimNode], play: Script, count: int) -> dict[str, list[Event]]:
    return {sim.name: make_events(sim, play, count) for sim in nodes}


class Flood:
    """Simulated nodes delivering full batches back to back until stopped.

    Their events are made before the clock starts (`stocks`, see `make_stocks`), as an agent makes
    them in its own cycle on its own node: what is measured is the sink's publishing into the
    cluster, not this one process building envelopes for hundreds of nodes. A node that runs out
    makes more as it goes, counted in `made_late`.
    """

    def __init__(
        self, nodes: Sequence[SimNode], play: Script, batch: int, stocks: dict[str, list[Event]]
    ) -> None:
        self.play = play
        self.batch = batch
        self.stopping = False
        self.made_late = 0
        self.stocks = stocks
        self.tasks = [asyncio.create_task(self._node(sim)) for sim in nodes]

    async def _node(self, sim: SimNode) -> None:
        attempt = 0
        stock = self.stocks.setdefault(sim.name, [])
        while not self.stopping:
            if len(stock) < self.batch:
                more = make_events(sim, self.play, self.batch - len(stock))
                self.made_late += len(more)
                stock += more
            events = stock[: self.batch]
            del stock[: self.batch]  # what a failed delivery left is not sent again: fresh ones are
            done, _, _ = await sim.send(events)
            if done < self.batch and not self.stopping:
                await asyncio.sleep(RETRY.delay(attempt))
                attempt += 1

    async def stop(self) -> None:
        """Cancel the nodes, again until they have ended (a sink's delivery may hold on to a
        cancel while it settles what is in flight); the flag ends a node's loop in any case."""
        self.stopping = True
        pending = set(self.tasks)
        for _ in range(200):  # 10 s at most
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.05)
        if pending:
            await asyncio.wait(pending, timeout=30)
        for task in self.tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a node that ended on an error is no news here


async def _window(
    window: tuple[float, float],
    stored: Callable[[], Awaitable[int]],
    generators: Callable[[], float],
    servers: Sequence[int],
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """After `window[0]` s of warm-up, what the other side holds (`stored`) over `window[1]` s,
    with the CPU seconds of the generators and of the processes `servers` over that time;
    `profile`, if given, runs over just that window."""

    def server_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in servers)

    warmup, seconds = window
    await asyncio.sleep(warmup)
    n0, g0, s0, t0 = await stored(), generators(), server_cpu(), time.monotonic()
    if profile is not None:
        profile.enable()
    try:
        await asyncio.sleep(seconds)
    finally:
        if profile is not None:
            profile.disable()
    n1, g1, s1, t1 = await stored(), generators(), server_cpu(), time.monotonic()
    wall = t1 - t0
    return {
        "seconds": wall,
        "events": n1 - n0,
        "per_s": (n1 - n0) / wall,
        "generator_cores": (g1 - g0) / wall,
        "server_cores": (s1 - s0) / wall if servers else None,
    }


def _names(first: int, count: int) -> list[str]:
    return [f"gpu-node-{i:05d}" for i in range(first, first + count)]


async def _nats_capacity(
    cluster: NatsCluster,
    plan: FleetPlan,
    play: Script,
    row: CapacityRow,
    window: float,
    tag: str,
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """One capacity row; `profile` (one generator process only) runs over its window."""
    settings = _settings(cluster, f"CAP_{tag}")
    nc = await cluster.connect(error_cb=_quiet)
    servers = [s.process.pid for s in cluster.servers if s.process is not None]
    try:
        await _stream_ready(cluster, nc, settings)
        js = nc.jetstream(timeout=settings.timeout)

        async def stored() -> int:
            return int((await js.stream_info(settings.stream)).state.messages)

        stock = stock_per_node(row.nodes, plan.warmup_s + window, settings.max_batch)
        if row.processes == 1:
            nodes, ways = await _flood_nodes(
                dataclasses.replace(settings, max_in_flight=row.max_in_flight),
                row.nodes,
                row.connections,
                0,
                play,
                plan.give_up_s,
            )
            try:
                flood = Flood(nodes, play, settings.max_batch, make_stocks(nodes, play, stock))
                try:
                    with setup_frozen():
                        measured = await _window(
                            (plan.warmup_s, window), stored, time.process_time, servers, profile
                        )
                finally:
                    await flood.stop()
                measured["made_late"] = flood.made_late
            finally:
                await ways.close()
        else:
            measured = await _in_processes(settings, row, (plan.warmup_s, window), stored, servers, stock)
        await js.delete_stream(settings.stream)  # its files and duplicate window are no longer needed
    finally:
        await nc.close()
    return {
        "sink": "nats",
        "nodes": row.nodes,
        "connections": row.connections,
        "processes": row.processes,
        "max_in_flight": row.max_in_flight,
        "batch": settings.max_batch,
        **measured,
    }


async def _flood_nodes(
    settings: NatsSinkSettings, count: int, connections: int, first: int, play: Script, give_up_s: float
) -> tuple[list[SimNode], NatsNodes]:
    """A capacity run's nodes, started (see `start_nodes`) before the clock."""
    ways = NatsNodes(settings, _names(first, count), connections)
    try:
        sends = await ways.open()
        nodes = [SimNode(name, send, i) for i, (name, send) in enumerate(zip(ways.names, sends, strict=True))]
        await start_nodes(nodes, play, give_up_s)
    except BaseException:
        await ways.close()
        raise
    return nodes, ways


async def _in_processes(
    settings: NatsSinkSettings,
    row: CapacityRow,
    window: tuple[float, float],
    stored: Callable[[], Awaitable[int]],
    servers: Sequence[int],
    stock: int,
) -> dict[str, Any]:
    """The row's nodes and connections split over `row.processes` generator processes (this
    module's `flood` command), all started at once; their CPU is read from /proc."""
    nodes, conns = row.nodes // row.processes, row.connections // row.processes
    procs = []
    try:
        for k in range(row.processes):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.fleet",
                    "flood",
                    json.dumps(list(settings.servers)),
                    settings.stream,
                    settings.subject_prefix,
                    str(nodes),
                    str(conns),
                    str(row.max_in_flight),
                    str(k * nodes),
                    str(stock),
                    cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            assert line == b"ready\n", f"a generator process did not start: {line!r}"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()

        def generators() -> float:
            return sum(cpu_seconds(p.pid) for p in procs)

        measured = await _window(window, stored, generators, servers)
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()  # end of input: stop
        late = []
        for proc in procs:
            try:
                assert proc.stdout is not None
                late.append(await asyncio.wait_for(proc.stdout.read(), 60))
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    # Each process's last line: how many events it made while the clock ran.
    measured["made_late"] = sum(int(out.split()[-1]) for out in late)
    return measured


async def _flood_command(
    servers: list[str],
    stream: str,
    prefix: str,
    nodes: int,
    connections: int,
    max_in_flight: int,
    first: int,
    stock: int,
) -> None:
    """A generator process: its nodes started and their events made, say "ready", flood from "go"
    until the end of input, then print how many events it made meanwhile."""
    configure_logging("error", "json")
    settings = NatsSinkSettings(
        name="fleet",
        servers=tuple(servers),
        subject_prefix=prefix,
        stream=stream,
        max_in_flight=max_in_flight,
    )
    play = script()
    sims, ways = await _flood_nodes(settings, nodes, connections, first, play, FULL.give_up_s)
    try:
        stocks = make_stocks(sims, play, stock)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        flood = Flood(sims, play, settings.max_batch, stocks)
        with setup_frozen():
            await asyncio.to_thread(sys.stdin.read)
        await flood.stop()
        print(flood.made_late, flush=True)
    finally:
        await ways.close()


# --- the webhook side ---


def _hook(port: int) -> WebhookSinkSettings:
    return WebhookSinkSettings(name="hook", url=Secret(value=f"http://127.0.0.1:{port}/"), batch=True)


def open_sinks(settings: WebhookSinkSettings, count: int) -> list[WebhookSink]:
    """`count` webhook sinks with their HTTP sessions made: a session's first use builds its TLS
    context (the system's CA bundle, tens of ms of CPU, even for http://), which an agent pays
    once when it starts, not in a delivery."""
    sinks = [WebhookSink(settings, node=f"gpu-node-{i:05d}") for i in range(count)]
    for sink in sinks:
        sink.http.session()
    return sinks


async def _webhook_fleet(plan: FleetPlan, play: Script) -> dict[str, Any]:
    receiver = Receiver()
    runner, port = await serve(receiver)
    ledger = Ledger()
    ledger.received = receiver.ids
    settings = _hook(port)
    t = time.monotonic()
    sinks = open_sinks(settings, min(plan.webhook_nodes, plan.webhook_sinks))
    open_s = time.monotonic() - t
    try:
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=plan.webhook_nodes)
        for i in range(plan.webhook_nodes):
            fleet.add(f"gpu-node-{i:05d}", sink_send(sinks[i % len(sinks)]))
        with setup_frozen():
            t0 = time.monotonic()
            steady = await fleet.play(plan.per_node_rate * plan.webhook_nodes, plan.steady_s)
            await fleet.settle()
            t1 = time.monotonic()
            burst = fleet.burst(plan.burst_share)
            await fleet.settle()
    finally:
        for sink in sinks:
            await sink.close()
        await runner.cleanup()
    sent = [*steady, *burst]
    common = {
        "sink": "webhook",
        "nodes": plan.webhook_nodes,
        "connections": len(sinks),
        "open_s": open_s,
        "retries": ledger.retries,
        "abandoned": ledger.abandoned,
        "stored": receiver.count,
        "lost": sum(1 for i in sent if i not in receiver.ids),
        "duplicated": receiver.receipts - receiver.count,
        "out_of_order": None,
        "lag_max": None,
        "lag_end": None,
    }
    return {
        "steady": {**common, **phase_row(steady, ledger, plan.steady_s, t0)},
        "burst": {
            **common,
            **phase_row(burst, ledger, None, t1),
            "burst_nodes": len(burst) // len(play.burst.changes),
        },
    }


async def _webhook_capacity(play: Script, row: CapacityRow, window: tuple[float, float]) -> dict[str, Any]:
    receiver = Receiver()
    runner, port = await serve(receiver)
    settings = _hook(port)
    sinks = open_sinks(settings, row.connections)

    async def stored() -> int:
        return receiver.receipts

    try:
        nodes = [
            SimNode(name, sink_send(sinks[i % len(sinks)]), i) for i, name in enumerate(_names(0, row.nodes))
        ]
        stock = stock_per_node(row.nodes, sum(window), settings.max_batch)
        flood = Flood(nodes, play, settings.max_batch, make_stocks(nodes, play, stock))
        try:
            with setup_frozen():
                measured = await _window(window, stored, time.process_time, ())
        finally:
            await flood.stop()
        measured["made_late"] = flood.made_late
    finally:
        for sink in sinks:
            await sink.close()
        await runner.cleanup()
    # The receiver is in this process: its CPU is in the generator's figure.
    return {
        "sink": "webhook",
        "nodes": row.nodes,
        "connections": len(sinks),
        "processes": 1,
        "max_in_flight": 1,
        "batch": settings.max_batch,
        **measured,
    }


# --- profiles of goals not met ---


async def profiled(run: Callable[[], Awaitable[Any]], top: int = 14) -> list[str]:
    """`run` under cProfile: the top entries by own time, as pstats prints them."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        await run()
    finally:
        profile.disable()
    return top_entries(profile, top)


def top_entries(profile: cProfile.Profile, top: int = 14) -> list[str]:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return [line.rstrip() for line in lines[start:] if line.strip()]


# --- the section ---


async def bench_fleet(plan: FleetPlan) -> dict[str, Any]:
    say = _Progress()
    play = script()
    out: dict[str, Any] = {
        "quick": plan.quick,
        "plan": {
            "steady_s": plan.steady_s,
            "per_node_rate": plan.per_node_rate,
            "burst_share": plan.burst_share,
            "capacity_s": plan.capacity_s,
            "capacity_runs": plan.capacity_runs,
            "warmup_s": plan.warmup_s,
            "max_connections": plan.max_connections,
            "kill_at": plan.kill_at,
            "down_s": plan.down_s,
        },
        "script": {
            "steady": [[str(c.kind) for c in cycle.changes] for cycle in play.steady],
            "burst": [f"{c.kind} ({c.severity})" for c in play.burst.changes],
            "mean_events": play.mean_events,
        },
        "fleets": [],
        "connect": [],
        "capacity": [],
        "profiles": {},
    }
    with tempfile.TemporaryDirectory(prefix="prw-fleet-", dir="/tmp") as tmp:
        async with running_cluster(Path(tmp)) as cluster:
            for nodes in plan.fleets:
                say(f"{nodes:,} nodes into the cluster")
                result = await _nats_fleet(cluster, plan, play, nodes, str(nodes))
                out["connect"].append(result.pop("connect"))
                out["fleets"].append(result)
            for i, row in enumerate(plan.capacity):
                say(
                    f"capacity: {row.nodes:,} nodes, {row.connections:,} connections, "
                    f"{row.processes} generator process(es), max_in_flight {row.max_in_flight}"
                )
                runs = [
                    await _nats_capacity(cluster, plan, play, row, plan.capacity_s, f"{i}_{k}")
                    for k in range(plan.capacity_runs)
                ]
                out["capacity"].append(median_run(runs))
            say("leader kill")
            out["failover"] = await _failover(cluster, plan, play, say)
            if plan.profile_s > 0:
                say("profiles of goals not met, if any")
                out["profiles"] = await _profiles(cluster, plan, play, out)
    say("webhook")
    out["webhook"] = await _webhook_fleet(plan, play)
    say("webhook capacity")
    window = (plan.warmup_s, plan.capacity_s)
    runs = [await _webhook_capacity(play, plan.capacity[0], window) for _ in range(plan.capacity_runs)]
    out["capacity"].append(median_run(runs))
    say("done")
    return {"fleet": out}


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A capacity row's median run (by events/s), with every run's events/s beside it."""
    ranked = sorted(runs, key=lambda r: float(r["per_s"]))
    return {**ranked[(len(ranked) - 1) // 2], "runs": [r["per_s"] for r in runs]}


class _Progress:
    """A line on stderr per step, with the time since the section started (as run.py does)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, what: str) -> None:
        print(f"bench: fleet: {what} (at {time.monotonic() - self.t0:.0f} s)", file=sys.stderr, flush=True)


async def _profiles(
    cluster: NatsCluster, plan: FleetPlan, play: Script, out: dict[str, Any]
) -> dict[str, list[str]]:
    """A short run of each goal not met, under cProfile."""
    profiles = {}
    best = capacity_goal_row(out["capacity"])
    if best is not None and best["per_s"] < FLEET_CAPACITY_GOAL:
        # In this process, so that the generator is in the profile, with the servers it drives.
        row = CapacityRow(best["nodes"], best["connections"], best["max_in_flight"])
        label = (
            f"capacity, {row.nodes:,} nodes, {row.connections:,} connections, one process, "
            f"over a {plan.profile_s:g} s window"
        )
        # Over its window only: not the setup, nor the events made before the clock.
        profile = cProfile.Profile()
        await _nats_capacity(cluster, plan, play, row, plan.profile_s, "PROFILE", profile)
        profiles[label] = top_entries(profile)
    first = out["fleets"][0]["steady"] if out["fleets"] else None
    if first is not None and first["latency"] and pct(first["latency"], 99) > FLEET_P99_GOAL:
        profiles["publish to consumer"] = await profiled(
            lambda: _nats_fleet(cluster, plan, play, plan.fleets[0], "PROFILE")
        )
    return profiles


if __name__ == "__main__":
    # `python -m bench.fleet flood SERVERS STREAM PREFIX NODES CONNECTIONS MAX_IN_FLIGHT FIRST STOCK`:
    # a generator process of a capacity row (started by `_in_processes`, from the repository).
    if sys.argv[1:2] != ["flood"] or len(sys.argv) != 10:
        raise SystemExit(__doc__)
    servers_, stream_, prefix_, *numbers = sys.argv[2:]
    asyncio.run(_flood_command(json.loads(servers_), stream_, prefix_, *map(int, numbers)))
