"""`demo`: the full watcher against a simulated kubelet, playing a scripted story."""

from __future__ import annotations

import argparse
import asyncio

from watcher.cli.common import BAD_ARGS, INTERRUPTED, PIPE, Subparsers, exit_codes

__all__ = ["add_parser"]

DEMO_EXIT_CODES = exit_codes(
    (0, "the story played to its end (with --forever: stopped by Ctrl-C)"),
    (1, "something the demo needs failed (one line on stderr says what)"),
    BAD_ARGS,
    INTERRUPTED,
    PIPE,
)


def _demo(args: argparse.Namespace) -> int:
    # Here, not at the top: the agent never plays the demo, and imports `watcher.cli`.
    if args.kubernetes:
        from watcher.sim.demo_kubernetes import run_kubernetes_demo

        return asyncio.run(run_kubernetes_demo())
    from watcher.sim.demo import run_demo

    return asyncio.run(run_demo(forever=args.forever, seed=args.seed))


def add_parser(subparsers: Subparsers) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="watch a simulated kubelet through a scripted story (about 15 s)",
        description="Start a simulated kubelet (pod-resources and its Pods API) on a temporary socket "
        "and the full watcher (console, audit-log, signed-webhook and PagerDuty sinks, with a local "
        "receiver), then play a story: baseline, a GPU hot-plugged, a GPU failing while a Job's pod "
        "holds it (the page names the Job), healing, a DRA GPU its driver reports Unhealthy (the page "
        "names the Job and carries the driver's words) and Healthy again, a pod allocating a NIC, a "
        "kubelet restart, and a CPU change across a restart; each event is printed as it is delivered, "
        "and a summary ends it. Needs nothing but this package; everything stays on loopback and a "
        "temp directory.",
        epilog=DEMO_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--forever", action="store_true", help="after the story, keep random churn going until Ctrl-C"
    )
    demo.add_argument("--seed", type=int, default=None, help="seed for the simulated kubelet's randomness")
    demo.add_argument(
        "--kubernetes",
        action="store_true",
        help="instead: the kubernetes sink against a local fake API server; a GPU fails and heals, and "
        "what `kubectl describe pod` / `kubectl describe node` show is printed after each step",
    )
    demo.set_defaults(handler=_demo)
