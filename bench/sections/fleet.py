"""Section 10: simulated fleets' events into a real 3-node NATS JetStream cluster through the nats
sink's publishing code, beside the same load through the webhook sink (bench/fleet/)."""

from __future__ import annotations

from bench import fleet
from bench.fleet.report import render_fleet
from bench.fleet.results import FleetResult
from bench.registry import Results, Section, part, section

__all__ = ["FLEET"]

FLEET: Section[fleet.FleetPlan, FleetResult] = section(
    Section(
        name="fleet",
        title="simulated nodes' events into a 3-node NATS JetStream cluster, beside one webhook receiver",
        order=140,
        full=fleet.FULL,
        quick=fleet.QUICK,
        run=fleet.bench_fleet,
    )
)


@part((10, 0))
def render(results: Results) -> list[str]:
    f = results.get(FLEET)
    return [] if f is None else render_fleet(f)
