"""The fleet section's run: the fleets, the capacity rows, the leader kill, the profiles, the
webhook beside them."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.fleet.capacity import nats_capacity
from bench.fleet.failover import failover
from bench.fleet.phases import nats_fleet
from bench.fleet.plan import FleetPlan
from bench.fleet.profiles import profiles_of_goals_not_met
from bench.fleet.results import Capacity, FleetResult, FleetRun, ScriptKinds, Started
from bench.fleet.script import script
from bench.fleet.webhook import webhook_capacity, webhook_fleet
from testkit.nats_cluster import running_cluster

__all__ = ["bench_fleet", "median_run"]


async def bench_fleet(plan: FleetPlan) -> FleetResult:
    say = _Progress()
    play = script()
    fleets: list[FleetRun] = []
    connect: list[Started] = []
    capacity: list[Capacity] = []
    profiles: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="prw-fleet-", dir="/tmp") as tmp:
        async with running_cluster(Path(tmp)) as cluster:
            for nodes in plan.fleets:
                say(f"{nodes:,} nodes into the cluster")
                started, result = await nats_fleet(cluster, plan, play, nodes, str(nodes))
                connect.append(started)
                fleets.append(result)
            for i, row in enumerate(plan.capacity):
                say(
                    f"capacity: {row.nodes:,} nodes, {row.connections:,} connections, "
                    f"{row.processes} generator process(es), max_in_flight {row.max_in_flight}"
                )
                runs = [
                    await nats_capacity(cluster, plan, play, row, plan.capacity_s, f"{i}_{k}")
                    for k in range(plan.capacity_runs)
                ]
                capacity.append(median_run(runs))
            say("leader kill")
            killed = await failover(cluster, plan, play, say)
            if plan.profile_s > 0:
                say("profiles of goals not met, if any")
                profiles = await profiles_of_goals_not_met(cluster, plan, play, capacity, fleets)
    say("webhook")
    webhook = await webhook_fleet(plan, play)
    say("webhook capacity")
    window = (plan.warmup_s, plan.capacity_s)
    runs = [await webhook_capacity(play, plan.capacity[0], window) for _ in range(plan.capacity_runs)]
    capacity.append(median_run(runs))
    say("done")
    return FleetResult(
        plan=plan,
        script=ScriptKinds(
            steady=tuple(tuple(str(c.kind) for c in cycle.changes) for cycle in play.steady),
            burst=tuple(f"{c.kind} ({c.severity})" for c in play.burst.changes),
            mean_events=play.mean_events,
        ),
        fleets=tuple(fleets),
        connect=tuple(connect),
        capacity=tuple(capacity),
        failover=killed,
        webhook=webhook,
        profiles=profiles,
    )


def median_run(runs: Sequence[Capacity]) -> Capacity:
    """A capacity row's median run (by events/s), with every run's events/s beside it."""
    ranked = sorted(runs, key=lambda r: r.per_s)
    return dataclasses.replace(ranked[(len(ranked) - 1) // 2], runs=tuple(r.per_s for r in runs))


class _Progress:
    """A line on stderr per step, with the time since the section started (as the driver, bench/run.py, does per section)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, what: str) -> None:
        print(f"bench: fleet: {what} (at {time.monotonic() - self.t0:.0f} s)", file=sys.stderr, flush=True)
