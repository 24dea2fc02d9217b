"""Section 9, scale: changed cycles, RSS and bytes written at 250 to ~450,000 pods, each size in
a process of its own (measured by bench/scale.py); and the chapter's head, which the queues'
parts (ack, audit, drain) follow."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable

from bench.figures import mib, ms, pct, rerun, verdict
from bench.registry import Results, Section, part, section
from bench.scale import FIT, NodeSize, Scale, ScaleSize, bench_scale

__all__ = ["NODES", "SCALE_GOAL_PODS", "SCALE_RSS_MIB", "SCALE_WALL_P99", "SCALE_WRITTEN"]

# The 10,000-pod node's goals.
SCALE_GOAL_PODS = 10_000
SCALE_WALL_P99 = 0.1
SCALE_RSS_MIB = 160
SCALE_WRITTEN = 1_000_000


def _run(sizes: tuple[ScaleSize, ...]) -> Awaitable[Scale]:
    return bench_scale(sizes)


NODES = section(
    Section(
        name="nodes",
        title="changed cycles, RSS and bytes written at 250 to ~450,000 pods",
        order=100,
        full=(
            ScaleSize(250, cycles=200),
            ScaleSize(2_500, cycles=100),
            ScaleSize(10_000, cycles=100),
            # The first full decode of ~450,000 pods takes minutes on a slow agent: no warm-up there.
            ScaleSize(FIT, cycles=10, warmup=0),
        ),
        quick=(
            ScaleSize(250, cycles=20),
            ScaleSize(2_500, cycles=20),
            ScaleSize(10_000, cycles=10, budget_s=20.0),
        ),
        run=_run,
        group="scale",
    )
)


@part((9, 0))
def head(results: Results) -> list[str]:
    return ["## 9. Scale", ""] if results.ran("nodes", "ack", "audit", "drain") else []


def _size_row(size: NodeSize) -> str:
    cpu, wall, written = size.cpu, size.wall, size.written
    pods = f"{size.pods:,}" + (" (fits the limit)" if size.fit else "")
    mean_written = sum(written) / len(written)
    return (
        f"| {pods} | {mib(size.list_bytes)} | {len(cpu)} | {ms(statistics.median(cpu))} | "
        f"{ms(pct(cpu, 99))} | {ms(statistics.median(wall))} | {ms(pct(wall, 99))} | "
        f"{mib(mean_written)} ({mib(max(written))}) | {size.rss_steady_mib:.1f} MiB | "
        f"{size.rss_peak_mib:.1f} MiB | {size.first_cycle_s:.1f} s |"
    )


def _goals(size: NodeSize) -> list[str]:
    wall_p99 = pct(size.wall, 99)
    written = sum(size.written) / len(size.written)
    return [
        f"Goals at {SCALE_GOAL_PODS:,} pods:",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| changed cycle, wall p99 | {ms(wall_p99)} | {verdict(wall_p99 <= SCALE_WALL_P99)} (<= {ms(SCALE_WALL_P99)}) |",
        f"| RSS, the peak (steady after the cycles) | {size.rss_peak_mib:.1f} MiB "
        f"({size.rss_steady_mib:.1f} MiB) | "
        f"{verdict(size.rss_peak_mib <= SCALE_RSS_MIB)} (peak <= {SCALE_RSS_MIB} MiB) |",
        f"| written per single-pod change, mean | {written / 1e6:.2f} MB | {verdict(written < SCALE_WRITTEN)} (< 1 MB) |",
        "",
    ]


@part((9, 1))
def render(results: Results) -> list[str]:
    s = results.get(NODES)
    if s is None:
        return []
    lines = [
        "### Node sizes",
        "",
        "The large node's shape (512 CPUs, 8 NUMA nodes, 4 x 64 devices, 4 containers per pod, DRA claims "
        "in 50 pods) at 250, 2,500 and 10,000 pods, and at the most pods whose List answer fits the "
        f"default `kubelet.max_receive_bytes` ({s.max_receive_bytes:,} bytes, less 64 KiB for the changes). Each size "
        "runs in a fresh process of its own (`bench/scale_agent.py`), so no other measurement's memory is "
        "in its RSS, against a fake kubelet in another (`bench/scale_kubelet.py`: every pod serialized "
        "once, the answers built ahead when the node changes and sent in a fresh pod order, so the "
        "simulator's Python is not in the agent's wall time; a real kubelet, in Go, builds them in "
        "milliseconds). A changed cycle: one pod gains a CPU at the kubelet (a single-pod change), then "
        "one complete re-query (both RPCs, decode, diff, the events and the new state committed): the "
        "whole process's CPU time (every thread, so the store's commit too) and its wall time. Bytes "
        "written: the process's `write_bytes` (/proc/self/io) across the cycle, which the kernel counts "
        "in 4 KiB pages as the page cache is dirtied: the outbox database, its WAL and index, checkpoints "
        "included in the cycles they fall in (the mean spreads them); the process writes no other file. "
        "RSS steady: after the cycles; peak: the high-water mark, the first full decode included.",
        "",
        "The pods' bytes repeat from answer to answer here (each serialized once), as a real kubelet "
        "lists a pod whose entries keep their order: the decoder takes such a pod unparsed, by a digest "
        "of its bytes, and a changed cycle moves only the changed pods. Where no pod's bytes repeat "
        "(every container's entries reordered on every answer) it parses every pod and its containers: "
        "`bench/decode_cases.py` measures the decoder in both cases.",
        "",
        f"Import floor (RSS of a fresh `python -m watcher` once its imports are done): {s.import_floor_mib:.1f} MiB.",
        "",
        "| pods | List answer | changed cycles | CPU p50 | CPU p99 | wall p50 | wall p99 | written per change, mean (max) | RSS steady | RSS peak | first full decode |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(_size_row(size) for size in s.sizes),
    ]
    goal_row = next((z for z in reversed(s.sizes) if z.pods == SCALE_GOAL_PODS and not z.fit), None)
    if not any(size.fit for size in s.sizes):
        lines.append(
            "| (the largest that fits: not run"
            + (" with --quick)" if results.quick else ")")
            + " | | | | | | | | | | |"
        )
    lines += [""]
    if goal_row is not None:
        lines += _goals(goal_row)
    return [*lines, rerun("nodes"), ""]
