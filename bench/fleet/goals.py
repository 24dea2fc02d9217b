"""The fleet section's goals, and its report's side-by-side table with their verdicts."""

from __future__ import annotations

from collections.abc import Sequence

from bench.figures import dur, ms, pct, verdict
from bench.fleet.results import Capacity, FleetResult

__all__ = ["FLEET_CAPACITY_GOAL", "FLEET_P99_GOAL", "capacity_goal_row", "render_goals"]

FLEET_CAPACITY_GOAL = 5_000.0
FLEET_P99_GOAL = 0.25


def capacity_goal_row(capacity: Sequence[Capacity]) -> Capacity | None:
    """The capacity goal's row: the most events/s into the cluster at the sink's defaults
    (max_in_flight 1). Each row is a lower bound of what the cluster takes, set by its generators."""
    rows = [c for c in capacity if c.sink == "nats" and c.max_in_flight == 1]
    return max(rows, key=lambda c: float(c.per_s), default=None)


def render_goals(f: FleetResult) -> list[str]:
    nats = [c for c in f.capacity if c.sink == "nats"]
    hook = next((c for c in f.capacity if c.sink == "webhook"), None)
    first = f.fleets[0] if f.fleets else None
    lines = ["### Side by side, and the goals", ""]
    if first is not None:
        ns, hs = first.steady, f.webhook.steady
        nb, hb = first.burst, f.webhook.burst
        same = [
            c
            for c in nats
            if hook is not None
            and (c.nodes, c.connections, c.processes, c.max_in_flight) == (hook.nodes, hook.connections, 1, 1)
        ]

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}x" if b else "—"

        lines += [
            "| measure | nats | webhook | nats / webhook |",
            "|---|---|---|---|",
        ]
        if same and hook is not None:
            lines.append(
                f"| sustained events/s ({hook.nodes:,} nodes) | {same[0].per_s:,.0f} | "
                f"{hook.per_s:,.0f} | {ratio(same[0].per_s, hook.per_s)} |"
            )
        for label, a, b in (
            (f"{ns.nodes:,} nodes, steady: p50", ns, hs),
            (f"{ns.nodes:,} nodes, steady: p99", ns, hs),
            (f"{nb.nodes:,} nodes, burst: p99", nb, hb),
        ):
            if not a.latency or not b.latency:
                continue
            q = 50 if label.endswith("p50") else 99
            x, y = pct(a.latency, q), pct(b.latency, q)
            lines.append(f"| {label} | {dur(x)} | {dur(y)} | {ratio(x, y)} |")
        lines.append("")
    goal_rows = ["| goal | measured | verdict |", "|---|---|---|"]
    best = capacity_goal_row(nats)
    if best is not None:
        goal_rows.append(
            f"| >= {FLEET_CAPACITY_GOAL:,.0f} events/s sustained into the 3-node cluster | "
            f"{best.per_s:,.0f} ({best.nodes:,} nodes, {best.connections:,} connections, "
            f"{best.processes} generator process{'es' if best.processes > 1 else ''}, max_in_flight 1: "
            "the best row of the capacity table) | "
            f"{verdict(best.per_s >= FLEET_CAPACITY_GOAL)} |"
        )
    if first is not None and first.steady.latency:
        p99 = pct(first.steady.latency, 99)
        goal_rows.append(
            f"| publish to consumer p99 <= {ms(FLEET_P99_GOAL)} at the {first.steady.nodes:,}-node rate "
            f"| {dur(p99)} | {verdict(p99 <= FLEET_P99_GOAL)} |"
        )
    o = f.failover
    if o.killed is not None:
        goal_rows.append(
            f"| 0 lost and 0 duplicated in the stream across the leader kill | {o.lost:,} lost, "
            f"{o.duplicated:,} duplicated | {verdict(o.lost == 0 and o.duplicated == 0)} |"
        )
    return [*lines, *goal_rows, ""]
