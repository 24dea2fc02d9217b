"""Section 8: kubelet restarts with a realistic warm-up (plugins re-registering over 0.5-2 s,
pods reappearing over 0.5 s): the settled report beside the floor, false alarms, and a health
flip reported while another resource is held."""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from bench.figures import ms, p50_p99, pct, verdict
from bench.harness import GPU, NIC, Watch, run_agent, settings_for, stop_agent
from bench.registry import Results, Section, part, section
from watcher.app import Agent
from watcher.model.changes import Kind
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sim.fake_plugins import Warmup as PluginWarmup

__all__ = ["WARMUP", "Warmup", "WarmupPlan", "bench_warmup"]


@dataclass(frozen=True)
class WarmupPlan:
    restarts: int
    flips: int


@dataclass(frozen=True)
class Warmup:
    floor: tuple[float, ...]  # restart to the last plugin back, seconds
    settled: tuple[float, ...]  # restart to the agent's settled report
    false_alarms: int  # events other than kubelet.restarted
    flip: tuple[float, ...]  # a NIC's flip to its event while the GPUs are held
    still_held: bool
    flip_by: tuple[str, ...] = ()  # what started the re-query that reported each flip


def _started_by(reasons: frozenset[str]) -> str:
    if any(r.startswith("state-file:") for r in reasons):
        return "the checkpoint's rewrite"
    if "pod-status" in reasons:
        return "the Pods API's pod-status event"
    return "the hold's look (every 1 s)" if reasons <= {"timer"} else "other: " + ",".join(sorted(reasons))


async def bench_warmup(restarts: int, flips: int) -> Warmup:
    """Restarts whose plugins re-register over 0.5-2 s (and pods reappear over 0.5 s): from the
    restart to the agent's settled report, beside the floor (the last plugin back); events that
    were not the restart (false alarms); and a health flip of a NIC while the GPUs' plugin is away."""
    floor: list[float] = []
    settled: list[float] = []
    flip: list[float] = []
    flip_by: list[str] = []
    false_alarms = 0
    with tempfile.TemporaryDirectory(prefix="prw-b8-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake = FakeKubelet(root / "kubelet", default_node(), seed=8)
        await fake.start()
        agent = Agent(settings_for(root, fake))
        watch = Watch(agent)
        task = await run_agent(agent)
        await watch.until(lambda: bool(watch.events), 20)
        fake.plugins.warmup = PluginWarmup(plugin_delay=(0.5, 2.0), pods_delay=(0.0, 0.5))
        registered: list[float] = []
        fake.plugins.on_register = lambda _resource: registered.append(time.monotonic())
        for _ in range(restarts):
            mark = len(watch.events)
            registered.clear()
            t0 = time.monotonic()
            await fake.restart(downtime=0.1)
            await watch.until(lambda: watch.saw(Kind.KUBELET_RESTARTED, mark), 30)
            await watch.until(lambda: not agent.settling.holding, 60)
            settled.append(time.monotonic() - t0)
            await fake.plugins.wait_settled()
            floor.append(max(registered) - t0)
            false_alarms += sum(1 for _, e in watch.events[mark:] if e.kind != Kind.KUBELET_RESTARTED)
            await asyncio.sleep(0.5)
        # A NIC's health flips while the GPUs' plugin is away (held): reported at once.
        fake.plugins.restart_plugin(GPU, downtime=None)
        await watch.until(lambda: GPU in agent.settling.held_resources(), 10)
        nic = sorted(i for r, i in fake.node.devices if r == NIC)[0]
        rng = random.Random(8)
        for i in range(flips):
            # Under our own RPC cap (5 in any second): while held, a flip costs two whole-node
            # re-queries (its pod-status event's, the checkpoint's) beside the hold's look every
            # 1 s, so flips 1 s apart asked 6/s and the cap's wait was their tail (up to 0.5 s).
            # At random points, so the flips are not in step with the hold's look.
            await asyncio.sleep(rng.uniform(1.5, 2.0))
            mark = len(watch.events)
            want = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
            t0 = time.monotonic()
            fake.set_healthy(NIC, nic, healthy=i % 2 == 1)
            await watch.until(lambda: watch.saw(want, mark), 30)
            seen = next(t for t, e in watch.events[mark:] if e.kind == want)
            flip.append(seen - t0)
            await watch.until(lambda: bool(watch.cycles) and watch.cycles[-1][0] >= seen, 10)
            flip_by.append(_started_by(watch.reasons_at(seen)))
        still_held = GPU in agent.settling.held_resources()
        await stop_agent(agent, task)
        await fake.stop(remove_socket=True)
    return Warmup(tuple(floor), tuple(settled), false_alarms, tuple(flip), still_held, tuple(flip_by))


def _run(plan: WarmupPlan) -> Awaitable[Warmup]:
    return bench_warmup(plan.restarts, plan.flips)


WARMUP = section(
    Section(
        name="warmup",
        title="kubelet restarts with a realistic warm-up",
        order=80,
        full=WarmupPlan(restarts=10, flips=25),
        quick=WarmupPlan(restarts=3, flips=10),
        run=_run,
    )
)


@part((8, 0))
def render(results: Results) -> list[str]:
    w = results.get(WARMUP)
    if w is None:
        return []
    floor, settled, flip = w.floor, w.settled, w.flip
    return [
        "## 8. The kubelet's warm-up",
        "",
        "Kubelet restarts whose device plugins re-register 0.5-2 s later and whose pods reappear over 0.5 s, as",
        "a real kubelet's do. The floor is the last plugin back; the agent's settled report comes once every",
        "resource is back and the pod list has been stable for 2 s (its settling rule), so the net change is",
        "reported once. Then a NIC's health flips while the GPUs' device plugin is away (held), "
        "1.5-2 s apart at random points: under our own cap of 5 RPCs in any second (while held, "
        "each flip costs two whole-node re-queries beside the hold's look every 1 s).",
        "",
        "| measure | n | p50 | p99 | goal |",
        "|---|---|---|---|---|",
        f"| restart to plugins back (the floor) | {len(floor)} | {p50_p99(floor)} | |",
        f"| restart to settled report | {len(settled)} | {p50_p99(settled)} | "
        f"(settled / floor at p50: {statistics.median(settled) / max(statistics.median(floor), 1e-6):.2f}x) |",
        f"| events other than kubelet.restarted (false alarms) | {len(settled)} restarts | {w.false_alarms} | | {verdict(w.false_alarms == 0)} (0) |",
        f"| health flip to event during another resource's warm-up | {len(flip)} | {p50_p99(flip)} | {verdict(pct(flip, 99) <= 0.1 and w.still_held)} (p99 <= 100 ms, GPUs still held) |",
        "",
        *_flips_by_path(w),
    ]


def _flips_by_path(w: Warmup) -> list[str]:
    """The flip's tail by what started the re-query that reported it: a NIC's health shows in the
    device-plugin checkpoint (the directory watch: one to two steps) and, while a resource is held,
    in any re-query (the fake's Pods API also tells of the NIC's pod's status)."""
    if not w.flip_by:
        return []
    groups: dict[str, list[float]] = {}
    for path, x in zip(w.flip_by, w.flip, strict=True):
        groups.setdefault(path, []).append(x)
    rows = [
        f"- {path}: {len(xs)} flips, p50 {ms(statistics.median(xs))}, p99 {ms(pct(xs, 99))}"
        for path, xs in sorted(groups.items())
    ]
    return [
        "Which re-query reported each flip (p50 and p99 per path); while a resource is held, a "
        "re-query reads the whole node, so whichever trigger comes first reports the flip:",
        "",
        *rows,
        "",
    ]
