"""A sink's caps: queued events and dead letters bounded by count and by age, oldest first.

Ages are on the age clock (`watcher.store.ages`), which no wall-clock step moves. Every drop is
counted in the sink's row, and for a sink that records gaps in its stream the queued events
dropped become a gap row (`watcher.store.outbox.gaps`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from watcher.store.outbox.connection import Connection
from watcher.store.outbox.gaps import Gaps
from watcher.store.outbox.queues import Queues, prune, seqs_of

__all__ = ["Caps", "CapEnforcer", "Dropped", "Enforced"]


@dataclass(frozen=True)
class Caps:
    """A sink's bounds, from its settings: queued events by count and age, dead letters likewise."""

    max_queue: int
    max_age: float
    max_dead_letters: int
    max_dead_letter_age: float


@dataclass(frozen=True)
class Dropped:
    """Rows one cap dropped for one sink: `count` of them, seqs `first` to `last`; `reason` is the
    cap's setting (max_queue, max_age: queued events; max_dead_letters, max_dead_letter_age:
    dead letters)."""

    reason: str
    first: int
    last: int
    count: int
    seqs: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def dead_letters(self) -> bool:
        return self.reason.startswith("max_dead_letter")

    @classmethod
    def of(cls, reason: str, seqs: Sequence[int]) -> Dropped:
        return cls(reason, min(seqs), max(seqs), len(seqs), tuple(seqs))


@dataclass(frozen=True)
class Enforced:
    """What `enforce` did: the drops, and whether the queue's caps waited because a batch was in
    flight (its worker applies them again once the batch is done with)."""

    dropped: list[Dropped]
    deferred: bool = False


@dataclass(frozen=True)
class _Held:
    """What a sink holds that one pair of caps bounds: its table, the `sinks` column counting
    it, the order the oldest go in, and the two caps' names."""

    table: str
    counted: str
    oldest_first: str
    by_age: str
    by_count: str


_QUEUED = _Held("queue", "queued", "seq", "max_age", "max_queue")
# A dead letter retried and failed again is as old as its new failure, whatever its seq.
_DEAD = _Held("dead_letters", "dead_kept", "since, seq", "max_dead_letter_age", "max_dead_letters")


def _trim(db: sqlite3.Connection, held: _Held, sink: str, before: float, keep: int) -> list[Dropped]:
    """Delete `sink`'s rows of `held` stamped before `before`, then the oldest beyond `keep`."""
    drops: list[Dropped] = []
    aged = seqs_of(
        db.execute(f"DELETE FROM {held.table} WHERE sink = ? AND since < ? RETURNING seq", (sink, before))
    )
    if aged:
        drops.append(Dropped.of(held.by_age, aged))
    row = db.execute(f"SELECT {held.counted} FROM sinks WHERE name = ?", (sink,)).fetchone()
    over = (0 if row is None else int(row[0]) - len(aged)) - keep
    if over > 0:
        capped = seqs_of(
            db.execute(
                f"DELETE FROM {held.table} WHERE sink = ? AND seq IN (SELECT seq FROM {held.table} "
                f"WHERE sink = ? ORDER BY {held.oldest_first} LIMIT ?) RETURNING seq",
                (sink, sink, over),
            )
        )
        if capped:
            drops.append(Dropped.of(held.by_count, capped))
    return drops


class CapEnforcer:
    def __init__(self, connection: Connection, queues: Queues, gaps: Gaps) -> None:
        self._conn = connection
        self._queues = queues
        self._gaps = gaps

    def enforce(self, sink: str, caps: Caps, *, gaps: bool = False) -> Enforced:
        """Drop what `sink` holds beyond its caps, oldest first, and say what went.

        Queued events older than `max_age` go, then the oldest beyond `max_queue`; dead letters
        older than `max_dead_letter_age`, then the oldest beyond `max_dead_letters`. While the
        sink's worker has a batch in flight its queue caps wait (`deferred`): the batch is the
        oldest, and whether it goes is known once the attempt ends. Each drop is counted in the
        sink's row; with `gaps`, the queued events dropped become a gap row that the worker
        hands to the sink's stream before the events after it. Every statement is an index
        search: the cost is what is dropped, not what is held.
        """
        drops: list[Dropped] = []
        deferred = self._queues.in_flight(sink)
        with self._conn.tx() as db:
            age = self._conn.ages.now()
            if not deferred:
                drops += _trim(db, _QUEUED, sink, age - caps.max_age, caps.max_queue)
            drops += _trim(db, _DEAD, sink, age - caps.max_dead_letter_age, caps.max_dead_letters)
            if not drops:
                return Enforced(drops, deferred)
            queued = sum(d.count for d in drops if not d.dead_letters)
            dead = sum(d.count for d in drops if d.dead_letters)
            db.execute(
                "UPDATE sinks SET queued = queued - ?1, dropped = dropped + ?1, "
                "dead_kept = dead_kept - ?2, dead_dropped = dead_dropped + ?2 WHERE name = ?3",
                (queued, dead, sink),
            )
            if gaps:
                for drop in drops:
                    if not drop.dead_letters:
                        self._gaps.add(db, sink, drop.first, drop.last, drop.count, drop.reason)
            prune(db, [s for d in drops for s in d.seqs])
            self._conn.save_clock(db)
        return Enforced(drops, deferred)
