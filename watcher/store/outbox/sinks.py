"""Each sink's row: registered, disabled or not, and its figures (`SinkStats`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from watcher.store.outbox.connection import Connection

__all__ = ["SinkStats", "Sinks"]


@dataclass(frozen=True)
class SinkStats:
    """One sink's figures. `delivered`, `dropped` (queued events its caps dropped), `dead`
    (events dead-lettered) and `dead_dropped` (dead letters its caps dropped) count from the
    outbox's start; `depth` and `dead_letters` are what it holds now."""

    depth: int
    oldest_age: float | None
    delivered: int
    dropped: int
    dead: int
    disabled: str | None
    dead_letters: int = 0
    dead_dropped: int = 0


class Sinks:
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def register(self, sinks: Iterable[str]) -> None:
        with self._conn.tx() as db:
            db.executemany("INSERT OR IGNORE INTO sinks (name) VALUES (?)", [(s,) for s in sinks])

    def set_disabled(self, sink: str, reason: str | None) -> None:
        with self._conn.tx() as db:
            db.execute("INSERT OR IGNORE INTO sinks (name) VALUES (?)", (sink,))
            db.execute("UPDATE sinks SET disabled = ? WHERE name = ?", (reason, sink))

    def names(self) -> list[str]:
        return [name for (name,) in self._conn.db.execute("SELECT name FROM sinks ORDER BY name")]

    def stats(self, sink: str) -> SinkStats:
        db = self._conn.db
        (oldest,) = db.execute("SELECT MIN(since) FROM queue WHERE sink = ?", (sink,)).fetchone()
        row = db.execute(
            "SELECT queued, delivered, dropped, dead, disabled, dead_kept, dead_dropped "
            "FROM sinks WHERE name = ?",
            (sink,),
        ).fetchone()
        depth, delivered, dropped, dead, disabled, kept, dead_dropped = (
            row if row is not None else (0, 0, 0, 0, None, 0, 0)
        )
        return SinkStats(
            depth=depth,
            oldest_age=None if oldest is None else max(0.0, self._conn.ages.now() - oldest),
            delivered=delivered,
            dropped=dropped,
            dead=dead,
            disabled=disabled,
            dead_letters=kept,
            dead_dropped=dead_dropped,
        )
