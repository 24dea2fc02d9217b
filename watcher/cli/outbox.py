"""`outbox list|retry|drop`: the durable outbox's queues per sink and its dead letters."""

from __future__ import annotations

import argparse
from pathlib import Path

from watcher.cli.common import PIPE, Subparsers, exit_codes, fail, settings_from
from watcher.settings import Settings
from watcher.store.outbox import OUTBOX_FILE, OutboxDatabase

__all__ = ["add_parser"]

OUTBOX_EXIT_CODES = exit_codes(
    (0, "success"),
    (1, "no outbox in the state directory (the watcher has not run with it)"),
    (2, "bad command line or configuration, or no sink of that name in the outbox or config"),
    PIPE,
)


def _outbox(args: argparse.Namespace) -> int:
    settings = settings_from(args.config) if args.config is not None else None
    state_dir = args.state_dir or (settings or Settings()).state_dir
    path = state_dir / OUTBOX_FILE
    if not path.exists():
        return fail(f"no outbox at {path}: has the watcher run with this state_dir?")
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
            return fail(f"no sink named {args.sink!r} {where} (sinks: {', '.join(known) or 'none'})", 2)
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


def add_parser(subparsers: Subparsers) -> None:
    outbox = subparsers.add_parser(
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
    outbox.set_defaults(handler=_outbox)
