"""Section 9, scale: what acknowledging a delivery costs as a sink's queue grows
(measured by bench/queues.py)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.figures import ms, rerun, verdict
from bench.queues import Ack, bench_ack
from bench.registry import Results, Section, part, section

__all__ = ["ACK", "ACK_RATIO", "AckPlan"]

ACK_RATIO = 2.0


@dataclass(frozen=True)
class AckPlan:
    depths: tuple[int, ...]
    reps: int


async def _run(plan: AckPlan) -> Ack:
    return bench_ack(plan.depths, plan.reps)


ACK = section(
    Section(
        name="ack",
        title="ack cost as a queue grows",
        order=110,
        full=AckPlan(depths=(10, 10_000, 100_000), reps=30),
        quick=AckPlan(depths=(10, 10_000, 100_000), reps=10),
        run=_run,
        group="scale",
    )
)


@part((9, 2))
def render(results: Results) -> list[str]:
    a = results.get(ACK)
    if a is None:
        return []
    lines = [
        "### Acknowledging a delivery as the queue grows",
        "",
        "`OutboxDatabase.queues.ack` (which also prunes the events no sink needs any more), called as a worker "
        f"calls it after a delivery, with one sink's queue this deep: for one event and for one batch "
        f"(the sinks' default max_batch, {a.batch}, or the whole queue if shorter). Wall time (the "
        "commit's fsync included: what the worker waits for) and the thread's CPU time, medians of "
        f"{a.reps}; the queue is topped up after each ack (not timed), so each one sees the same depth.",
        "",
        "| queued | ack one event: wall | CPU | ack a batch: wall | CPU |",
        "|---|---|---|---|---|",
    ]
    for depth, t in a.depths.items():
        lines.append(
            f"| {depth:,} | {ms(t.one.wall)} | {ms(t.one.cpu)} | {ms(t.batch.wall)} | {ms(t.batch.cpu)} |"
        )
    keys = sorted(a.depths)
    lo, hi = a.depths[keys[0]], a.depths[keys[-1]]
    ratio = hi.one.wall / max(lo.one.wall, 1e-9)
    batch_ratio = hi.batch.wall / max(lo.batch.wall, 1e-9)
    return [
        *lines,
        "",
        f"Ack at {keys[-1]:,} / ack at {keys[0]:,} (wall medians): one event {ratio:.1f}x, "
        f"a batch {batch_ratio:.1f}x. Goal: <= {ACK_RATIO:g}x for one event: {verdict(ratio <= ACK_RATIO)}.",
        "",
        rerun("ack"),
        "",
    ]
