"""A real Agent on a very large node: its RSS against the answers' wire size, the time of a
changed cycle, and the bytes it writes per single-pod change. The agent runs in this process
(nothing else big lives here) and sets the allocator as `pod-resources-watcher run` does; the
fake kubelet (watcher/sim, `large_node`) serves from a child process.

    python bench/big_node.py --pods 10000 [--containers 4] [--cpus 512] [--changes 20]
                             [--unchanged 10] [--state DIR] [--max-receive-bytes N] [--plain-malloc]

Figures (JSON on stdout):
  floor_mib      RSS once the agent's modules are imported (before any answer)
  wire_bytes     the two answers' size on the wire (GetAllocatableResources + List)
  baseline       the first cycle (against nothing, or against the state saved in --state): RSS,
                 peak, seconds
  unchanged      cycles with reordered answers (as the kubelet sends them): RSS, peak
  changed        one pod's allocation changed per cycle: RSS, peak, wall and CPU ms per cycle
                 (medians), bytes written per change (all of this process's write() calls: SQLite's
                 WAL and its checkpoints; logs are off), and the rows the commit wrote
  peak_mib       the highest of the three phases' peaks
  x_wire         (peak_mib - floor_mib) and (changed RSS - floor_mib), in answers' wire sizes
  db_bytes       outbox.db and its WAL on disk at the end
Each phase's peak is VmHWM reset before it (/proc/self/clear_refs), so it is that phase's own.
Give the same --state DIR to a second run to measure a restart against the saved state. To
measure another version, copy this file and bench/cycles.py into its tree's bench/ and run it
from there.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    return round(_status("VmRSS"), 1)


def peak_mib() -> float:
    return round(_status("VmHWM"), 1)


def reset_peak() -> None:
    # "5" resets VmHWM to the current RSS (Linux 4.0+), so a phase's peak is its own.
    Path("/proc/self/clear_refs").write_text("5")


def written_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def _median(xs: Sequence[float]) -> float:
    return sorted(xs)[len(xs) // 2]


# --- the kubelet's side (a child process) ---


def serve(root: Path, pods: int, containers: int, cpus: int) -> None:
    """Serve large_node(pods, containers, cpus), answers shuffled as the kubelet's are; each line
    `change N` on stdin toggles a CPU of pod N's first container and answers `ok`."""
    from watcher.kubeletapi.v1 import api_pb2
    from watcher.sim.fake_kubelet import FakeKubelet
    from watcher.sim.fake_node import large_node

    class Fake(FakeKubelet):
        # Two shuffled renderings per version of the node, made before `ok`: a cycle's time is
        # then the agent's (and the transfer's), not this process building 10,000s of messages.
        variants: list[tuple[api_pb2.AllocatableResourcesResponse, api_pb2.ListPodResourcesResponse]]
        turn = 0

        def prepare(self) -> None:
            base = FakeKubelet
            self.variants = [(base.allocatable_response(self), base.list_response(self)) for _ in range(2)]

        def allocatable_response(self) -> api_pb2.AllocatableResourcesResponse:
            return self.variants[self.turn % 2][0]

        def list_response(self) -> api_pb2.ListPodResourcesResponse:
            # Each List in the other order: every cycle is a reordered answer, not the same bytes.
            self.turn += 1
            return self.variants[self.turn % 2][1]

    async def main() -> None:
        node = large_node(pods=pods, containers_per_pod=containers, cpus=cpus)
        fake = Fake(root, node, rate=1e9, burst=10**9, seed=1)
        fake.prepare()
        await fake.start()
        a, b = fake.variants[0]
        print(f"ready {a.ByteSize()} {b.ByteSize()}", flush=True)
        names = list(node.pods)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            n = int(line.split()[1])
            node.pods[names[n % len(names)]].containers[0].cpu_ids.symmetric_difference_update({100_000 + n})
            fake.prepare()
            print("ok", flush=True)
        await fake.stop(remove_socket=True)

    asyncio.run(main())


def _change(stdin: IO[str], stdout: IO[str], n: int) -> None:
    stdin.write(f"change {n}\n")
    stdin.flush()
    if stdout.readline().strip() != "ok":
        raise SystemExit("the fake kubelet did not take the change")


# --- the agent's side ---


async def measure(args: argparse.Namespace, root: Path, child: subprocess.Popen[str]) -> dict[str, Any]:
    from bench.cycles import agent_for_cycles
    from watcher.ops.logs import configure_logging

    configure_logging("error", "json")
    assert child.stdin is not None
    assert child.stdout is not None
    sock = root / "pod-resources" / "kubelet.sock"
    limit = {"max_receive_bytes": args.max_receive_bytes} if args.max_receive_bytes else {}
    agent = await agent_for_cycles(sock, args.state, root, timeout=120.0, **limit)
    reasons = frozenset({"bench"})
    out: dict[str, Any] = {}
    reset_peak()
    t0 = time.perf_counter()
    await agent.requery(reasons)
    out["baseline"] = {
        "against": "saved state" if args.saved else "nothing (fresh)",
        "seconds": round(time.perf_counter() - t0, 3),
        "rss_mib": rss_mib(),
        "peak_mib": peak_mib(),
    }
    reset_peak()
    for _ in range(args.unchanged):
        await agent.requery(reasons)
    out["unchanged"] = {"cycles": args.unchanged, "rss_mib": rss_mib(), "peak_mib": peak_mib()}
    reset_peak()
    walls, cpus, writes = [], [], []
    rows = set()
    events = agent.metrics.value("events_total")
    for i in range(args.changes):
        await asyncio.to_thread(_change, child.stdin, child.stdout, i * 7919)
        w0, c0, t0 = written_bytes(), time.process_time(), time.perf_counter()
        await agent.requery(reasons)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        writes.append(written_bytes() - w0)
        # (Older versions, measured with a copy of this script in their tree, did not say.)
        rows.add(str(getattr(agent.outbox, "last_state_write", "rewritten whole")))
    out["changed"] = {
        "cycles": args.changes,
        "events": int(agent.metrics.value("events_total") - events),
        "commit_failures": int(agent.metrics.value("state_commit_failures_total")),
        "wall_ms_median": round(1000 * _median(walls), 1),
        "cpu_ms_median": round(1000 * _median(cpus), 1),
        "written_bytes_median": int(_median(writes)),
        "written_bytes_max": max(writes),
        "state_rows": sorted(rows),
        "rss_mib": rss_mib(),
        "peak_mib": peak_mib(),
    }
    await agent.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--containers", type=int, default=4)
    parser.add_argument(
        "--cpus",
        type=int,
        default=512,
        help="the node's CPUs; containers take one each, in turn (more: fewer containers alike)",
    )
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--unchanged", type=int, default=10)
    parser.add_argument("--state", type=Path, default=None, help="state dir (kept); default: a temporary one")
    parser.add_argument("--max-receive-bytes", type=int, default=0)
    parser.add_argument(
        "--plain-malloc", action="store_true", help="leave glibc's malloc as it is (watcher.allocator)"
    )
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.pods, args.containers, args.cpus)
        return
    # The floor: every module the agent runs with, imported, nothing decoded yet.
    import watcher.app  # noqa: F401
    from watcher.store.outbox import OUTBOX_FILE

    if not args.plain_malloc:
        try:
            from watcher import allocator
        except ImportError:  # an older version, measured with a copy of this script in its tree
            pass
        else:
            allocator.return_large_blocks()  # as `pod-resources-watcher run` does first
    gc.collect()
    floor = rss_mib()
    with tempfile.TemporaryDirectory(prefix="prw-big-", dir="/tmp") as tmp:
        root = Path(tmp) / "kubelet"
        if args.state is None:
            args.state = Path(tmp) / "state"
        args.saved = (args.state / OUTBOX_FILE).exists()
        command = [sys.executable, __file__, "--serve", str(root), "--pods", str(args.pods)]
        child = subprocess.Popen(
            [*command, "--containers", str(args.containers), "--cpus", str(args.cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            ready = child.stdout.readline().split()
            if not ready or ready[0] != "ready":
                raise SystemExit(f"the fake kubelet did not start: {ready}")
            wire = int(ready[1]) + int(ready[2])
            result = asyncio.run(measure(args, root, child))
        finally:
            child.stdin.close()
            child.wait(60)
        sizes = {p.name: p.stat().st_size for p in sorted(args.state.glob(OUTBOX_FILE + "*")) if p.is_file()}
    peak = max(result[phase]["peak_mib"] for phase in ("baseline", "unchanged", "changed"))
    report = {
        "pods": args.pods,
        "containers": args.containers,
        "cpus": args.cpus,
        "wire_bytes": wire,
        "floor_mib": floor,
        **result,
        "peak_mib": peak,
        "x_wire": {
            "peak": round((peak - floor) * 2**20 / wire, 1),
            "steady": round((result["changed"]["rss_mib"] - floor) * 2**20 / wire, 1),
        },
        "db_bytes": sizes,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
