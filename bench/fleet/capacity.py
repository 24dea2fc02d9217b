"""Sustained capacity: simulated nodes delivering full batches back to back, their events made
before the clock, in this process or split over generator processes (`python -m bench.fleet flood`)."""

from __future__ import annotations

import asyncio
import cProfile
import dataclasses
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from bench.fleet.connections import NatsNodes, quiet, setup_frozen, sink_settings, start_nodes
from bench.fleet.nodes import RETRY, SimNode
from bench.fleet.phases import node_names, stream_ready
from bench.fleet.plan import FULL, CapacityRow, FleetPlan
from bench.fleet.results import Capacity, Window
from bench.fleet.script import Script, script
from bench.harness import ROOT
from bench.steady import cpu_seconds
from testkit.nats_cluster import NatsCluster
from watcher.model.events import Event
from watcher.ops.logs import configure_logging
from watcher.sinks.nats import (
    NatsSinkSettings,
)

__all__ = [
    "Flood",
    "STOCK_RATE",
    "capacity_window",
    "flood_command",
    "flood_nodes",
    "in_processes",
    "make_events",
    "make_stocks",
    "nats_capacity",
    "stock_per_node",
]

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


async def capacity_window(
    window: tuple[float, float],
    stored: Callable[[], Awaitable[int]],
    generators: Callable[[], float],
    servers: Sequence[int],
    profile: cProfile.Profile | None = None,
) -> Window:
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
    return Window(
        seconds=wall,
        events=n1 - n0,
        per_s=(n1 - n0) / wall,
        generator_cores=(g1 - g0) / wall,
        server_cores=(s1 - s0) / wall if servers else None,
    )


async def nats_capacity(
    cluster: NatsCluster,
    plan: FleetPlan,
    play: Script,
    row: CapacityRow,
    window: float,
    tag: str,
    profile: cProfile.Profile | None = None,
) -> Capacity:
    """One capacity row; `profile` (one generator process only) runs over its window."""
    settings = sink_settings(cluster, f"CAP_{tag}")
    nc = await cluster.connect(error_cb=quiet)
    servers = [s.process.pid for s in cluster.servers if s.process is not None]
    try:
        await stream_ready(cluster, nc, settings)
        js = nc.jetstream(timeout=settings.timeout)

        async def stored() -> int:
            return int((await js.stream_info(settings.stream)).state.messages)

        stock = stock_per_node(row.nodes, plan.warmup_s + window, settings.max_batch)
        if row.processes == 1:
            nodes, ways = await flood_nodes(
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
                        measured = await capacity_window(
                            (plan.warmup_s, window), stored, time.process_time, servers, profile
                        )
                finally:
                    await flood.stop()
                made_late = flood.made_late
            finally:
                await ways.close()
        else:
            measured, made_late = await in_processes(
                settings, row, (plan.warmup_s, window), stored, servers, stock
            )
        await js.delete_stream(settings.stream)  # its files and duplicate window are no longer needed
    finally:
        await nc.close()
    return Capacity(
        sink="nats",
        nodes=row.nodes,
        connections=row.connections,
        processes=row.processes,
        max_in_flight=row.max_in_flight,
        batch=settings.max_batch,
        **vars(measured),
        made_late=made_late,
    )


async def flood_nodes(
    settings: NatsSinkSettings, count: int, connections: int, first: int, play: Script, give_up_s: float
) -> tuple[list[SimNode], NatsNodes]:
    """A capacity run's nodes, started (see `start_nodes`) before the clock."""
    ways = NatsNodes(settings, node_names(first, count), connections)
    try:
        sends = await ways.open()
        nodes = [SimNode(name, send, i) for i, (name, send) in enumerate(zip(ways.names, sends, strict=True))]
        await start_nodes(nodes, play, give_up_s)
    except BaseException:
        await ways.close()
        raise
    return nodes, ways


async def in_processes(
    settings: NatsSinkSettings,
    row: CapacityRow,
    window: tuple[float, float],
    stored: Callable[[], Awaitable[int]],
    servers: Sequence[int],
    stock: int,
) -> tuple[Window, int]:
    """The row's nodes and connections split over `row.processes` generator processes (this
    package's `flood` command), all started at once; their CPU is read from /proc. The window, and
    how many events the processes made while it ran."""
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

        measured = await capacity_window(window, stored, generators, servers)
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
    return measured, sum(int(out.split()[-1]) for out in late)


async def flood_command(
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
    sims, ways = await flood_nodes(settings, nodes, connections, first, play, FULL.give_up_s)
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
