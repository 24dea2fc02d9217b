"""Which nodes of the fleet have failed or missing devices now, and which pods they hit, in SQLite,
from pod-resources-watcher's NATS JetStream sink. A reference consumer: the stdlib and nats-py only.

A durable pull consumer; each fetched batch is applied in one transaction and acked only after it
commits, so a crash re-delivers. Applying is idempotent (events are keyed by id) and ignores order:
each device and holding keeps the seq of the event that set it and takes only newer ones, since
across a failover the stream may carry an event after a later one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import nats
from nats.js.api import AckPolicy, ConsumerConfig

T = TypeVar("T")

SCHEMA = "pod-resources-watcher.event/v1"
TABLES = """
CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, node TEXT, seq INTEGER, kind TEXT, time TEXT);
CREATE TABLE IF NOT EXISTS devices (node TEXT, resource TEXT, device TEXT, state TEXT, seq INTEGER,
    PRIMARY KEY (node, resource, device));
CREATE TABLE IF NOT EXISTS holders (node TEXT, resource TEXT, device TEXT, holder TEXT, held INTEGER,
    seq INTEGER, PRIMARY KEY (node, resource, device, holder));
"""
# Last writer wins by seq: a row changes only for an event newer than the one that wrote it.
UPSERT = "INSERT INTO {t} VALUES ({q}) ON CONFLICT DO UPDATE SET {c} = excluded.{c}, seq = excluded.seq "
UPSERT += "WHERE excluded.seq > {t}.seq"
SET_DEVICE = UPSERT.format(t="devices", q="?, ?, ?, ?, ?", c="state")
SET_HOLDER = UPSERT.format(t="holders", q="?, ?, ?, ?, ?, ?", c="held")


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")  # readers (a dashboard) never block the consumer
    db.executescript(TABLES)
    return db


def _set_device(
    db: sqlite3.Connection,
    node: str,
    seq: int,
    resource: str,
    dev: str,
    state: str,
    holders: Iterable[str] = (),
) -> None:
    """A device's state as event `seq` of `node` says it, and the containers holding it then."""
    db.execute(SET_DEVICE, (node, resource, dev, state, seq))
    for holder in holders:
        db.execute(SET_HOLDER, (node, resource, dev, holder, 1, seq))


def _set_holder(
    db: sqlite3.Connection, node: str, seq: int, devices: dict[str, list[str]], holder: str, held: int
) -> None:
    """Whether `holder` holds each of `devices` (held 1, or 0 once it let them go)."""
    for resource, ids in devices.items():
        for dev in ids:
            db.execute(SET_HOLDER, (node, resource, dev, holder, held, seq))


def apply(db: sqlite3.Connection, e: dict[str, Any]) -> bool:
    """Apply one event; False if it was applied before (a duplicate or a re-delivery)."""
    node, seq, kind, d = e["node"], int(e["seq"]), e["kind"], e["details"]
    row = (e["id"], node, seq, kind, e["time"])
    if db.execute("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?)", row).rowcount == 0:
        return False
    device, hold = partial(_set_device, db, node, seq), partial(_set_holder, db, node, seq)
    res, pods = d.get("resource", ""), d.get("allocated_to") or []
    if kind in ("device.removed", "device.added", "device.flapping"):
        # A flapping device counts as failed until its flapping ends with it present.
        flapping = kind == "device.flapping" or d.get("flapping") is True
        state = "flapping" if flapping else "missing" if kind == "device.removed" else "present"
        device(res, d["device"], state, pods)
    elif kind == "device.flap_ended":
        device(res, d["device"], "present" if d.get("present") else "missing", pods)
    elif kind == "device.incident":  # its devices' own events follow too; they are back one by one
        for dev in d.get("devices", []):
            device(res, dev, "missing")
    elif kind.startswith("allocation."):
        holder = f"{d['namespace']}/{d['pod']}/{d['container']}"
        gained = {} if kind == "allocation.removed" else d.get("gained", d)
        lost = d if kind == "allocation.removed" else d.get("lost", {})
        hold(gained.get("devices") or {}, holder, 1)
        hold(lost.get("devices") or {}, holder, 0)
    elif kind == "watcher.started":  # the agent's full view at every start: reconcile with it
        for resource, ids in (d.get("allocatable_devices") or {}).items():
            for dev in ids:
                device(resource, dev, "present")
        for m in (d.get("inventory") or {}).get("missing_devices") or []:
            device(m["resource"], m["device"], "missing", m.get("allocated_to") or [])
    return True


def apply_batch(db: sqlite3.Connection, messages: list[Any]) -> tuple[int, int]:
    """One transaction for the whole batch: (events applied, duplicates skipped)."""
    applied = skipped = 0
    with db:
        for msg in messages:
            try:
                event = json.loads(msg.data)
            except ValueError:
                event = {}
            if event.get("schema") != SCHEMA:
                print(f"skipping a message that is not a {SCHEMA} event", file=sys.stderr)
            elif event["details"].get("test") is True:
                continue  # from `send-test`: nothing happened on that node
            elif apply(db, event):
                applied += 1
            else:
                skipped += 1
    return applied, skipped


# Gaps: seqs between a node's first and last event that never arrived (yet).
NODES = """SELECT node, max(seq), (SELECT time FROM events WHERE node = e.node ORDER BY seq DESC LIMIT 1),
    max(seq) - min(seq) + 1 - count(*) FROM events e GROUP BY node ORDER BY node"""
FAILED = "SELECT resource, device, state FROM devices WHERE node = ? AND state != 'present' ORDER BY 1, 2"
HIT = """SELECT holder FROM holders JOIN devices USING (node, resource, device)
    WHERE node = ? AND held AND state != 'present'"""


def fleet_table(db: sqlite3.Connection) -> str:
    """One line per node; its time is that of the node's newest event."""
    rows: list[tuple[str, ...]] = [
        ("NODE", "FAILED OR MISSING DEVICES", "PODS HIT", "SEQ", "GAPS", "LAST EVENT")
    ]
    for node, seq, when, gaps in db.execute(NODES).fetchall():
        failed = [f"{r} {d}{' (flapping)' * (s == 'flapping')}" for r, d, s in db.execute(FAILED, (node,))]
        pods = sorted({"/".join(h.split("/")[:2]) for (h,) in db.execute(HIT, (node,))})
        cells = (node, ", ".join(failed), ", ".join(pods), seq, gaps, when)
        rows.append(tuple(str(c) if c not in ("", 0) else "-" for c in cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


async def say(err: Exception) -> None:  # one line per connection error, not nats-py's traceback
    print(f"nats: {err!r}", file=sys.stderr)


async def patiently(call: Callable[[], Awaitable[T]], what: str, tries: int = 5) -> T:
    """A JetStream API request, tried again when the cluster is slow to answer (a busy or
    electing cluster times requests out; that is no reason to give up)."""
    for attempt in range(1, tries + 1):
        try:
            return await call()
        except TimeoutError:
            if attempt == tries:
                raise
            print(f"{what}: no answer yet, asking again ({attempt}/{tries - 1})", file=sys.stderr)
    raise AssertionError("unreachable")


async def consume(args: argparse.Namespace, db: sqlite3.Connection, auth: dict[str, Any]) -> tuple[int, int]:
    # --once fails within seconds when no server answers; a long-running consumer keeps trying.
    tries = 2 if args.once else -1
    nc = await nats.connect(args.servers.split(","), error_cb=say, max_reconnect_attempts=tries, **auth)
    try:
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=args.ack_wait)
        js = nc.jetstream()
        sub = await patiently(
            lambda: js.pull_subscribe(
                f"{args.prefix}.>", durable=args.durable, stream=args.stream, config=config
            ),
            "subscribing",
        )
        applied = skipped = 0
        shown = time.monotonic() - args.interval  # the first table once the first batch is in
        while True:
            try:
                msgs = await sub.fetch(args.batch, timeout=1)
            except TimeoutError:
                msgs = []
            except nats.errors.Error as err:  # e.g. reconnecting: nats-py tries the servers meanwhile
                print(f"fetch failed: {err!r}", file=sys.stderr)
                await asyncio.sleep(1)
                continue
            if msgs:
                done = apply_batch(db, msgs)  # committed: only now may the stream forget them
                # An ack lost on the way means one more re-delivery, which is skipped as a duplicate.
                await asyncio.gather(*(m.ack_sync() for m in msgs), return_exceptions=True)
                applied, skipped = applied + done[0], skipped + done[1]
            if args.once and (not msgs or msgs[-1].metadata.num_pending == 0):
                info = await patiently(
                    sub.consumer_info, "consumer info"
                )  # caught up: nothing left, nothing out unacked
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    return applied, skipped
            elif not args.once and time.monotonic() - shown >= args.interval:
                print(fleet_table(db), end="\n\n", flush=True)
                shown = time.monotonic()
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default="nats://127.0.0.1:4222", help="comma-separated NATS URLs")
    p.add_argument("--stream", default="POD_RESOURCES", help="the sink's JetStream stream")
    p.add_argument("--prefix", default="pod-resources", help="the sink's subject prefix")
    p.add_argument("--durable", default="fleet-inventory", help="the durable consumer's name")
    p.add_argument("--db", default="fleet.sqlite3", help="the SQLite database (created if absent)")
    p.add_argument("--once", action="store_true", help="catch up, print the table and exit")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between tables")
    p.add_argument("--batch", type=int, default=100, help="messages per fetch and transaction")
    wait = "seconds before an unacked message is re-delivered (when the consumer is created)"
    p.add_argument("--ack-wait", type=float, default=30.0, help=wait)
    p.add_argument("--creds", help="a NATS .creds file")
    p.add_argument("--token-file", help="a file holding a NATS token")
    args = p.parse_args(argv)
    auth: dict[str, Any] = {"user_credentials": args.creds} if args.creds else {}
    if args.token_file:
        with open(args.token_file) as f:
            auth["token"] = f.read().strip()
    db = open_db(args.db)
    try:
        applied, skipped = asyncio.run(consume(args, db, auth))
    except KeyboardInterrupt:
        return 130
    except (nats.errors.Error, OSError) as err:  # no server, no such stream, not allowed
        print(f"fleet_consumer: {err!r}", file=sys.stderr)
        return 1
    print(fleet_table(db))
    print(f"applied {applied} event(s), skipped {skipped} duplicate(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
