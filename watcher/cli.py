"""The `pod-resources-watcher` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from watcher import __version__, allocator, errors
from watcher.app import Agent
from watcher.config import ConfigError
from watcher.kubelet.client import (
    DEFAULT_MAX_RECEIVE_BYTES,
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT,
    PodResourcesClient,
)
from watcher.ops.logs import configure_logging
from watcher.secrets import Secret, SecretError, redact
from watcher.settings import Settings, config_warnings, default_node_name, load_settings, printable
from watcher.sim.demo import run_demo
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node, large_node
from watcher.sim.fake_script import ACTIONS, ScriptError, load_script, play
from watcher.sim.send_test import MemoryStore, synthetic_events
from watcher.sinks.audit import verify_files
from watcher.sinks.registry import build_sink, sink_type_of
from watcher.snapshot import format_json, format_table, take_snapshot
from watcher.snapshot_html import render_html
from watcher.store.outbox import OUTBOX_FILE, OutboxDatabase
from watcher.supervision import stop_on_signals

__all__ = ["main", "build_parser", "version_text"]

log = structlog.get_logger("watcher.cli")

PROG = "pod-resources-watcher"


def version_text() -> str:
    """`pod-resources-watcher 0.1.0`, with ` (git abc1234)` when the package runs from a git
    checkout, so a report from a development tree names its commit. Only when the package's
    parent directory is the top of that work tree: a package installed into a virtualenv that
    sits inside some other checkout must not borrow its commit. Local and bounded: one git
    call, at most 2 s; no git, no checkout, or any failure gives the plain version."""
    plain = f"{PROG} {__version__}"
    source = Path(__file__).resolve().parent.parent
    try:
        answer = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return plain
    lines = answer.stdout.split()
    if answer.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != source:
        return plain
    return f"{plain} (git {lines[1]})"


class _PrintVersion(argparse.Action):
    """--version, asking git only when given (every other run of the command must not)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print the version",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version_text())
        parser.exit()


def _exit_codes(*codes: tuple[int, str]) -> str:
    """A command's --help epilog: the exit codes that command returns, each with its meaning."""
    return "exit codes:\n" + "".join(f"  {code:<3} {meaning}\n" for code, meaning in codes)


_BAD_ARGS = (2, "bad command line")
PIPE_CLOSED = 128 + signal.SIGPIPE
_PIPE = (PIPE_CLOSED, "the reader of its output went away (e.g. `| head -1`); stopped quietly")
_INTERRUPTED = (130, "interrupted (Ctrl-C)")

# The program's: each command's own --help says which of these it returns and what they mean there.
EXIT_CODES = _exit_codes(
    (0, "success"),
    (1, "the command could not do its work (one line on stderr says why and what to do)"),
    (2, "bad command line or configuration"),
    (3, "audit verify: the log is intact but has gaps"),
    _INTERRUPTED,
    _PIPE,
)
SNAPSHOT_EXIT_CODES = _exit_codes(
    (0, "printed"),
    (1, "the kubelet could not be queried (one line on stderr says why and what to do)"),
    _BAD_ARGS,
    _INTERRUPTED,
    _PIPE,
)
RUN_EXIT_CODES = _exit_codes(
    (0, "stopped cleanly by SIGINT or SIGTERM"),
    (1, "could not run (e.g. the state directory is unusable; one line on stderr says why)"),
    (2, "bad command line or configuration"),
    (130, "interrupted before the agent started"),
)
SEND_TEST_EXIT_CODES = _exit_codes(
    (0, "delivered"),
    (1, "not delivered (refused, or the receiver could not be reached)"),
    (2, "bad command line or configuration, or no sink of that name"),
    _INTERRUPTED,
    _PIPE,
)
CHECK_CONFIG_EXIT_CODES = _exit_codes(
    (0, "the file is valid (its settings are printed)"),
    (2, "bad command line, or the file is unreadable or invalid (one line names the key)"),
    _PIPE,
)
OUTBOX_EXIT_CODES = _exit_codes(
    (0, "success"),
    (1, "no outbox in the state directory (the watcher has not run with it)"),
    (2, "bad command line or configuration, or no sink of that name in the outbox or config"),
    _PIPE,
)
KUBERNETES_EXIT_CODES = _exit_codes(
    (0, "the nodes have none of this agent's conditions left"),
    (1, "the API server could not be reached or refused"),
    (2, "bad command line or configuration"),
    _INTERRUPTED,
    _PIPE,
)
FAKE_KUBELET_EXIT_CODES = _exit_codes(
    (0, "stopped by SIGINT or SIGTERM"),
    (1, "could not serve (e.g. ROOT is not writable)"),
    _BAD_ARGS,
)
DEMO_EXIT_CODES = _exit_codes(
    (0, "the story played to its end (with --forever: stopped by Ctrl-C)"),
    (1, "something the demo needs failed (one line on stderr says what)"),
    _BAD_ARGS,
    _INTERRUPTED,
    _PIPE,
)
VERSION_EXIT_CODES = _exit_codes((0, "printed"), _BAD_ARGS, _PIPE)


AUDIT_DESCRIPTION = """\
`audit verify FILE...` checks an audit log written by a `file` sink (pass the current file and
its rotated ones, in any order), names the first altered, missing or misplaced record, and
compares the log's end with the head file the sink keeps beside it (.NAME.head).

What it detects, and what it cannot:
  any log     a changed byte in a record that was not re-chained; a deleted record in the
              middle (the gap names the missing numbers); records out of order.
  unkeyed     SHA-256 is public: whoever can write the log can edit a record, recompute every
              later hash and the head file, and it passes.
  --key-file  each hash is an HMAC under the sink's key: re-chaining without the key fails, and
              so do keyed records followed by unkeyed ones (a downgrade). Without --key-file a
              keyed log is reported NOT VERIFIED.
  head file   a cut tail (the last records deleted), unless an older head file (a copy of an
              earlier one, or, unkeyed, one rewritten by hand) was put back as well. A missing
              head file fails with --key-file; without a key it is only noted.
  --expect    any rewrite of the records up to one whose head a receiver was sent
              (X-Audit-Head), key or no key.
  never       the oldest records gone with rotated-out files (the count starts later).

Gaps: when the sink's queue caps (max_queue, max_age) dropped events before they were
written, the sink wrote a gap record in their place (chained like any record) naming the
seq range and how many. An intact log with gap records is reported GAPS, each one named.
"""
AUDIT_EXIT_CODES = _exit_codes(
    (0, "intact and complete"),
    (1, "broken, a file missing, or keyed records that could not be checked (no --key-file)"),
    (2, "bad command line, or an unreadable key file"),
    (3, "intact, but with gaps: events dropped by the sink's queue caps before they were written"),
    _PIPE,
)


def _expectation(text: str) -> tuple[int, str]:
    """--expect: `N:HASH`, or an X-Audit-Head value `NAME;n=N;hash=HASH`."""
    fields = dict(part.strip().partition("=")[::2] for part in text.split(";")[1:])
    number, digest = (fields.get("n", ""), fields.get("hash", "")) if fields else text.partition(":")[::2]
    if not number.isascii() or not number.isdigit() or int(number) < 1 or ":" not in digest:
        raise argparse.ArgumentTypeError(f"{text!r} is not N:HASH (e.g. 41:sha256:...) or NAME;n=N;hash=HASH")
    return int(number), digest.strip()


def _positive(kind: type[float] | type[int], expected: str) -> Callable[[str], float]:
    """An argparse type: a number of `kind`, greater than 0."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    return parse


_positive_float = _positive(float, "a number of seconds")
_positive_int = _positive(int, "a whole number")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Watch the kubelet's pod-resources API and report every device, CPU, memory "
        "and allocation change on this node.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_PrintVersion)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    snap = sub.add_parser(
        "snapshot",
        help="print the node's current inventory once",
        description="Query GetAllocatableResources and List once and print the normalized inventory: "
        "per resource and NUMA node what is allocatable, allocated and free, CPUs, memory, and what "
        "each pod holds. `--output json` prints the canonical model and its content hash; `--output html` "
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
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"deadline per call in seconds (default: {DEFAULT_TIMEOUT:g})",
    )
    snap.add_argument(
        "--max-receive-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_RECEIVE_BYTES,
        help=f"largest response accepted (default: {DEFAULT_MAX_RECEIVE_BYTES} = "
        f"{DEFAULT_MAX_RECEIVE_BYTES >> 20} MiB)",
    )

    fake = sub.add_parser(
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
        "--rate", type=_positive_float, default=100.0, help="rate limit, requests/s (default: 100)"
    )
    fake.add_argument("--burst", type=_positive_int, default=10, help="rate limit burst (default: 10)")
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

    run = sub.add_parser(
        "run",
        help="run the watcher (the node agent)",
        description="Watch the kubelet's pod-resources socket and report every change as an event to "
        "the configured sinks, until SIGINT or SIGTERM. Without --config, the built-in defaults are "
        "used: the kubelet's default socket, state in /var/lib/pod-resources-watcher, events as JSON "
        "lines on stdout.",
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", "-c", type=Path, help="TOML config file (see config.example.toml)")

    send = sub.add_parser(
        "send-test",
        help="send a synthetic event through one configured sink and report the answer",
        description="Deliver one synthetic event (marked as a test: 'no action needed') through the sink "
        "named SINK in the config and print the receiver's answer. For pagerduty and alertmanager sinks a "
        "second event resolves what the first triggered.",
        epilog=SEND_TEST_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("sink", metavar="SINK", help="the sink's name ([sinks.NAME] in the config)")
    send.add_argument("--config", "-c", type=Path, required=True, help="TOML config file")

    check = sub.add_parser(
        "check-config",
        help="validate a config file and print the settings it gives",
        description="Load FILE as `run` would and print the resulting settings; exit 2 with one line "
        "naming the bad key if it is invalid.",
        epilog=CHECK_CONFIG_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", type=Path, metavar="FILE")

    outbox = sub.add_parser(
        "outbox",
        help="inspect the outbox: queues per sink and dead letters; retry or drop dead letters",
        description="The durable outbox in the state directory. `list` shows each sink's queue "
        "(depth, oldest, delivered, dropped by its caps, dead-lettered, dead letters kept now and "
        "dropped by their caps, disabled) and the dead letters; `retry` "
        "puts dead letters back on their sink's queue (same event ids; a running agent picks them up "
        "within seconds); `drop` deletes them.",
        epilog=OUTBOX_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    outbox.add_argument("action", choices=("list", "retry", "drop"))
    outbox.add_argument("--config", "-c", type=Path, help="config file (for its state_dir)")
    outbox.add_argument("--state-dir", type=Path, help="state directory (overrides the config's)")
    outbox.add_argument("--sink", help="only this sink")
    outbox.add_argument("--seq", type=int, action="append", help="only this event seq (repeatable)")

    kube = sub.add_parser(
        "kubernetes",
        help="the kubernetes sink's uninstall step: remove the Node conditions it owns",
        description="`cleanup` removes from nodes every condition this agent owns (types ending in "
        "DevicesUnavailable) and leaves all others. Either with a cluster admin's kubeconfig after "
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

    audit = sub.add_parser(
        "audit",
        help="verify a tamper-evident audit log",
        description=AUDIT_DESCRIPTION,
        epilog=AUDIT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("action", choices=("verify",))
    audit.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="the current log file and its rotated ones (FILE.1 ...), in any order",
    )
    audit.add_argument(
        "--key-file",
        type=Path,
        action="append",
        default=[],
        metavar="K",
        help="the file sink's key: check every record's MAC and the head's (repeat while replacing a key)",
    )
    audit.add_argument(
        "--head",
        type=Path,
        metavar="FILE",
        help="the head file to check the log's end against (default: .NAME.head beside the current log)",
    )
    audit.add_argument(
        "--expect",
        type=_expectation,
        action="append",
        default=[],
        metavar="N:HASH",
        help="a head reported earlier, as N:HASH or an X-Audit-Head value: the log must still hold "
        "record N with that hash (repeatable)",
    )

    demo = sub.add_parser(
        "demo",
        help="watch a simulated kubelet through a scripted story (about 10 s)",
        description="Start a simulated kubelet on a temporary socket and the full watcher (console, "
        "audit-log and signed-webhook sinks, with a local receiver), then play a story: baseline, a GPU "
        "hot-plugged, a GPU failing while in use, healing, a pod allocating a NIC, a kubelet restart, "
        "and a CPU change across a restart; each event is printed as it is delivered, and a summary "
        "ends it. Needs nothing but this package; everything stays on loopback and a temp directory.",
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
    sub.add_parser(
        "version",
        help="print the version",
        description="Print the version, and the commit when the package runs from a git checkout "
        "(e.g. `pod-resources-watcher 0.1.0 (git abc1234)`).",
        epilog=VERSION_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _fail(message: str, code: int = 1) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


async def _snapshot(args: argparse.Namespace) -> int:
    async with PodResourcesClient(
        args.socket, timeout=args.timeout, max_receive_bytes=args.max_receive_bytes
    ) as client:
        snap = await take_snapshot(client)
    if snap.degraded and args.output != "table":
        print(f"{PROG}: warning: {snap.degraded}", file=sys.stderr)
    if args.output == "html":
        node = args.node or default_node_name()
        sys.stdout.write(render_html(snap, node))
    else:
        print(format_json(snap) if args.output == "json" else format_table(snap))
    return 0


async def _until_signalled() -> None:
    stop = asyncio.Event()
    with stop_on_signals(stop):
        await stop.wait()


async def _fake_kubelet(args: argparse.Namespace) -> int:
    try:
        steps = load_script(args.script) if args.script is not None else None
    except ScriptError as err:
        return _fail(f"{args.script}: {err}", 2)
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


def _settings(path: Path | None) -> Settings:
    return load_settings(path) if path is not None else Settings()


async def _run(settings: Settings, config: Path | None) -> int:
    allocator.return_large_blocks()
    configure_logging(settings.log.level, settings.log.format)
    structlog.contextvars.bind_contextvars(node=settings.node)
    stop = asyncio.Event()

    def load() -> Settings:
        assert config is not None
        new = load_settings(config)
        configure_logging(new.log.level, new.log.format)
        return new

    agent = Agent(settings, stop=stop, load_settings=load if config is not None else None)
    loop = asyncio.get_running_loop()
    before = signal.getsignal(signal.SIGHUP)

    def on_hup() -> None:
        if config is None:
            log.warning("SIGHUP ignored: running on built-in defaults, no config file to re-read")
            return
        agent.request_reload()

    def on_started() -> None:
        # Only now: until the agent runs, a reload has nothing to apply to. Until then
        # SIGHUP is ignored (the entry point ignores it before the heavy imports).
        loop.add_signal_handler(signal.SIGHUP, on_hup)

    try:
        with stop_on_signals(stop):
            await agent.run(on_started=on_started)
    finally:
        # Shutting down: a SIGHUP now must neither reload nor, at its default action, kill
        # the process before the queued events are handed over and the outbox is closed.
        # remove_signal_handler() restores the default action before the next line ignores
        # it: blocked meanwhile, a SIGHUP waits and then meets SIG_IGN.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            loop.remove_signal_handler(signal.SIGHUP)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        if before is not None and before is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, before)  # in-process callers (tests) get theirs back
    return 0


async def _send_test(settings: Settings, name: str) -> int:
    configure_logging(settings.log.level, settings.log.format)
    chosen = [s for s in settings.sinks if s.name == name]
    if not chosen:
        names = ", ".join(s.name for s in settings.sinks) or "none"
        return _fail(f"no sink named {name!r} in the config (sinks: {names})", 2)
    cfg = chosen[0]
    safe = sink_type_of(cfg).for_send_test
    if safe is not None:
        cfg = safe(cfg)
        log_of = sink_type_of(cfg).audit_log
        where = log_of(cfg, settings.state_dir) if log_of is not None else "a copy"
        print(f"{name}: writing to {where}, not to the sink's own stream")
    sink = build_sink(
        cfg, node=settings.node, state_dir=settings.state_dir, store=MemoryStore(), peers=settings.sinks
    )
    try:
        outcomes = []
        for event in synthetic_events(settings.node, paging=sink_type_of(chosen[0]).capabilities.pages):
            outcome = await sink.deliver([event])
            outcomes.append(outcome)
            verdict = "delivered" if outcome.delivered else ("will retry" if outcome.retry else "REFUSED")
            status = f"HTTP {outcome.status}" if outcome.status is not None else "no HTTP status"
            print(
                f"{name}: {event.kind} -> {verdict} ({status}){': ' + outcome.error if outcome.error else ''}"
            )
            if not outcome.delivered:
                break
    finally:
        await sink.close()
    return 0 if all(o.delivered for o in outcomes) else 1


async def _kubernetes_cleanup(args: argparse.Namespace) -> int:
    from watcher.sinks.kubernetes import KubernetesError, KubernetesSinkSettings, remove_owned_conditions

    nodes: list[str] = list(args.node)
    if args.config is not None:
        if args.all_nodes or args.context:
            return _fail("--all-nodes and --context go with --kubeconfig, not --config", 2)
        settings = _settings(args.config)
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
            return _fail(f"{problem} (kubernetes sinks: {names})", 2)
        sink = chosen[0]
        nodes = nodes or [settings.node]
    else:
        if args.sink:
            return _fail("--sink goes with --config", 2)
        if bool(nodes) == args.all_nodes:
            return _fail("name the nodes: --node NAME (repeatable) or --all-nodes", 2)
        sink = KubernetesSinkSettings(name="cleanup", kubeconfig=args.kubeconfig, context=args.context)
    try:
        cleaned = await remove_owned_conditions(sink, nodes or None)
    except KubernetesError as err:
        return _fail(str(err))
    for node, removed in cleaned.items():
        what = f"removed {', '.join(removed)}" if removed else "none of this agent's conditions"
        print(f"node {node}: {what}")
    return 0


def _check_config(path: Path) -> int:
    settings = load_settings(path)
    for warning in config_warnings(settings):
        print(f"{PROG}: WARNING: {warning}", file=sys.stderr)
    print(f"{path}: OK")
    # Secrets print as where they come from, header values and URL credentials as ***; the
    # last redact() catches a known secret that reached any other value.
    print(redact(json.dumps(printable(settings), indent=2)))
    return 0


def _outbox(args: argparse.Namespace) -> int:
    settings = _settings(args.config) if args.config is not None else None
    state_dir = args.state_dir or (settings or Settings()).state_dir
    path = state_dir / OUTBOX_FILE
    if not path.exists():
        return _fail(f"no outbox at {path}: has the watcher run with this state_dir?")
    box = OutboxDatabase(path)
    box.open()
    try:
        # A sink the outbox has never seen nor the config names is a typo: without this, list
        # prints an empty row of zeros and retry/drop report 0, as if all were well.
        known = sorted(
            {*box.sinks.names(), *(s.name for s in settings.sinks)} if settings else box.sinks.names()
        )
        if args.sink is not None and args.sink not in known:
            where = "in the outbox or the config" if settings else "in the outbox"
            return _fail(f"no sink named {args.sink!r} {where} (sinks: {', '.join(known) or 'none'})", 2)
        if args.action == "retry":
            n = box.dead_letters.retry(args.sink, args.seq)
            print(f"{n} dead letter(s) put back on their queues")
            return 0
        if args.action == "drop":
            n = box.dead_letters.drop(args.sink, args.seq)
            print(f"{n} dead letter(s) dropped")
            return 0
        names = [args.sink] if args.sink else box.sinks.names()
        print(
            f"{'SINK':<20} {'QUEUED':>7} {'OLDEST':>9} {'DELIVERED':>10} {'DROPPED':>8} {'DEAD':>6} "
            f"{'DEAD-KEPT':>9} {'DEAD-DROPPED':>12}  DISABLED"
        )
        for name in names:
            st = box.sinks.stats(name)
            oldest = "-" if st.oldest_age is None else f"{st.oldest_age:.0f}s"
            print(
                f"{name:<20} {st.depth:>7} {oldest:>9} {st.delivered:>10} {st.dropped:>8} {st.dead:>6} "
                f"{st.dead_letters:>9} {st.dead_dropped:>12}  {st.disabled or '-'}"
            )
        dead = box.dead_letters.held(args.sink)
        if dead:
            print("\nDEAD LETTERS")
            for d in dead:
                status = d.status if d.status is not None else "-"
                print(f"{d.sink:<20} seq {d.seq:<8} {d.event.kind:<22} status {status}  {d.error}")
        return 0
    finally:
        box.close()


def _audit(args: argparse.Namespace) -> int:
    missing = [f for f in [*args.files, *([args.head] if args.head else [])] if not f.exists()]
    if missing:
        return _fail(f"no such file: {missing[0]}")
    keys = []
    for path in args.key_file:
        try:
            keys.append(Secret(file=path).get().encode())
        except SecretError as err:
            return _fail(str(err), 2)
    result = verify_files(args.files, keys=keys, head=args.head, expect=args.expect)
    span = f"records {result.first}..{result.last}" if result.records else "no records"
    if result.complete:
        print(f"OK: {result.records} records intact ({span})")
    elif result.ok:
        dropped = sum(g.gap.count for g in result.gaps)
        print(
            f"GAPS: {result.records} records intact ({span}), but {len(result.gaps)} gap record(s): "
            f"{dropped} event(s) were dropped by the sink's queue caps before they were written"
        )
    else:
        print(f"{'NOT VERIFIED' if result.unverified else 'BROKEN'}: {result.problem}")
    for gap in result.gaps:
        print(f"  gap: {gap.describe()}")
    for note in result.notes:
        print(f"  {note}")
    return 0 if result.complete else 3 if result.ok else 1


def _command(args: argparse.Namespace) -> int:
    if args.command == "run":
        return asyncio.run(_run(_settings(args.config), args.config))
    if args.command == "send-test":
        return asyncio.run(_send_test(_settings(args.config), args.sink))
    if args.command == "check-config":
        return _check_config(args.file)
    if args.command == "outbox":
        return _outbox(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "kubernetes":
        return asyncio.run(_kubernetes_cleanup(args))
    if args.command == "snapshot":
        return asyncio.run(_snapshot(args))
    if args.command == "fake-kubelet":
        return asyncio.run(_fake_kubelet(args))
    if args.command == "demo":
        if args.kubernetes:
            from watcher.sim.demo_kubernetes import run_kubernetes_demo

            return asyncio.run(run_kubernetes_demo())
        return asyncio.run(run_demo(forever=args.forever, seed=args.seed))
    print(version_text())  # the only command left: version
    return 0


def _stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of stdout at exit has nowhere
    to fail (a failed flush there prints a traceback-like warning and exits 120)."""
    with contextlib.suppress(OSError, ValueError):  # stdout without a descriptor (in-process callers)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None, *, hup_ignored: bool = False) -> int:
    """Run the command line. `hup_ignored`: the entry point ignored SIGHUP before importing
    us; `run` keeps it ignored until the agent can reload, the other commands restore the
    default (a closed terminal ends them)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if hup_ignored and args.command != "run":
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        code = _command(args)
        # Flushed here, not at exit: a reader that went away must reach the handler below.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader of our output went away (`check-config FILE | head -1`): stop quietly
        # with the status of a command that SIGPIPE ended, as other Unix tools do.
        _stdout_to_devnull()
        return PIPE_CLOSED
    except ConfigError as err:
        return _fail(str(err), 2)
    except errors.WatcherError as err:
        return _fail(str(err))
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        return _fail(f"{err.strerror or err}: {err.filename or ''}".rstrip(": "))


if __name__ == "__main__":
    sys.exit(main())
