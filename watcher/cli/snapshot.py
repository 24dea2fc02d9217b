"""`snapshot`: the node's current inventory, queried once and printed."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

from watcher.cli.common import (
    BAD_ARGS,
    INTERRUPTED,
    PIPE,
    PROG,
    Subparsers,
    exit_codes,
    positive_float,
    positive_int,
)
from watcher.kubelet.client import (
    DEFAULT_MAX_RECEIVE_BYTES,
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT,
    PodResourcesClient,
)
from watcher.settings import DEFAULT_POD_LABELS, default_node_name
from watcher.sources.pods_api.client import DEFAULT_MAX_RECEIVE_BYTES as PODS_MAX_RECEIVE_BYTES
from watcher.sources.pods_api.client import PodsApiClient

__all__ = ["add_parser"]

SNAPSHOT_EXIT_CODES = exit_codes(
    (0, "printed"),
    (1, "the kubelet could not be queried (one line on stderr says why and what to do)"),
    BAD_ARGS,
    INTERRUPTED,
    PIPE,
)


async def _snapshot(args: argparse.Namespace) -> int:
    # Here, not at the top: the agent never takes a snapshot, and imports `watcher.cli`.
    from watcher.snapshot.pods import PodsView, default_pods_socket, read_pods
    from watcher.snapshot.take import format_json, format_table, take_snapshot

    async with PodResourcesClient(
        args.socket, timeout=args.timeout, max_receive_bytes=args.max_receive_bytes
    ) as client:
        snap = await take_snapshot(client)
    if args.no_pods_api:
        pods = PodsView(unavailable="not asked (--no-pods-api)")
    else:
        path = args.pods_api_socket or default_pods_socket(args.socket)
        # One ListPods answer holds every pod: at least the Pods API client's own limit.
        limit = max(args.max_receive_bytes, PODS_MAX_RECEIVE_BYTES)
        async with PodsApiClient(str(path), timeout=args.timeout, max_receive_bytes=limit) as pods_client:
            pods = await read_pods(pods_client, labels=DEFAULT_POD_LABELS)
    snap = dataclasses.replace(snap, pods=pods)
    if snap.degraded and args.output != "table":
        print(f"{PROG}: warning: {snap.degraded}", file=sys.stderr)
    if args.output == "html":
        from watcher.snapshot.html import render_html

        node = args.node or default_node_name()
        sys.stdout.write(render_html(snap, node))
    else:
        print(format_json(snap) if args.output == "json" else format_table(snap))
    return 0


def add_parser(subparsers: Subparsers) -> None:
    snap = subparsers.add_parser(
        "snapshot",
        help="print the node's current inventory once",
        description="Query GetAllocatableResources and List once and print the normalized inventory: "
        "per resource and NUMA node what is allocatable, allocated and free, CPUs, memory, and what "
        "each pod holds; and, when the kubelet serves its Pods API, ListPods once: each pod's uid, owner "
        "and labels, and the kubelet's verdict on each device (the non-Healthy first, with the driver's "
        "message). `--output json` prints the canonical model and its content hash; `--output html` "
        "a self-contained page that draws the node (NUMA nodes, devices, CPUs, memory, coloured by state).",
        epilog=SNAPSHOT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    snap.add_argument(
        "--socket",
        default=DEFAULT_SOCKET,
        help=f"the kubelet's pod-resources socket (default: {DEFAULT_SOCKET})",
    )
    snap.add_argument(
        "--pods-api-socket",
        type=Path,
        default=None,
        help="the kubelet's Pods API socket (default: pods-api/pods-api.sock under the kubelet root dir "
        "that holds --socket's directory)",
    )
    snap.add_argument(
        "--no-pods-api",
        action="store_true",
        help="do not read the Pods API (pods' uids, owners, labels and device verdicts)",
    )
    snap.add_argument(
        "--output",
        "-o",
        choices=("table", "json", "html"),
        default="table",
        help="default: table; html writes one page to stdout (redirect it to a file)",
    )
    snap.add_argument(
        "--node",
        default=None,
        help="the node name in the html page's header (default: $NODE_NAME, else the hostname)",
    )
    snap.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"deadline per call in seconds (default: {DEFAULT_TIMEOUT:g})",
    )
    snap.add_argument(
        "--max-receive-bytes",
        type=positive_int,
        default=DEFAULT_MAX_RECEIVE_BYTES,
        help=f"largest response accepted (default: {DEFAULT_MAX_RECEIVE_BYTES} = "
        f"{DEFAULT_MAX_RECEIVE_BYTES >> 20} MiB)",
    )
    snap.set_defaults(handler=lambda args: asyncio.run(_snapshot(args)))
