"""Section 13: the agent on upstream's kubelet (bench/real_kubelet.py): a device health flip at
our device plugin and at upstream's DRA test driver to the stored event, split at the Pods API; a
pod created in the API server to its allocation.added; the agent's idle CPU and RSS as a process
watching that node. The same flip at kubelet-lite and at the fake, in the same run, beside it;
sections 2 and 12's figures too when they ran in the same run."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from bench.figures import mib, ms, pct, rerun
from bench.real_flips import FlipSeries
from bench.real_kubelet import RealKubeletPlan, RealKubeletRun, bench_real_kubelet
from bench.registry import Results, Section, part, section
from bench.sections.change import CHANGE, TRIGGERS
from bench.sections.peer import PEER
from watcher.settings import PodsSettings, WatchSettings

__all__ = ["REAL_KUBELET", "render"]

REAL_KUBELET = section(
    Section(
        name="real-kubelet",
        title="the agent on upstream's kubelet: device and DRA flips, a pod's creation, idle CPU and RSS",
        order=170,
        full=RealKubeletPlan(flips=20, pods=20, idle_s=60.0, ref_flips=10),
        quick=RealKubeletPlan(flips=5, pods=5, idle_s=15.0, ref_flips=3),
        run=bench_real_kubelet,
    )
)

_ROWS = (
    ("plugin", "real kubelet", "device plugin GPU held by a pod"),
    ("dra", "real kubelet", "DRA device of a Job's claim"),
    ("lite", "kubelet-lite", "device plugin GPU held by a pod"),
    ("fake", "fake", "GPU held by a pod"),
)
_DIRECTIONS = (("unhealthy", "to unhealthy"), ("healthy", "back to healthy"))


def _p(xs: Sequence[float]) -> str:
    """Two cells: median and p99 (nearest rank), or dashes without samples."""
    return f"{ms(statistics.median(xs))} | {ms(pct(xs, 99))}" if xs else "- | -"


def _reasons(reasons: Sequence[str]) -> str:
    return ", ".join(f"{r} ({n})" for r, n in Counter(reasons).most_common())


def _split(s: FlipSeries) -> tuple[list[float], list[float], int]:
    """The kubelet's part, ours (the rest), and how many flips the Pods API never showed."""
    kubelet = [k for k in s.kubelet if k is not None]
    ours = [t - k for t, k in zip(s.total, s.kubelet, strict=True) if k is not None]
    return kubelet, ours, len(s.kubelet) - len(kubelet)


def _flip_rows(run: RealKubeletRun) -> list[str]:
    lines = [
        "| kubelet | device | flip | n | flip to stored p50 | p99 | kubelet's part: to the Pods API p50 | p99 "
        "| ours: Pods API to stored p50 | p99 | the re-query that stored it, by trigger |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, kubelet, device in _ROWS:
        if key not in run.flips:
            why = run.errors.get("real" if kubelet == "real kubelet" else key) or run.errors.get("all")
            if why is not None:
                lines.append(f"| {kubelet} | {device} | not measured: {why} | | | | | | | | |")
            continue
        for way, flip in _DIRECTIONS:
            s = run.flips[key][way]
            part, ours, unseen = _split(s)
            note = f" ({unseen} not shown)" if unseen and key in ("plugin", "dra") else ""
            lines.append(
                f"| {kubelet} | {device} | {flip} | {len(s.total)} | {_p(s.total)} | {_p(part)}{note} "
                f"| {_p(ours)} | {_reasons(s.reasons)} |"
            )
    return lines


def _same_run(results: Results) -> list[str]:
    """Sections 2 and 12's figures for the stand-ins, when they ran in this run."""
    out: list[str] = []
    change = results.get(CHANGE)
    if change is not None and change.latency.get(TRIGGERS):
        xs = change.latency[TRIGGERS]
        out.append(
            f"- Section 2 (the fake, the same flip, in this run): n = {len(xs)}, p50 "
            f"{ms(statistics.median(xs))}, p99 {ms(pct(xs, 99))}."
        )
    peer = results.get(PEER)
    kubelets = {} if peer is None else peer.data.get("kubelets", {})
    for label, tools in kubelets.items():
        ours = tools.get("ours", {}) if isinstance(tools, dict) else {}
        if ours.get("idle_cpu_pct") is not None and ours.get("rss_mib") is not None:
            per_min = ours["idle_cpu_pct"] / 100 * 60
            out.append(
                f"- Section 12 (the agent as a process against {label}, one pod holding a GPU, "
                f"in this run): idle {per_min:.2f} s of CPU per minute, RSS {ours['rss_mib']:.1f} MiB."
            )
    return out


def _limits(run: RealKubeletRun) -> list[str]:
    """What bounds our part, said only where the measured triggers show it."""
    out: list[str] = []
    step = WatchSettings().step
    plugin = run.flips.get("plugin")
    if plugin is not None:
        reasons = [*plugin["unhealthy"].reasons, *plugin["healthy"].reasons]
        if sum(r.startswith("state-file") for r in reasons) > len(reasons) / 2:
            part, _, _ = _split(plugin["unhealthy"])
            seen = f" (p50 {ms(statistics.median(part))} after the flip)" if part else ""
            out.append(
                "Device plugin flips: the real kubelet shows the GPU's new health in the holding "
                f"pod's status on the Pods API within milliseconds{seen}, but that status change "
                "only starts the agent's status look (no kubelet call): device.removed and "
                "device.added come from GetAllocatableResources, re-read when the device manager's "
                "checkpoint rewrite reaches the directory watch, one to two steps later "
                f"({step * 1000:g} to {2 * step * 1000:g} ms at the default `[watch] step`). That "
                "step is most of our part here, as at kubelet-lite and the fake."
            )
    dra = run.flips.get("dra")
    if dra is not None:
        reasons = [*dra["unhealthy"].reasons, *dra["healthy"].reasons]
        if sum(r == "pod-status" for r in reasons) > len(reasons) / 2:
            gather = PodsSettings().status_gather
            out.append(
                "DRA flips: the verdict comes only through the Pods API (the pod's status), and "
                f"the agent gathers pod-status changes for `[pods] status_gather` ({gather * 1000:g} "
                "ms by default, so a driver's verdict spreading over many pods is one look) before "
                "it looks: that wait is most of our part."
            )
    return out


def _creates(run: RealKubeletRun) -> list[str]:
    p = run.pods
    if p is None:
        return []
    seen = [x for x in p.pods_api if x is not None]
    return [
        "| n | create to allocation.added stored p50 | p99 | create to its first Pods API event p50 "
        "| p99 | the create call alone p50 | p99 | the re-query that stored it, by trigger |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(p.stored)} | {_p(p.stored)} | {_p(seen)} | {_p(p.post)} | {_reasons(p.reasons)} |",
    ]


def _idle(run: RealKubeletRun, plan: RealKubeletPlan) -> list[str]:
    i = run.idle
    if i is None:
        return []
    per_min = i.cpu_s / i.wall_s * 60
    return [
        "| kubelet | pods on the node | window | CPU | CPU per minute | share of one core | RSS | "
        "events stored in the window |",
        "|---|---|---|---|---|---|---|---|",
        f"| real kubelet | {i.pods} ({plan.pods} holding a GPU, 1 a DRA claim) | {i.wall_s:.0f} s | "
        f"{i.cpu_s:.2f} s | {per_min:.2f} s | {100 * i.cpu_s / i.wall_s:.3f} % | "
        f"{mib(i.rss_mib * 2**20)} | {i.events} |",
    ]


@part((13, 0))
def render(results: Results) -> list[str]:
    run = results.get(REAL_KUBELET)
    if run is None:
        return []
    plan = run.plan
    lines = ["## 13. On the real kubelet", ""]
    if "all" in run.errors:
        return [*lines, f"Not measured: {run.errors['all']}.", "", rerun("real-kubelet"), ""]
    lines += [
        "Upstream's code end to end, built by `make peers`: kube-testcluster (etcd and "
        "kube-apiserver), kube-controllers (upstream's kube-scheduler, resourceclaim and Job "
        "controllers) and a node of upstream's whole kubelet (v1.37.2, its real container manager, "
        "on upstream's fake CRI), with our device plugin (the `example.com/gpu` resource) and "
        "upstream's DRA test driver registered with it. The DRA device is allocated by the real "
        "scheduler: a Job whose pod takes a claim from a ResourceClaimTemplate, as a user sets it "
        "up (no allocation written as admin). The agent runs in the bench's process with default "
        "settings and the audit file sink; a flip is timed from the call that makes it (the "
        "plugin's ListAndWatch update; the driver's health report) to the agent's event stored "
        "(committed to the outbox). A second client of the kubelet's Pods API in the same process "
        "stamps every pod event as it arrives: the kubelet's part ends when the holding pod's "
        "status shows the new health there, ours is the rest. Flips 1 to 1.5 s apart, at random, "
        f"{plan.flips} each way on the real kubelet, {plan.ref_flips} each way at the stand-ins "
        "(kubelet-lite with the same device plugin; the fake, as in section 2), one after the "
        "other in this run. Percentiles are nearest-rank: under 100 samples, p99 is the maximum. "
        f"The machine's 1-minute load average was {run.load[0]:.2f} when the run began and "
        f"{run.load[1]:.2f} when it ended (2 cores: anything above 2 waited for one).",
        "",
        *_flip_rows(run),
        "",
    ]
    for said in _limits(run):
        lines += [said, ""]
    same = _same_run(results)
    if same:
        lines += ["The stand-ins in the other sections of this run:", "", *same, ""]
    if run.pods is not None:
        lines += [
            "### A pod's creation to its event",
            "",
            f"{len(run.pods.stored)} pods, each with one GPU and bound by `spec.nodeName`, created one "
            "at a time through the API server (lightkube, as the admin), each timed from the create "
            "call (its own time is a column) to the agent's allocation.added for it stored; the "
            "kubelet admits the pod (the device manager allocates), the Pods API tells of it, the "
            "agent reads that pod alone with pod-resources Get.",
            "",
            *_creates(run),
            "",
        ]
    if run.idle is not None:
        lines += [
            "### Idle: the agent as a process",
            "",
            "`python -m watcher run` with default settings (the timer every 30 s ± 10%, state-file "
            "triggers, the Pods API watch, the HTTP server on loopback, unscraped) and the audit "
            "file sink, watching that node; the window opens "
            "5 s after /readyz first says its Pods API watch is live. CPU: its utime + stime "
            "(/proc/PID/stat, every thread, in 1/100 s ticks); RSS at the window's end (the dev venv).",
            "",
            *_idle(run, plan),
            "",
        ]
    for name, why in run.errors.items():
        if name == "real" and not run.flips.get("plugin"):
            continue  # said in the table
        if name in ("lite", "fake"):
            continue  # said in the table
        lines += [f"Not measured ({name}): {why}", ""]
    lines += [
        "Reproduce: `.venv/bin/python bench/run.py --only real-kubelet` (prints it; "
        "`--output FILE` writes it); needs `make peers`.",
        "",
    ]
    return lines
