"""Section 11: a one-pod change on the 10,000-pod node through the kubelet's Pods API and Get,
beside the same change through the List path, in one run (bench/pods_path.py in a process of its
own, the kubelet in another): change to event, kubelet calls per change, and the agent's RSS once
it holds the watch's 10,000-pod snapshot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from bench.figures import p50_p99, pct, rerun, verdict
from bench.harness import ROOT
from bench.registry import Results, Section, part, section

__all__ = ["PODS_API", "PodsPlan", "PodsPaths", "bench_pods_api"]

GOAL_P99_S = 0.020
GOAL_RSS_MIB = 120.0


@dataclass(frozen=True)
class PodsPlan:
    pods: int
    changes: int


@dataclass(frozen=True)
class PodsPaths:
    pods: int
    floor_mib: float
    paths: dict[str, dict[str, Any]]  # "pods_api", "list": latency_s, rpcs, rss_mib


async def bench_pods_api(plan: PodsPlan) -> PodsPaths:
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            str(ROOT / "bench" / "pods_path.py"),
            "--pods",
            str(plan.pods),
            "--changes",
            str(plan.changes),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    data = json.loads(result.stdout)
    return PodsPaths(data["pods"], data["floor_mib"], {k: data[k] for k in ("pods_api", "list")})


PODS_API = section(
    Section(
        name="pods-api",
        title="a one-pod change through the Pods API and Get, beside the List path, at 10,000 pods",
        order=150,
        full=PodsPlan(pods=10_000, changes=200),
        quick=PodsPlan(pods=2_000, changes=20),
        run=bench_pods_api,
    )
)


def _rpcs(r: dict[str, Any]) -> str:
    calls = r["rpcs"]
    total = sum(calls.values())
    parts = ", ".join(f"{name} {n:g}" for name, n in calls.items() if n)
    return f"{total:g} ({parts})" if parts else "0"


@part((11, 0))
def render(results: Results) -> list[str]:
    p = results.get(PODS_API)
    if p is None:
        return []
    watch, listed = p.paths["pods_api"], p.paths["list"]
    xs, ys = watch["latency_s"], listed["latency_s"]
    ratio = pct(ys, 99) / pct(xs, 99) if pct(xs, 99) > 0 else float("inf")
    return [
        "## 11. The Pods API path",
        "",
        f"One pod's change on the large node's shape at {p.pods:,} pods (a pod with one exclusive CPU "
        "admitted, then removed: allocation.added, allocation.removed), seen by an agent watching the "
        "kubelet's Pods API (the watch names the pod, pod-resources Get reads it alone, the node totals "
        "are moved by that pod) and, in the same run, by an agent without it (the CPU manager's state "
        "file rewritten, then List and GetAllocatableResources of the whole node, decoded "
        "incrementally). The kubelet is the fake, in a process of its own, its List answers built "
        "ahead. Time from the kubelet's signal (the watch event's broadcast; the state file's rename) "
        "to the agent's stored event, both on the monotonic clock.",
        "",
        "| path | n | p50 | p99 | kubelet calls per change | RSS holding the node | goal |",
        "|---|---|---|---|---|---|---|",
        f"| Pods API + Get | {len(xs)} | {p50_p99(xs)} | {_rpcs(watch)} | {watch['rss_mib']:.1f} MiB "
        f"| p99 <= 20 ms: {verdict(pct(xs, 99) <= GOAL_P99_S)}; RSS <= 120 MiB after the "
        f"{p.pods:,}-pod snapshot: {verdict(watch['rss_mib'] <= GOAL_RSS_MIB)} |",
        f"| List (state-file trigger) | {len(ys)} | {p50_p99(ys)} | {_rpcs(listed)} | "
        f"{listed['rss_mib']:.1f} MiB | for reference |",
        "",
        f"p99 ratio, List to Pods API: {ratio:.1f}x. The floor (every module imported, nothing read) "
        f"is {p.floor_mib:.1f} MiB. Get calls per change are 0.5: an admitted pod is read, a removed "
        "one (DELETED) is taken out without a call.",
        "",
        *_tail(watch, listed),
        rerun("pods-api"),
        "",
    ]


def _tail(*paths: dict[str, Any]) -> list[str]:
    """What the slow changes of each path met: the GC's pauses and the disk's slow commits."""
    lines = []
    for label, r in zip(("Pods API + Get", "List"), paths, strict=True):
        t = r.get("tail")
        if t is None:
            continue
        pauses = t["gc_pauses_s"]
        over = sum(1 for x in r["latency_s"] if x > GOAL_P99_S)
        longest = f", longest {max(pauses) * 1000:.0f} ms" if pauses else ""
        lines.append(
            f"- {label}: {over} of {len(r['latency_s'])} changes over 20 ms (the Pods API path's goal); while they ran, "
            f"{len(pauses)} garbage-collector pauses over 10 ms{longest}, and {t['slow_commits']:g} of "
            f"{t['commits']:g} commits over 50 ms (one transaction and its fsync: the disk)."
        )
    if lines:
        lines = ["What the tail met (the profile of each p99):", "", *lines, ""]
    return lines
