"""One node size of the scale section, measured in a process of its own (so no other
measurement's memory is in its RSS): the agent's changed cycles against a fake kubelet of that
size (bench/scale_kubelet.py, started here as a child process, so its work is not ours).

For each cycle one pod changes at the kubelet (a CPU added to one container), then the agent's
re-query runs: CPU time of this whole process (every thread, so the store's commit too), wall
time, and the bytes this process caused to be written to disk (`write_bytes` of
/proc/self/io, counted by the kernel as page-cache pages are dirtied, so in 4 KiB pages: the
outbox's database, its WAL and shared-memory index, checkpoints included when they happen; the
process writes no other file, and the kubelet's socket and the log pipe are not storage).
RSS: after the cycles (steady) and the high-water mark (peak, which includes the first full
decode); the floor, what `python -m watcher` costs before it runs, is `import_floor_mib()`.
Prints one JSON line.

    python bench/scale_agent.py (--pods N | --fit BYTES) [--cycles K] [--warmup W] [--budget-s S] [--profile N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import cProfile
import json
import pstats
import subprocess
import tempfile
import time
from typing import Any

from bench.cycles import agent_for_cycles
from watcher.ops.logs import configure_logging

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now; VmHWM: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise LookupError("write_bytes")


def import_floor_mib() -> float:
    """RSS of a fresh interpreter once it has imported what `python -m watcher` imports."""
    code = (
        "import watcher.cli, pathlib; "
        "print(next(l.split()[1] for l in pathlib.Path('/proc/self/status').read_text().splitlines() "
        "if l.startswith('VmRSS:')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout) / 1024


class Kubelet:
    """The child process serving the node, changed one pod at a time on request."""

    def __init__(self, root: Path, size: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "scale_kubelet.py"), "--root", str(root), *size],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _, sock, pods, list_bytes = self._line("serving")
        self.socket = Path(sock)
        self.pods = int(pods)
        self.list_bytes = int(list_bytes)

    def _line(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != word:
            raise RuntimeError(f"scale kubelet: expected {word!r}, got {line!r} (exit {self.proc.poll()})")
        return line

    def change(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("change\n")
        self.proc.stdin.flush()
        _, _pod, list_bytes = self._line("changed")
        self.list_bytes = int(list_bytes)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def measure(
    size: list[str], cycles: int, warmup: int, budget_s: float, profile: cProfile.Profile | None = None
) -> dict[str, Any]:
    """Up to `cycles` measured changed cycles after `warmup` unmeasured ones, but no more once
    `budget_s` seconds of measured cycles have passed (at least two are always measured).
    With `profile`, the measured cycles run under it (their times then include its overhead)."""
    configure_logging("error", "json")  # stdout carries the result alone
    with tempfile.TemporaryDirectory(prefix="prw-b9-", dir="/tmp") as tmp:
        root = Path(tmp)
        kubelet = Kubelet(root / "kubelet", size)
        try:
            agent = await agent_for_cycles(kubelet.socket, root / "state")
            reasons = frozenset({"bench"})
            t0 = time.perf_counter()
            await agent.requery(reasons)  # the first answer: a full decode
            first = time.perf_counter() - t0
            for _ in range(warmup):
                kubelet.change()
                await agent.requery(reasons)
            cpu: list[float] = []
            wall: list[float] = []
            written: list[int] = []
            events = agent.metrics.value("events_total")
            started = time.monotonic()
            for i in range(cycles):
                if i >= 2 and time.monotonic() - started > budget_s:
                    break
                kubelet.change()  # the kubelet's own work, outside what is measured
                w0, c0, t0 = write_bytes(), time.process_time(), time.perf_counter()
                if profile is not None:
                    profile.enable()
                await agent.requery(reasons)
                if profile is not None:
                    profile.disable()
                t1, c1, w1 = time.perf_counter(), time.process_time(), write_bytes()
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
                written.append(w1 - w0)
            out = {
                "pods": kubelet.pods,
                "list_bytes": kubelet.list_bytes,
                "first_cycle_s": first,
                "cpu": cpu,
                "wall": wall,
                "written": written,
                "events": int(agent.metrics.value("events_total") - events),
                "commit_failures": int(agent.metrics.value("state_commit_failures_total")),
                "rss_steady_mib": status_kib("VmRSS") / 1024,
                "rss_peak_mib": status_kib("VmHWM") / 1024,
                "max_receive_bytes": agent.settings.kubelet.max_receive_bytes,
            }
            await agent.close()
        finally:
            kubelet.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--pods", type=int)
    size.add_argument("--fit", type=int, help="the most pods whose List answer fits in this many bytes")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=60.0, help="stop measuring cycles after this")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="print the N functions the changed cycles spent most in (stderr)",
    )
    args = parser.parse_args()
    size_args = ["--pods", str(args.pods)] if args.pods is not None else ["--fit", str(args.fit)]
    profile = cProfile.Profile() if args.profile else None
    print(json.dumps(asyncio.run(measure(size_args, args.cycles, args.warmup, args.budget_s, profile))))
    if profile is not None:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
