"""`run`: the node agent, until SIGINT or SIGTERM; SIGHUP re-reads its config."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import structlog

from watcher import allocator
from watcher.app import Agent
from watcher.cli.common import Subparsers, exit_codes, settings_from
from watcher.ops.logs import configure_logging
from watcher.settings import Settings
from watcher.settings_file import load_settings
from watcher.supervision import stop_on_signals

__all__ = ["add_parser"]

log = structlog.get_logger("watcher.cli")

RUN_EXIT_CODES = exit_codes(
    (0, "stopped cleanly by SIGINT or SIGTERM"),
    (1, "could not run (e.g. the state directory is unusable; one line on stderr says why)"),
    (2, "bad command line or configuration"),
    (130, "interrupted before the agent started"),
)


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


def add_parser(subparsers: Subparsers) -> None:
    run = subparsers.add_parser(
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
    # The agent reloads on SIGHUP once it runs: until then the signal stays ignored (main()).
    run.set_defaults(
        handler=lambda args: asyncio.run(_run(settings_from(args.config), args.config)),
        keeps_sighup_ignored=True,
    )
