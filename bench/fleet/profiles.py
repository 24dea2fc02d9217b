"""A short run of each fleet goal not met, under cProfile: the top entries by own time."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.figures import pct
from bench.fleet.capacity import nats_capacity
from bench.fleet.goals import FLEET_CAPACITY_GOAL, FLEET_P99_GOAL, capacity_goal_row
from bench.fleet.phases import nats_fleet
from bench.fleet.plan import CapacityRow, FleetPlan
from bench.fleet.results import Capacity, FleetRun
from bench.fleet.script import Script
from testkit.nats_cluster import NatsCluster

__all__ = ["profiled", "profiles_of_goals_not_met", "top_entries"]


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


async def profiles_of_goals_not_met(
    cluster: NatsCluster,
    plan: FleetPlan,
    play: Script,
    capacity: Sequence[Capacity],
    fleets: Sequence[FleetRun],
) -> dict[str, list[str]]:
    """A short run of each goal not met, under cProfile."""
    profiles = {}
    best = capacity_goal_row(capacity)
    if best is not None and best.per_s < FLEET_CAPACITY_GOAL:
        # In this process, so that the generator is in the profile, with the servers it drives.
        row = CapacityRow(best.nodes, best.connections, best.max_in_flight)
        label = (
            f"capacity, {row.nodes:,} nodes, {row.connections:,} connections, one process, "
            f"over a {plan.profile_s:g} s window"
        )
        # Over its window only: not the setup, nor the events made before the clock.
        profile = cProfile.Profile()
        await nats_capacity(cluster, plan, play, row, plan.profile_s, "PROFILE", profile)
        profiles[label] = top_entries(profile)
    first = fleets[0].steady if fleets else None
    if first is not None and first.latency and pct(first.latency, 99) > FLEET_P99_GOAL:
        profiles["publish to consumer"] = await profiled(
            lambda: nats_fleet(cluster, plan, play, plan.fleets[0], "PROFILE")
        )
    return profiles
