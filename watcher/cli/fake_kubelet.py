"""`fake-kubelet`: serve a simulated kubelet, optionally playing a scripted scenario."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from watcher.cli.common import BAD_ARGS, Subparsers, exit_codes, fail, positive_float, positive_int
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node, large_node
from watcher.sim.fake_script import ACTIONS, ScriptError, load_script, play
from watcher.supervision import stop_on_signals

__all__ = ["add_parser"]

FAKE_KUBELET_EXIT_CODES = exit_codes(
    (0, "stopped by SIGINT or SIGTERM"),
    (1, "could not serve (e.g. ROOT is not writable)"),
    BAD_ARGS,
)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    with stop_on_signals(stop):
        await stop.wait()


async def _fake_kubelet(args: argparse.Namespace) -> int:
    try:
        steps = load_script(args.script) if args.script is not None else None
    except ScriptError as err:
        return fail(f"{args.script}: {err}", 2)
    node = large_node() if args.node == "large" else default_node()
    kubelet = FakeKubelet(
        args.root, node, seed=args.seed, rate=args.rate, burst=args.burst, shuffle=not args.no_shuffle
    )
    await kubelet.start()
    print(f"fake kubelet serving {kubelet.socket_path}; stop with Ctrl-C", file=sys.stderr, flush=True)
    try:
        if steps is not None:

            def say(text: str) -> None:
                print(f"script: {text}", file=sys.stderr, flush=True)

            played = asyncio.create_task(play(kubelet, steps, say=say))
            signalled = asyncio.create_task(_until_signalled())
            await asyncio.wait({played, signalled}, return_when=asyncio.FIRST_COMPLETED)
            if not played.done():  # interrupted during the scenario
                played.cancel()
                await asyncio.gather(played, return_exceptions=True)
            else:
                signalled.cancel()
                await asyncio.gather(signalled, return_exceptions=True)
                played.result()
                if steps[-1].action != "end":
                    print("script: done; serving until Ctrl-C", file=sys.stderr, flush=True)
                    await _until_signalled()
        else:
            await _until_signalled()
    finally:
        await kubelet.stop(remove_socket=True)
    print("fake kubelet stopped", file=sys.stderr)
    return 0


def add_parser(subparsers: Subparsers) -> None:
    fake = subparsers.add_parser(
        "fake-kubelet",
        help="serve a simulated kubelet (for demos and tests)",
        description="Serve the pod-resources v1 API like a real kubelet, quirks included (shuffled "
        "answers, one entry per device per NUMA node, a 100/s global rate limit), for a built-in node "
        "with 8 GPUs on 2 NUMA nodes, SR-IOV NICs, 92 allocatable CPUs, hugepages and a few pods. The "
        "socket is ROOT/pod-resources/kubelet.sock; the device-plugin checkpoint and CPU/memory manager "
        "state files are written under ROOT. Runs until interrupted.",
        epilog=FAKE_KUBELET_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fake.add_argument("--root", required=True, type=Path, help="stand-in for /var/lib/kubelet")
    fake.add_argument("--seed", type=int, default=None, help="seed for the answer shuffling")
    fake.add_argument(
        "--rate", type=positive_float, default=100.0, help="rate limit, requests/s (default: 100)"
    )
    fake.add_argument("--burst", type=positive_int, default=10, help="rate limit burst (default: 10)")
    fake.add_argument(
        "--node",
        choices=("default", "large"),
        default="default",
        help="default: the built-in node; large: 512 CPUs, 8 NUMA nodes, 4x64 devices, 250x4 containers",
    )
    fake.add_argument("--no-shuffle", action="store_true", help="answer in a stable order (benchmarks)")
    fake.add_argument(
        "--script",
        type=Path,
        metavar="FILE",
        help="play a scenario: one step per line, `AT ACTION ARGS` (e.g. `2s fail nvidia.com/gpu GPU-3`, "
        "`5s restart warmup`, `9s end`); actions: "
        + ", ".join(f"{k} {v}".rstrip() for k, v in ACTIONS.items()),
    )
    fake.set_defaults(handler=lambda args: asyncio.run(_fake_kubelet(args)))
