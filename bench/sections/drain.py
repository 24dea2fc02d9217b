"""Section 9, scale: a webhook's full queue draining after its receiver's outage
(measured by bench/queues.py)."""

from __future__ import annotations

from collections.abc import Awaitable

from bench.figures import rerun, verdict
from bench.queues import Drain, bench_drain
from bench.registry import Results, Section, part, section

__all__ = ["DRAIN", "DRAIN_PER_S"]

DRAIN_PER_S = 1_000


def _run(_plan: None) -> Awaitable[Drain]:
    return bench_drain()


DRAIN = section(
    Section(
        name="drain",
        title="a webhook's queue after its receiver's outage",
        order=130,
        full=None,
        quick=None,
        run=_run,
        group="scale",
    )
)


@part((9, 4))
def render(results: Results) -> list[str]:
    d = results.get(DRAIN)
    if d is None:
        return []
    return [
        "### Draining after a receiver outage",
        "",
        f"{d.events:,} events (a sink's default max_queue: a full queue) queued for a webhook sink "
        "(batches of 500, 1,000 messages/s, as in section 6) while its aiohttp receiver on loopback is "
        "down; once the worker has failed and the outage has lasted its time, the receiver comes up on the "
        "same port. Events/s from the first receipt to the last; the wait before the first receipt is "
        "the worker's retry backoff, shown apart.",
        "",
        "| queued | dropped | outage | retries | wait for the next retry | drain | events/s | events/s from the receiver's return | goal |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {d.queued_at_up:,} | {d.dropped:,} | {d.outage_s:.1f} s | {d.retries} | "
        f"{d.wait_s:.2f} s | {d.drain_s:.2f} s | {d.per_s:,.0f} | {d.per_s_from_up:,.0f} | "
        f"{verdict(d.per_s >= DRAIN_PER_S and d.dropped == 0)} (>= {DRAIN_PER_S:,} events/s) |",
        "",
        rerun("drain"),
        "",
    ]
