"""The stream leader killed (SIGKILL) mid-load and restarted on its store: every node retries until
its events are stored, then the stream is read back."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from bench.fleet.connections import NatsNodes, quiet, setup_frozen, sink_settings, start_nodes
from bench.fleet.nodes import Fleet, Ledger
from bench.fleet.phases import node_names, stream_ready
from bench.fleet.plan import FleetPlan
from bench.fleet.reader import Reader, latency, stream_check
from bench.fleet.results import Failover
from bench.fleet.script import Script
from testkit.nats_cluster import NatsCluster

__all__ = ["failover"]


async def failover(
    cluster: NatsCluster, plan: FleetPlan, play: Script, say: Callable[[str], None] = lambda _: None
) -> Failover:
    """A run during which the stream's leader is killed (SIGKILL) and later restarted."""
    settings = sink_settings(cluster, "FAILOVER")
    ways = NatsNodes(settings, node_names(0, plan.failover_nodes), plan.max_connections)
    reader_nc = await cluster.connect(error_cb=quiet)
    ledger = Ledger()
    killed: dict[str, Any] = {}
    try:
        await stream_ready(cluster, reader_nc, settings)
        reader = Reader(reader_nc, settings.stream, ledger.received)
        await reader.start()
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=7)
        for node_name, send in zip(ways.names, await ways.open(), strict=True):
            fleet.add(node_name, send)
        started, _, _ = await start_nodes(fleet.nodes, play, plan.give_up_s)
        await reader.settled(started)

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
            say(
                f"leader kill: retries through ({ledger.retries} retries, {ledger.abandoned} abandoned, "
                f"errors {dict(ledger.errors.most_common(3))}); until the reader has every event"
            )
            await reader.caught_up(ids, 60)
        end_lag = await reader.end_lag()
        await reader.stop()
        say("leader kill: reading the stream back")
        check = await stream_check(cluster, settings.stream, [*started, *ids])
    finally:
        await reader_nc.close()
        await ways.close()
    stalls = [ledger.stored[i] - ledger.sent[i] for i in ids if i in ledger.stored]
    acks = sorted(ledger.stored.values())
    return Failover(
        nodes=plan.failover_nodes,
        connections=ways.connections,
        shared=ways.shared,
        rate=plan.failover_rate,
        seconds=plan.failover_s,
        events=len(ids),
        killed=killed.get("server"),
        new_leader=killed.get("new_leader"),
        kill_at_s=killed["at"] - t0 if killed else None,
        down_s=killed["restart_at"] - killed["at"] if killed else None,
        rejoin_s=killed["healthy_at"] - killed["restart_at"] if killed else None,
        max_stall=max(stalls, default=0.0),
        # The longest time in which nothing at all was acknowledged while the run lasted.
        ack_gap=max((b - a for a, b in itertools.pairwise(acks)), default=0.0),
        latency=tuple(latency(ids, ledger)),
        received=sum(1 for i in ids if i in ledger.received),
        deliveries=reader.deliveries,
        lag_max=reader.max_lag(t0, time.monotonic()),
        lag_end=end_lag,
        retries=ledger.retries,
        abandoned=ledger.abandoned,
        errors=dict(ledger.errors.most_common(4)),
        **vars(check),
    )
