"""`kubernetes cleanup`: the kubernetes sink's uninstall step, removing the Node conditions it
owns."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from watcher.cli.common import INTERRUPTED, PIPE, PROG, Subparsers, exit_codes, fail, settings_from

__all__ = ["add_parser"]

KUBERNETES_EXIT_CODES = exit_codes(
    (0, "the nodes have none of this agent's conditions left"),
    (1, "the API server could not be reached or refused"),
    (2, "bad command line or configuration"),
    INTERRUPTED,
    PIPE,
)


async def _kubernetes_cleanup(args: argparse.Namespace) -> int:
    from watcher.kubeapi.kubeconfig import clear_text_warning
    from watcher.sinks.kubernetes import KubernetesError, KubernetesSinkSettings, remove_owned_conditions

    nodes: list[str] = list(args.node)
    if args.config is not None:
        if args.all_nodes or args.context:
            return fail("--all-nodes and --context go with --kubeconfig, not --config", 2)
        settings = settings_from(args.config)
        configured = [s for s in settings.sinks if isinstance(s, KubernetesSinkSettings)]
        chosen = [s for s in configured if args.sink is None or s.name == args.sink]
        if len(chosen) != 1:
            names = ", ".join(s.name for s in configured) or "none"
            if not configured:
                problem = "no kubernetes sink in the config"
            elif args.sink:
                problem = f"no kubernetes sink named {args.sink!r}"
            else:
                problem = "more than one kubernetes sink: pick one with --sink"
            return fail(f"{problem} (kubernetes sinks: {names})", 2)
        sink = chosen[0]
        nodes = nodes or [settings.node]
    else:
        if args.sink:
            return fail("--sink goes with --config", 2)
        if bool(nodes) == args.all_nodes:
            return fail("name the nodes: --node NAME (repeatable) or --all-nodes", 2)
        sink = KubernetesSinkSettings(name="cleanup", kubeconfig=args.kubeconfig, context=args.context)
    warning = clear_text_warning(sink)
    if warning is not None:
        print(f"{PROG}: WARNING: {warning}", file=sys.stderr)
    try:
        cleaned = await remove_owned_conditions(sink, nodes or None)
    except KubernetesError as err:
        return fail(str(err))
    for node, removed in cleaned.items():
        what = f"removed {', '.join(removed)}" if removed else "none of this agent's conditions"
        print(f"node {node}: {what}")
    return 0


def add_parser(subparsers: Subparsers) -> None:
    kube = subparsers.add_parser(
        "kubernetes",
        help="the kubernetes sink's uninstall step: remove the Node conditions it owns",
        description="`cleanup` removes from nodes every condition this agent wrote (type ending in "
        "DevicesUnavailable, message starting with its mark 'pod-resources-watcher: ') and leaves all "
        "others, another writer's of a similar name too. Either with a cluster admin's kubeconfig after "
        "the agents stopped reporting (`--kubeconfig FILE --all-nodes`, or `--node NAME`, repeatable), "
        "or with an agent's config, for its own node (`--config FILE`: the kubernetes sink's "
        "connection). A running agent writes its conditions back at its next change or start, so "
        "remove the sink from the agents first (deploy/README.md has the order). Events expire on "
        "their own (the API server's event TTL, 1 h by default).",
        epilog=KUBERNETES_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kube.add_argument("action", choices=("cleanup",))
    how = kube.add_mutually_exclusive_group(required=True)
    how.add_argument("--config", "-c", type=Path, help="an agent's config file with a kubernetes sink")
    how.add_argument("--kubeconfig", type=Path, help="a kubeconfig (e.g. a cluster admin's)")
    kube.add_argument("--context", help="with --kubeconfig: the context to use (default: current-context)")
    kube.add_argument(
        "--node",
        action="append",
        default=[],
        help="a node to clean (repeatable; default with --config: its node)",
    )
    kube.add_argument(
        "--all-nodes", action="store_true", help="with --kubeconfig: every node (needs list nodes)"
    )
    kube.add_argument("--sink", help="with --config: which kubernetes sink (default: the only one)")
    kube.set_defaults(handler=lambda args: asyncio.run(_kubernetes_cleanup(args)))
