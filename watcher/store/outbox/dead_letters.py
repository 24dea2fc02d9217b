"""Dead letters: events a sink refused for good, kept until an operator retries or drops them
(the `outbox` command), or the sink's caps do (`watcher.store.outbox.caps`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from watcher.model.events import Event
from watcher.store.outbox.connection import Connection
from watcher.store.outbox.queues import Queues, enqueue, prune

__all__ = ["DeadLetter", "DeadLetters"]


@dataclass(frozen=True)
class DeadLetter:
    sink: str
    seq: int
    failed: float
    status: int | None
    error: str
    event: Event


def _forget(db: sqlite3.Connection, chosen: Sequence[tuple[str, int]]) -> None:
    db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
    for name in {s for s, _ in chosen}:
        n = sum(1 for s, _ in chosen if s == name)
        db.execute("UPDATE sinks SET dead_kept = dead_kept - ? WHERE name = ?", (n, name))


def _chosen(db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None) -> list[tuple[str, int]]:
    rows = db.execute(
        "SELECT sink, seq FROM dead_letters WHERE (? IS NULL OR sink = ?) ORDER BY seq", (sink, sink)
    ).fetchall()
    wanted = set(seqs) if seqs else None
    return [(s, q) for s, q in rows if wanted is None or q in wanted]


class DeadLetters:
    def __init__(self, connection: Connection, queues: Queues) -> None:
        self._conn = connection
        self._queues = queues

    def add(self, sink: str, seqs: Sequence[int], status: int | None, error: str) -> None:
        """Move `seqs` from `sink`'s queue to its dead letters (its caps apply at `enforce`)."""
        self._queues.release(sink)
        conn = self._conn
        now = conn.clocks.wall()
        with conn.tx() as db:
            since = conn.ages.now()
            # A seq dead-lettered again (retried, failed again) replaces its row: no new one.
            again = db.executemany(
                "DELETE FROM dead_letters WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs]
            ).rowcount
            db.executemany(
                "INSERT INTO dead_letters (sink, seq, failed, status, error, since) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(sink, s, now, status, error, since) for s in seqs],
            )
            gone = db.executemany(
                "DELETE FROM queue WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs]
            ).rowcount
            db.execute(
                "UPDATE sinks SET dead = dead + ?, queued = queued - ?, dead_kept = dead_kept + ? "
                "WHERE name = ?",
                (len(seqs), gone, len(seqs) - again, sink),
            )
            conn.save_clock(db)

    def held(self, sink: str | None = None) -> list[DeadLetter]:
        """The dead letters of `sink` (None: of every sink), by sink and seq."""
        rows = self._conn.db.execute(
            "SELECT d.sink, d.seq, d.failed, d.status, d.error, e.body FROM dead_letters d "
            "JOIN events e ON e.seq = d.seq WHERE (? IS NULL OR d.sink = ?) ORDER BY d.sink, d.seq",
            (sink, sink),
        ).fetchall()
        return [
            DeadLetter(s, seq, failed, status, error, Event.from_dict(json.loads(body)))
            for s, seq, failed, status, error, body in rows
        ]

    def retry(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters back on their sinks' queues (in seq order, with the same event ids)."""
        conn = self._conn
        now = conn.clocks.wall()
        with conn.tx() as db:
            since = conn.ages.now()
            chosen = _chosen(db, sink, seqs)
            for name in sorted({s for s, _ in chosen}):
                enqueue(db, name, [q for s, q in chosen if s == name], now, since)
            _forget(db, chosen)
            conn.save_clock(db)
        return len(chosen)

    def drop(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        with self._conn.tx() as db:
            chosen = _chosen(db, sink, seqs)
            _forget(db, chosen)
            prune(db, [q for _, q in chosen])
        return len(chosen)
