"""Section 12: a real peer beside us. node-feature-discovery's nfd-topology-updater (built by
`make peers` from its Go module) and our agent, both running at once against the same kubelet
(kubelet-lite, then the fake), measured in one run by bench/peer_beside.py in a process of its
own: change to each tool's output, idle CPU, RSS, kubelet calls per minute. NVSentinel's
documented pod-resources poll interval is a reference row, not a measurement."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.figures import dur, rerun
from bench.harness import ROOT
from bench.registry import Results, Section, part, section

__all__ = ["NVSENTINEL_POLL_S", "PEER", "PeerPlan", "PeerRun", "bench_peer"]

# NVSentinel's documented pod-resources poll interval: a figure from its documentation.
NVSENTINEL_POLL_S = 30.0


@dataclass(frozen=True)
class PeerPlan:
    changes: int
    idle_s: float
    sleep_interval_s: float  # nfd's -sleep-interval (its default: 60 s)
    kubelets: str = "lite,fake"


@dataclass(frozen=True)
class PeerRun:
    data: dict[str, Any]  # bench/peer_beside.py's JSON


async def bench_peer(plan: PeerPlan) -> PeerRun:
    argv = [
        sys.executable,
        str(ROOT / "bench" / "peer_beside.py"),
        f"--changes={plan.changes}",
        f"--idle={plan.idle_s:g}",
        f"--sleep-interval={plan.sleep_interval_s:g}",
        f"--kubelets={plan.kubelets}",
    ]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, check=False, timeout=3600, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/peer_beside.py exited {done.returncode}: {done.stderr[-3000:]}")
    return PeerRun(json.loads(done.stdout))


PEER = section(
    Section(
        name="peer",
        title="nfd-topology-updater beside our agent against the same kubelet (kubelet-lite, the fake)",
        order=160,
        full=PeerPlan(changes=3, idle_s=120.0, sleep_interval_s=60.0),
        quick=PeerPlan(changes=1, idle_s=15.0, sleep_interval_s=5.0),
        run=bench_peer,
    )
)


def _delays(xs: Sequence[float | None]) -> str:
    seen = [x for x in xs if x is not None]
    if not xs:
        return "-"
    text = f"{dur(statistics.median(seen))} / {dur(max(seen))}" if seen else "none"
    missed = len(xs) - len(seen)
    return text + (f" ({missed} of {len(xs)} never shown)" if missed else "")


def _unhealthy(tool: dict[str, Any], ours: bool) -> str:
    xs = tool.get("unhealthy_s", [])
    if ours or not xs:
        return _delays(xs)
    shown = sum(tool.get("unhealthy_shown", []))
    return f"not shown: {shown} of {len(xs)} outputs differ (a rescan came after {_delays(xs)})"


def _rpcs(tool: dict[str, Any]) -> str:
    calls = tool.get("rpcs_per_min")
    if calls is None:
        return "not counted"
    listed = ", ".join(f"{m} {n:.1f}" for m, n in sorted(calls.items()) if n)
    return f"{sum(calls.values()):.1f}" + (f" ({listed})" if listed else "")


def _row(kubelet: str, name: str, tool: dict[str, Any], ours: bool) -> str:
    if tool.get("error"):
        return f"| {kubelet} | {name} | could not run: {tool['error']} | | | | | |"
    cpu = tool.get("idle_cpu_pct")
    rss = tool.get("rss_mib")
    return (
        f"| {kubelet} | {name} | {_delays(tool['added_s'])} | {_delays(tool['removed_s'])} | "
        f"{_unhealthy(tool, ours)} | {'-' if cpu is None else f'{cpu:.3f} %'} | "
        f"{'-' if rss is None else f'{rss:.1f} MiB'} | {_rpcs(tool)} |"
    )


@part((12, 0))
def render(results: Results) -> list[str]:
    run = results.get(PEER)
    if run is None:
        return []
    data = run.data
    lines = ["## 12. A real peer beside us: nfd-topology-updater", ""]
    if "error" in data:
        return [*lines, f"Not measured: {data['error']}.", "", rerun("peer"), ""]
    sleep = data["sleep_interval_s"]
    nfd = f"{data.get('nfd_version', 'nfd-topology-updater')} (-no-publish, -sleep-interval {sleep:g}s)"
    lines += [
        "node-feature-discovery's nfd-topology-updater, built by `make peers` from its Go module "
        "(peers/nfd/), and our agent (`python -m watcher run`, default settings, the stdout sink), "
        "each a process of its own, both running at once against the same kubelet: kubelet-lite "
        "(upstream's device manager and pod-resources server, our device plugin, 4 GPUs), then the "
        "fake kubelet in a process of its own. nfd reads every pod List shows from the API server "
        "(kube-testcluster, the pods created there first), scans on each kubelet state file "
        "rewritten (fsnotify) and on its timer, and logs the zones it would publish; "
        "GetAllocatableResources it reads once, at start. Delays run from the request to the "
        "kubelet to the tool's output: ours its event line, nfd the first zones record whose "
        "available counts differ from the one before (median / max). The changes are 1 s apart: "
        "back to back, ours' events came about 0.9 s late, which the spacing removes (its own RPC "
        "cap, 5 calls/s, refilling after the change before, not what this compares). Idle: each "
        "process's own "
        f"utime + stime (/proc/PID/stat) over {data['idle_s']:g} s with one GPU allocated, RSS at "
        "its end; kubelet calls per minute over the same window, at the fake (it tells the clients "
        "apart by gRPC user-agent; kubelet-lite counts nothing).",
        "",
        "| kubelet | tool | pod given a GPU | pod removed | its GPU unhealthy | idle CPU | RSS "
        "| kubelet calls / min (idle) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kubelet, tools in data["kubelets"].items():
        if "error" in tools:
            lines.append(f"| {kubelet} | both | not measured: {tools['error']} | | | | | |")
            continue
        lines.append(_row(kubelet, "ours", tools["ours"], True))
        lines.append(_row(kubelet, nfd, tools["nfd"], False))
    per_min = 60 / NVSENTINEL_POLL_S
    lines += [
        f"| - | NVSentinel (documented, not measured) | up to {NVSENTINEL_POLL_S:g} s | up to "
        f"{NVSENTINEL_POLL_S:g} s | up to {NVSENTINEL_POLL_S:g} s | - | - | {per_min:g} polls |",
        "",
        "The NVSentinel row is its documented pod-resources poll interval (30 s), not a measurement: "
        "a change is seen at its next poll. nfd's NodeResourceTopology has no device health, so a "
        "GPU turning unhealthy changes nothing it outputs; a pod removed rewrites no kubelet state "
        "file on kubelet-lite (nor on a kubelet), so nfd shows it only at its next timer scan.",
        "",
        rerun("peer"),
        "",
    ]
    return lines
