"""A one-pod change on a 10,000-pod node, seen two ways side by side in one run: through the
kubelet's Pods API (the watch names the pod, one pod-resources Get reads it) and through the List
path (a state file rewritten, then List and GetAllocatableResources of the whole node). A real
Agent runs in this process; the fake kubelet serves from a child process, its answers built ahead
(bench/scale_kubelet.py), so the simulator's Python is not what is measured.

    python bench/pods_path.py [--pods 10000] [--changes 40]

Figures (JSON on stdout), per path:
  latency_s    each change's time from the kubelet's signal to the agent's stored event: for the
               Pods API path from the watch event's broadcast, for the List path from the state
               file's rename (both stamped by the child on the shared monotonic clock)
  rpcs         pod-resources calls per change (List, GetAllocatableResources, Get), at the kubelet
  rss_mib      the agent's RSS once it holds the node (for the Pods API path: after the watch's
               10,000-pod snapshot), and its floor (modules imported, nothing read)
  tail         what the slow changes met, for the profile of a p99: the garbage collector's
               pauses over 10 ms (gc callbacks) and the commits over 50 ms (the agent's
               state_commit_duration_seconds: one transaction and its fsync) while changes ran
The change alternates: a pod with one exclusive CPU admitted, then removed (allocation.added,
allocation.removed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAMESPACE = "bench"

if TYPE_CHECKING:
    from watcher.model.events import Event


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


# --- the kubelet's side (a child process) ---


def serve(root: Path, pods: int) -> None:
    """Serve the large node; `add N` / `remove N` admit or remove pod bench/pod-N (one CPU) and
    answer `t <state file renamed> <watch event broadcast>` once both happened; `calls` answers the
    pod-resources calls so far as JSON."""
    from bench.scale_kubelet import PrebuiltKubelet
    from watcher.sim.fake_kubelet import FakeKubelet
    from watcher.sim.fake_node import FakeContainer, FakePod, large_node
    from watcher.sim.fake_pod_objects import pod_object

    class Kubelet(PrebuiltKubelet):
        def write_state_files(self, *, checkpoint: bool = True) -> None:
            FakeKubelet.write_state_files(self, checkpoint=checkpoint)  # the List path's trigger

    async def main() -> None:
        node = large_node(pods=pods)
        kubelet = Kubelet(root, node, seed=1)
        await kubelet.start()
        api = kubelet.pods_api
        assert api is not None
        broadcast: asyncio.Future[float] | None = None

        def on_broadcast(_events: list[bytes]) -> None:
            if broadcast is not None and not broadcast.done():
                broadcast.set_result(time.monotonic())

        api.on_broadcast = on_broadcast
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            words = line.split()
            if words[0] == "calls":
                print(json.dumps(dict(kubelet.calls)), flush=True)
                continue
            n = int(words[1])
            key = (NAMESPACE, f"pod-{n}")
            broadcast = loop.create_future()
            if words[0] == "add":
                pod = FakePod(*key, [FakeContainer("c0", cpu_ids={100_000 + n})])
                node.add_pod(pod)
                kubelet.rebuild(changed=key)
                shown = pod_object(node, pod, kubelet.node_name)
            else:
                del node.pods[key]
                kubelet.forget(key)
                shown = None
            kubelet.write_state_files(checkpoint=False)  # cpu_manager_state: its content changed
            renamed = time.monotonic()
            api.changed([(*key, shown)])
            sent = await asyncio.wait_for(broadcast, 30)
            print(f"t {renamed} {sent}", flush=True)
        await kubelet.stop(remove_socket=True)

    asyncio.run(main())


class Child:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout

    def ask(self, line: str) -> str:
        self.stdin.write(line + "\n")
        self.stdin.flush()
        return self.stdout.readline().strip()

    def calls(self) -> dict[str, int]:
        out: dict[str, int] = json.loads(self.ask("calls"))
        return out


# --- the agent's side ---


class _Arrivals:
    """The agent's events as they are stored, each with the time it arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []
        self.waiter = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append((time.monotonic(), event))
        self.waiter.set()

    async def until(self, predicate: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.waiter.clear()
                await self.waiter.wait()


@contextlib.contextmanager
def _gc_pauses() -> Iterator[list[float]]:
    """The garbage collector's pauses over 10 ms while the block runs."""
    pauses: list[float] = []
    began: list[float] = []

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began and (held := time.perf_counter() - began.pop()) > 0.010:
            pauses.append(held)

    gc.callbacks.append(on_gc)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(on_gc)


async def _measure(root: Path, child: Child, changes: int, *, pods_api: bool, first: int) -> dict[str, Any]:
    from testkit.agent import make_settings
    from watcher.app import Agent

    settings = make_settings(
        root / ("pods-api" if pods_api else "list"),
        kubelet_root=root / "kubelet",
        pods_api=pods_api,
        state_file_triggers=not pods_api,
        interval=3600.0,
        http=False,
        max_rpc_rate=50.0,
    )
    agent = Agent(settings, sinks=[])
    arrived = _Arrivals()
    agent.subscribe(arrived)
    task = asyncio.create_task(agent.run())
    await arrived.until(lambda: any(e.kind == "watcher.started" for _, e in arrived.events), 120)
    if pods_api:
        watch = agent.pods_watch
        assert watch is not None
        async with asyncio.timeout(120):
            while watch.state != "watching":
                await asyncio.sleep(0.05)
        await agent.requery(frozenset({"bench"}))  # the snapshot's resync, if any, is done
    await asyncio.sleep(0.5)
    rss = _rss_mib()
    before = child.calls()
    commits = _slow_commits(agent)
    with _gc_pauses() as pauses:
        latency = await _changes(child, arrived, changes, pods_api=pods_api, first=first)
    slow, total = (a - b for a, b in zip(_slow_commits(agent), commits, strict=True))
    tail = {"gc_pauses_s": pauses, "slow_commits": slow, "commits": total}
    after = child.calls()
    agent.stop.set()
    await asyncio.wait_for(task, 60)
    rpcs = {
        m: (after.get(m, 0) - before.get(m, 0)) / changes for m in ("List", "GetAllocatableResources", "Get")
    }
    return {"latency_s": latency, "rpcs": rpcs, "rss_mib": rss, "tail": tail}


async def _changes(
    child: Child, arrived: _Arrivals, changes: int, *, pods_api: bool, first: int
) -> list[float]:
    """Each change's time from the kubelet's signal to its stored event."""
    latency: list[float] = []
    for i in range(changes):
        n = first + i // 2
        verb = "add" if i % 2 == 0 else "remove"
        kind = "allocation.added" if verb == "add" else "allocation.removed"
        mark = len(arrived.events)
        _, renamed, sent = (await asyncio.to_thread(child.ask, f"{verb} {n}")).split()
        signal = float(sent) if pods_api else float(renamed)
        await arrived.until(lambda: any(e.kind == kind for _, e in arrived.events[mark:]), 30)
        at = next(t for t, e in arrived.events[mark:] if e.kind == kind)
        latency.append(at - signal)
        await asyncio.sleep(0.25)  # spaced: our own RPC cap is not what is measured
    return latency


def _slow_commits(agent: Any) -> tuple[float, float]:
    """The agent's commits so far over 50 ms, and all of them."""
    name = "state_commit_duration_seconds"
    total = agent.metrics.value(f"{name}_count")
    return total - agent.metrics.value(f"{name}_bucket", le="0.05"), total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.pods)
        return
    import watcher.app  # noqa: F401 - the floor: every module imported, nothing read
    from watcher import allocator
    from watcher.ops.logs import configure_logging

    allocator.return_large_blocks()
    configure_logging("error", "json")
    floor = _rss_mib()
    with tempfile.TemporaryDirectory(prefix="prw-pods-", dir="/tmp") as tmp:
        root = Path(tmp)
        command = [sys.executable, __file__, "--serve", str(root / "kubelet"), "--pods", str(args.pods)]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        child = Child(proc)
        try:
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("the fake kubelet did not start")
            # The Pods API path first: its RSS is then the agent's alone, before any other agent ran.
            pods = asyncio.run(_measure(root, child, args.changes, pods_api=True, first=0))
            listed = asyncio.run(_measure(root, child, args.changes, pods_api=False, first=args.changes))
        finally:
            child.stdin.close()
            proc.wait(60)
    print(json.dumps({"pods": args.pods, "floor_mib": floor, "pods_api": pods, "list": listed}))


if __name__ == "__main__":
    main()
