"""Gap rows: what a sink's caps dropped from a stream that records its gaps (the audit log).

The worker hands a sink's first gap to its stream before the events after it (`Queues.take`),
then forgets it (`recorded`).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from watcher.model.events import rfc3339
from watcher.model.gaps import GAP_REASONS, Gap
from watcher.store.outbox.connection import Connection

__all__ = ["Gaps"]


def _reasons(*reasons: str) -> str:
    """The reasons of a gap, in one order, once each: "max_queue,max_age"."""
    given = {r for joined in reasons for r in joined.split(",") if r}
    return ",".join([r for r in GAP_REASONS if r in given] + sorted(given - set(GAP_REASONS)))


def _put(
    db: sqlite3.Connection, sink: str, first: int, last: int, count: int, reasons: str, when: float
) -> None:
    """A gap row from `first`, added to one that starts there already (seqs put back on the
    queue by `outbox retry` and dropped again)."""
    same = db.execute(
        "SELECT last, count, reasons FROM gaps WHERE sink = ? AND first = ?", (sink, first)
    ).fetchone()
    if same is not None:
        last, count, reasons = max(last, same[0]), count + same[1], _reasons(same[2], reasons)
    db.execute(
        "INSERT OR REPLACE INTO gaps (sink, first, last, count, reasons, time) VALUES (?, ?, ?, ?, ?, ?)",
        (sink, first, last, count, reasons, when),
    )


class Gaps:
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def add(self, db: sqlite3.Connection, sink: str, first: int, last: int, count: int, reason: str) -> None:
        """Record a drop of seqs `first` to `last` as a gap of `sink`'s stream, in the caller's
        transaction: merged into the gap before it when no queued event lies between the two (so
        a sink that stays blocked has one gap, not one per drop), a gap of its own otherwise."""
        wall = self._conn.clocks.wall()
        prev = db.execute(
            "SELECT first, last, reasons FROM gaps WHERE sink = ? ORDER BY first DESC LIMIT 1", (sink,)
        ).fetchone()
        if prev is not None and prev[1] < first:
            between = db.execute(
                "SELECT 1 FROM queue WHERE sink = ? AND seq > ? AND seq < ? LIMIT 1",
                (sink, prev[1], first),
            ).fetchone()
            if between is None:
                db.execute(
                    "UPDATE gaps SET last = ?, count = count + ?, reasons = ?, time = ? "
                    "WHERE sink = ? AND first = ?",
                    (last, count, _reasons(prev[2], reason), wall, sink, prev[0]),
                )
                return
        _put(db, sink, first, last, count, reason, wall)

    def first(self, sink: str) -> Gap | None:
        """The oldest gap `sink`'s stream has not recorded yet."""
        row = self._conn.db.execute(
            "SELECT first, last, count, reasons, time FROM gaps WHERE sink = ? ORDER BY first LIMIT 1",
            (sink,),
        ).fetchone()
        if row is None:
            return None
        first, last, count, reasons, when = row
        moment = datetime.fromtimestamp(when, UTC)
        return Gap(first, last, count, tuple(reasons.split(",")), rfc3339(moment))

    def recorded(self, sink: str, gap: Gap) -> None:
        """`sink`'s stream holds `gap`: forget it. A drop merged into it meanwhile stays, as a
        gap of its own from the seq after `gap`."""
        with self._conn.tx() as db:
            row = db.execute(
                "SELECT last, count, reasons, time FROM gaps WHERE sink = ? AND first = ?", (sink, gap.first)
            ).fetchone()
            if row is None:
                return
            db.execute("DELETE FROM gaps WHERE sink = ? AND first = ?", (sink, gap.first))
            last, count, reasons, when = row
            if last > gap.last and count > gap.count:
                _put(db, sink, gap.last + 1, last, count - gap.count, reasons, when)
