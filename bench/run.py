"""`make bench`: measure the speed claims side by side and write BENCHMARKS.md (bench/report.py).

Every figure comes from this run, on this machine. Sections (their --only names):
  1. reconnect: reconnection after a kubelet restart, ours vs a plain grpc.aio channel polled every 100 ms
  2. change: a device health flip until the event is committed (state-file triggers vs timer)
  3. steady: the agent's whole CPU share at steady state, a real `python -m watcher run` over
     PRW_BENCH_STEADY_S seconds (default 300) (bench/steady.py); unchanged: CPU time per unchanged
     cycle on a large node, ours vs a bare client, and where the decode's time goes (for reference);
     idle_curve: the directory watch's step vs idle CPU vs reconnect p99, side by side
  4. changed: changed re-query (decode, hash, diff, events) on that node
  5. memory: RSS after start and after many unchanged cycles
  6. delivery: events/s through the outbox to a local webhook; change-to-receipt
  7. storm (and change): calls per minute at steady state; the largest 1 s burst in a trigger storm
  8. warmup: kubelet restarts with a realistic warm-up
  9. scale = nodes (changed cycles, RSS and bytes written at 250 to ~450,000 pods: bench/scale.py),
     ack (ack cost as a queue grows), audit (the audit log under a 30,000-event burst), drain (a
     webhook's queue after its receiver's outage) (bench/queues.py)
 10. fleet: 1,000 and 10,000 simulated nodes' events into a real 3-node NATS JetStream cluster
     through the nats sink's publishing code (latency, consumer lag, a burst, sustained capacity,
     the stream leader killed mid-load), beside the same load through the webhook sink into one
     receiver (bench/fleet/)
 11. pods-api: a one-pod change at 10,000 pods through the kubelet's Pods API and Get, beside the
     List path, in one run: change to event, kubelet calls per change, RSS after the watch's
     snapshot (bench/pods_path.py)
 12. peer: node-feature-discovery's nfd-topology-updater (make peers) beside our agent against the
     same kubelet (kubelet-lite, then the fake), in one run: change to each tool's output, idle
     CPU, RSS, kubelet calls per minute; NVSentinel's documented poll as a reference row
     (bench/peer_beside.py)
 13. real-kubelet: upstream's kubelet (make peers) with our device plugin and upstream's DRA test
     driver: a flip at each to the stored event, split at the Pods API; a pod's creation to its
     allocation.added; the agent's idle CPU and RSS as a process; the same flip at kubelet-lite and
     the fake beside it (bench/real_kubelet.py)

    .venv/bin/python bench/run.py [--quick] [--only NAMES] [--list] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# watcher first: it silences gRPC's C-core, which reads its settings at import.
import watcher  # noqa: F401, I001

from bench.registry import Results, chosen, groups, sections
from bench.report import report
from watcher.ops.logs import configure_logging

__all__ = ["chosen", "main", "run_sections"]


async def run_sections(names: Sequence[str], *, quick: bool) -> Results:
    """The sections `names`, one after the other (on a 2-core machine, two at once would measure
    each other), each with its quick or full plan."""
    configure_logging("error", "json")
    by_name: dict[str, object] = {}
    for s in sections():
        if s.name not in names:
            continue
        t0 = time.monotonic()
        print(f"bench: {s.name} ...", file=sys.stderr, flush=True)
        by_name[s.name] = await s.run(s.quick if quick else s.full)
        print(f"bench: {s.name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return Results(by_name, quick=quick)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (a smoke run, not for the record)"
    )
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="run only these sections (comma-separated; see --list) and print their report "
        "(to BENCHMARKS.md only with --output)",
    )
    parser.add_argument("--list", action="store_true", help="name the sections and groups, then exit")
    parser.add_argument("--output", type=Path, help="where the report goes (default: BENCHMARKS.md)")
    args = parser.parse_args()
    every = sections()
    if args.list:
        print("sections:", ", ".join(s.name for s in every))
        print("groups:", "; ".join(f"{g} = {', '.join(n)}" for g, n in groups(every).items()))
        return
    names = chosen(args.only, [s.name for s in every])
    output = args.output if args.output is not None or args.only else ROOT / "BENCHMARKS.md"
    started = datetime.now(UTC)
    t0 = time.monotonic()
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    results = asyncio.run(run_sections(names, quick=args.quick))
    command = (
        "bench/run.py" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    )
    text = report(results, started, time.monotonic() - t0, command)
    if output is None:
        print(text)
    else:
        output.write_text(text)
        print(f"bench: wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
