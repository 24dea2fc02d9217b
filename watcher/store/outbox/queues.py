"""The per-sink queues: events committed with the state, taken in seq order, acked or released.

An event goes once no queue row and no dead letter holds it, and only the seqs an ack or a drop
released are asked about (`prune`), so an ack costs the same at any depth.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from watcher.model.events import Event
from watcher.model.gaps import Gap
from watcher.store.hooks import installed_hooks
from watcher.store.outbox.connection import Connection
from watcher.store.outbox.gaps import Gaps
from watcher.store.saved_state import SavedRows, StateRecord, StateWrite, StoredState

__all__ = ["Queues", "enqueue", "prune", "seqs_of"]

# Each an index search (never `NOT IN (SELECT ...)` over the whole table).
_PRUNE = (
    "DELETE FROM events WHERE seq = ?1 AND NOT EXISTS (SELECT 1 FROM queue WHERE seq = ?1) "
    "AND NOT EXISTS (SELECT 1 FROM dead_letters WHERE seq = ?1)"
)


def prune(db: sqlite3.Connection, seqs: Iterable[int]) -> None:
    """Delete the events of `seqs` that no queue row and no dead letter holds any more."""
    db.executemany(_PRUNE, [(s,) for s in seqs])


def enqueue(db: sqlite3.Connection, sink: str, seqs: Sequence[int], now: float, since: float) -> None:
    """Queue `seqs` for `sink` (stamped `now` on the wall clock, `since` on the age clock), counted."""
    if not seqs:
        return
    added = db.executemany(
        "INSERT OR IGNORE INTO queue (sink, seq, enqueued, since) VALUES (?, ?, ?, ?)",
        [(sink, seq, now, since) for seq in seqs],
    ).rowcount
    db.execute("INSERT OR IGNORE INTO sinks (name) VALUES (?)", (sink,))
    db.execute("UPDATE sinks SET queued = queued + ? WHERE name = ?", (added, sink))


def seqs_of(rows: Iterable[tuple[Any, ...]]) -> list[int]:
    return [int(row[0]) for row in rows]


class Queues:
    """The producer's commit and the workers' take, ack and release."""

    def __init__(self, connection: Connection, gaps: Gaps) -> None:
        self._conn = connection
        self._gaps = gaps
        # Sinks whose worker has taken a batch (`take`) and not yet acked, dead-lettered or
        # released it: their queue caps wait until it is done with, so an event is never both
        # delivered and counted as dropped, and what goes is always the oldest.
        self._in_flight: set[str] = set()
        self._state = SavedRows()
        # What the last commit wrote of the state (None: it stored none).
        self.last_state_write: StateWrite | None = None

    def forget_state(self) -> None:
        """The database was (re)opened or closed: what it holds of the state is not known."""
        self._state.forget()

    def commit(
        self,
        events: Sequence[Event],
        queues: Mapping[str, Sequence[int]],
        state: StateRecord | None,
    ) -> None:
        """Queue `events` for the sinks in `queues` (sink -> seqs) and store `state`, atomically
        (only its rows that changed: `watcher.store.saved_state`; `last_state_write` says which)."""
        conn = self._conn
        now = conn.clocks.wall()
        written = None
        with conn.tx() as db:
            since = conn.ages.now()
            db.executemany(
                "INSERT OR IGNORE INTO events (seq, id, created, body) VALUES (?, ?, ?, ?)",
                [(e.seq, e.id, now, e.to_json()) for e in events],
            )
            for sink, seqs in queues.items():
                enqueue(db, sink, seqs, now, since)
            conn.save_clock(db)
            if state is not None:
                written = self._state.write(db, state)
            committing = installed_hooks().committing
            if committing is not None:
                committing(conn.path, events)
        if state is not None:
            self._state.committed(state)
        self.last_state_write = written

    def load_state(self) -> StoredState:
        """The saved state as of the last commit (see `watcher.store.saved_state`)."""
        return self._state.load(self._conn.db)

    def max_seq(self) -> int:
        """The highest seq still held (a floor for seq if the state is lost)."""
        row = self._conn.db.execute(
            "SELECT MAX(m) FROM (SELECT MAX(seq) AS m FROM events "
            "UNION ALL SELECT MAX(seq) FROM dead_letters)"
        ).fetchone()
        return int(row[0] or 0)

    def pending(self, sink: str, limit: int = 100) -> list[Event]:
        """The oldest queued events of `sink`, in seq order."""
        rows = self._conn.db.execute(
            "SELECT e.body FROM queue q JOIN events e ON e.seq = q.seq "
            "WHERE q.sink = ? ORDER BY q.seq LIMIT ?",
            (sink, limit),
        ).fetchall()
        return [Event.from_dict(json.loads(body)) for (body,) in rows]

    def take(self, sink: str, limit: int, *, gaps: bool = False) -> list[Event] | Gap:
        """What `sink`'s worker delivers next: its oldest queued events (at most `limit`, marked in
        flight, so the caps leave them alone until they are acked, dead-lettered or released),
        or, with `gaps`, the gap its stream must record first. Events after a gap wait for it."""
        events = self.pending(sink, limit)
        gap = self._gaps.first(sink) if gaps else None
        if gap is not None:
            if not events or gap.first <= events[0].seq:
                self._in_flight.discard(sink)
                return gap
            events = [e for e in events if e.seq < gap.first]
        if events:
            self._in_flight.add(sink)
        else:
            self._in_flight.discard(sink)
        return events

    def in_flight(self, sink: str) -> bool:
        """`sink`'s worker holds a batch it took: the queue's caps wait for it."""
        return sink in self._in_flight

    def release(self, sink: str) -> None:
        """`sink`'s worker no longer holds its batch (a failed attempt): the caps may drop it."""
        self._in_flight.discard(sink)

    def ack(self, sink: str, seqs: Sequence[int]) -> None:
        """`sink` has the events: forget them for it."""
        self._in_flight.discard(sink)
        with self._conn.tx() as db:
            gone = db.executemany(
                "DELETE FROM queue WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs]
            ).rowcount
            db.execute(
                "UPDATE sinks SET delivered = delivered + ?, queued = queued - ? WHERE name = ?",
                (len(seqs), gone, sink),
            )
            prune(db, seqs)
