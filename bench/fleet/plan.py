"""How much of the fleet section runs: the full run's plan and the smoke run's (--quick)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CapacityRow", "FULL", "FleetPlan", "QUICK"]


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
