"""A fleet at the realistic rate, then the burst, into a stream of its own: its steady and burst rows."""

from __future__ import annotations

import time

from nats.aio.client import Client

from bench.fleet.connections import NatsNodes, quiet, setup_frozen, sink_settings, start_nodes
from bench.fleet.nodes import Fleet, Ledger
from bench.fleet.plan import FleetPlan
from bench.fleet.reader import Reader, phase_row, stream_check
from bench.fleet.results import Arrivals, FleetRun, Phase, Started
from bench.fleet.script import Script
from testkit.nats_cluster import NatsCluster
from watcher.sinks.nats import (
    NatsSinkSettings,
    ensure_stream,
)

__all__ = ["nats_fleet", "node_names", "stream_ready"]


async def nats_fleet(
    cluster: NatsCluster, plan: FleetPlan, play: Script, nodes: int, name: str
) -> tuple[Started, FleetRun]:
    """`nodes` simulated nodes at the realistic rate, then the burst, into a stream of their own."""
    settings = sink_settings(cluster, name)
    ways = NatsNodes(settings, node_names(0, nodes), plan.max_connections)
    reader_nc = await cluster.connect(error_cb=quiet)
    ledger = Ledger()
    try:
        await stream_ready(cluster, reader_nc, settings)
        reader = Reader(reader_nc, settings.stream, ledger.received)
        await reader.start()
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=nodes)
        for node_name, send in zip(ways.names, await ways.open(), strict=True):
            fleet.add(node_name, send)
        started, start_s, rss = await start_nodes(fleet.nodes, play, plan.give_up_s)
        await reader.settled(started)
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
        check = await stream_check(cluster, settings.stream, [*started, *steady, *burst])
    finally:
        await reader_nc.close()
        await ways.close()

    def phase(arrivals: Arrivals, since: float, until: float, burst_nodes: int = 0) -> Phase:
        return Phase(
            sink="nats",
            nodes=nodes,
            connections=ways.connections,
            retries=ledger.retries,
            abandoned=ledger.abandoned,
            stored=check.stored,
            lost=check.lost,
            duplicated=check.duplicated,
            out_of_order=check.out_of_order,
            **vars(arrivals),
            lag_max=reader.max_lag(since, until),
            lag_end=end_lag,
            burst_nodes=burst_nodes,
        )

    return Started(nodes, ways.connections, ways.shared, start_s, rss), FleetRun(
        steady=phase(phase_row(steady, ledger, plan.steady_s, t0), t0, t1),
        burst=phase(
            phase_row(burst, ledger, None, t1), t1, t2, burst_nodes=len(burst) // len(play.burst.changes)
        ),
    )


async def stream_ready(cluster: NatsCluster, nc: Client, settings: NatsSinkSettings) -> None:
    """The run's stream, made by the sink's `ensure_stream` (which waits for its leader)."""
    await ensure_stream(nc.jetstream(timeout=settings.timeout), settings, "gpu-node-00000")
    await cluster.stream_leader(settings.stream)


def node_names(first: int, count: int) -> list[str]:
    return [f"gpu-node-{i:05d}" for i in range(first, first + count)]
