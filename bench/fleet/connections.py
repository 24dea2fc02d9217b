"""How simulated nodes reach the cluster: a whole `NatsSink` each, or nodes sharing connections
round-robin with a `Publisher` each; and every node's start, as an agent starts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from bench.fleet.nodes import RETRY, Send, SimNode
from bench.fleet.script import Script
from testkit.nats_cluster import NatsCluster
from watcher.model.events import Event
from watcher.sinks.base import Sink
from watcher.sinks.nats import (
    NatsSink,
    NatsSinkSettings,
    Publisher,
    StreamError,
    connect,
    publisher_for,
)

__all__ = [
    "Connections",
    "NatsNodes",
    "SharedPublisher",
    "deliver_all",
    "open_connections",
    "quiet",
    "rss_mib",
    "setup_frozen",
    "sink_send",
    "sink_settings",
    "start_nodes",
]


async def quiet(_err: Exception) -> None:
    """The reader's connection errors (its server killed): the client reconnects on its own."""


def sink_settings(cluster: NatsCluster, name: str) -> NatsSinkSettings:
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


async def start_nodes(
    nodes: Sequence[SimNode], play: Script, give_up_s: float
) -> tuple[list[str], float, float]:
    """Every node starts as an agent does: its first delivery (watcher.started) connects its sink,
    checks the stream and publishes, a few hundred nodes at a time. The events' ids, to be found
    in the stream; the wall time, and the RSS it added to this process (MiB)."""
    rss0, t0 = rss_mib(), time.monotonic()
    ids: list[str] = []
    for start in range(0, len(nodes), 250):
        chunk = [(node, node.events(play.start)) for node in nodes[start : start + 250]]
        ids += [e.id for _, events in chunk for e in events]
        await asyncio.gather(*(deliver_all(node, list(events), give_up_s) for node, events in chunk))
    return ids, time.monotonic() - t0, rss_mib() - rss0
