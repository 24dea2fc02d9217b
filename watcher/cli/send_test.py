"""`send-test`: one synthetic event through one configured sink, and the receiver's answer."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from watcher.cli.common import INTERRUPTED, PIPE, Subparsers, exit_codes, fail, settings_from
from watcher.ops.logs import configure_logging
from watcher.settings import Settings
from watcher.sinks.registry import build_sink, sink_type_of

__all__ = ["add_parser"]

SEND_TEST_EXIT_CODES = exit_codes(
    (0, "delivered"),
    (1, "not delivered (refused, or the receiver could not be reached)"),
    (2, "bad command line or configuration, or no sink of that name"),
    INTERRUPTED,
    PIPE,
)


async def _send_test(settings: Settings, name: str) -> int:
    # Here, not at the top: the agent never sends a test, and imports `watcher.cli`.
    from watcher.sim.send_test import MemoryStore, synthetic_events

    configure_logging(settings.log.level, settings.log.format)
    chosen = [s for s in settings.sinks if s.name == name]
    if not chosen:
        names = ", ".join(s.name for s in settings.sinks) or "none"
        return fail(f"no sink named {name!r} in the config (sinks: {names})", 2)
    cfg = chosen[0]
    if hasattr(cfg, "resolve_hold_down"):
        # The test's resolve goes at once: held, it would never go (no timer runs here), and the
        # test incident would stay open.
        at_once: dict[str, Any] = {"resolve_hold_down": 0.0}
        cfg = dataclasses.replace(cfg, **at_once)
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


def add_parser(subparsers: Subparsers) -> None:
    send = subparsers.add_parser(
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
    send.set_defaults(handler=lambda args: asyncio.run(_send_test(settings_from(args.config), args.sink)))
