"""Section 9, scale: the audit log (the file sink at its defaults) under a burst, then
`audit verify` on it (measured by bench/queues.py)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from bench.figures import rerun, verdict
from bench.queues import Audit, AuditRun, bench_audit
from bench.registry import Results, Section, part, section

__all__ = ["AUDIT", "AUDIT_PER_S", "AuditPlan"]

AUDIT_PER_S = 10_000


@dataclass(frozen=True)
class AuditPlan:
    events: int
    spread_s: float


def _run(plan: AuditPlan) -> Awaitable[Audit]:
    return bench_audit(plan.events, plan.spread_s)


AUDIT = section(
    Section(
        name="audit",
        title="the audit log under a 30,000-event burst",
        order=120,
        full=AuditPlan(events=30_000, spread_s=12.0),
        quick=AuditPlan(events=3_000, spread_s=1.2),
        run=_run,
        group="scale",
    )
)


def _contiguous(run: AuditRun) -> bool:
    v = run.verify
    return bool(v.rc == 0 and v.first == 1 and v.last == v.records == run.events)


@part((9, 3))
def render(results: Results) -> list[str]:
    a = results.get(AUDIT)
    if a is None:
        return []
    q, b = a.queued, a.burst
    burst_ok = b.dropped == 0 and _contiguous(b)
    return [
        "### The audit log under a burst",
        "",
        "The real Store, Dispatcher and SinkWorker, and the file sink as `build_sinks` makes it from its "
        f"default settings (fsync after every write, i.e. every delivered batch; the worker takes "
        f"{q.batch} event(s) at a time; max_queue {q.max_queue:,}), device events committed in "
        "chunks as cycles commit them. Then `pod-resources-watcher audit verify` on the log, as an "
        "operator runs it.",
        "",
        "| run | events | delivered | dropped | deepest queue | seconds | CPU s | events/s | audit verify | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| all queued at once, then the worker started (its own speed; no cap applies before the next commit) | "
        f"{q.events:,} | {q.delivered:,} | {q.dropped:,} | {q.deepest:,} | {q.seconds:.1f} | {q.cpu_s:.1f} | "
        f"{q.per_s:,.0f} | `{q.verify.says}` | {verdict(q.per_s >= AUDIT_PER_S and _contiguous(q))} "
        f"(>= {AUDIT_PER_S:,} events/s, verify contiguous) |",
        f"| {b.events:,} committed over {a.spread_s:g} s, the caps enforced after every commit as the "
        f"agent does | {b.events:,} | {b.delivered:,} | {b.dropped:,} | {b.deepest:,} | "
        f"{b.seconds:.1f} | {b.cpu_s:.1f} | {b.per_s:,.0f} | `{b.verify.says}` | {verdict(burst_ok)} "
        "(0 dropped, verify contiguous: records 1..N, N = all events) |",
        "",
        "Seconds: from the first commit (or the worker's start) to the last delivery. Each run stops "
        f"after {q.budget_s:g} s; events still queued then (left: queued {q.left:,}, burst "
        f"{b.left:,}) count as neither delivered nor dropped, and the log holds what was delivered.",
        "",
        "CPU s: the process's CPU time, every thread, over those seconds. In the queued run it is "
        f"{q.cpu_s / q.seconds:.0%} of them: one core's worth of Python under one GIL is what limits the log, "
        "not the disk (a delivered batch's fsyncs, the log's and the head file's, are a few ms of the "
        f"{q.batch / q.per_s * 1000:.0f} ms a batch of {q.batch} takes). By thread (cProfile): the outbox's "
        "thread takes and acks (each event's JSON decoded and its Event rebuilt, the queue rows deleted), the "
        "file sink's thread encodes, hashes and writes each record (one JSON encoding per record, about 10 us), "
        "and the event loop runs the worker between them.",
        "",
        rerun("audit"),
        "",
    ]
