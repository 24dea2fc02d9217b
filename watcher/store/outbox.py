"""The durable outbox: SQLite (WAL) in the state directory.

Events, the per-sink queues and the watcher's state are committed in ONE
transaction, so the state can never move past an event that is not safely
queued, and a crash re-sends rather than loses (or re-invents under a new id).
Each sink drains its own queue in `seq` order; delivered rows are deleted,
permanent failures move to a dead-letter table that is kept until an operator
retries or drops them. Queues are bounded by size and age: the oldest rows go
first, and every drop is counted and logged.

`OutboxDatabase` is the database itself, synchronous: it runs on whichever thread
calls it (the `outbox` command calls it directly). The agent reaches it through
`watcher.store.store.Store`, which runs all of its work on one dedicated thread:
sqlite3 is blocking, and fsyncs must never stall the event loop.

Every event's payload is in here, so the state directory is 0700 and the database (with its
-wal and -shm) 0600, whatever the umask; none of them may be a symbolic link (refused before
SQLite opens anything, so a link's target is never touched; see `watcher.files`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from watcher.files import check_private, private_dir
from watcher.model.events import Event
from watcher.store.hooks import installed_hooks
from watcher.store.saved_state import SCHEMA as SAVED_STATE_SCHEMA
from watcher.store.saved_state import SavedRows, StateRecord, StateWrite, StoredState

__all__ = ["OutboxDatabase", "OUTBOX_FILE", "OutboxUnavailableError", "DeadLetter", "SinkStats"]

OUTBOX_FILE = "outbox.db"

log = structlog.get_logger("watcher.store.outbox")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    sink TEXT NOT NULL,
    seq INTEGER NOT NULL,
    enqueued REAL NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS queue_seq ON queue (seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    sink TEXT NOT NULL,
    seq INTEGER NOT NULL,
    failed REAL NOT NULL,
    status INTEGER,
    error TEXT NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dead_letters_seq ON dead_letters (seq);
CREATE TABLE IF NOT EXISTS sinks (
    name TEXT PRIMARY KEY,
    disabled TEXT,
    delivered INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0,
    dead INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class DeadLetter:
    sink: str
    seq: int
    failed: float
    status: int | None
    error: str
    event: Event


@dataclass(frozen=True)
class SinkStats:
    depth: int
    oldest_age: float | None
    delivered: int
    dropped: int
    dead: int
    disabled: str | None


class OutboxUnavailableError(RuntimeError):
    """The outbox could not be opened (yet): nothing can be stored."""


def _is_corruption(err: sqlite3.DatabaseError) -> bool:
    """A damaged database file, as opposed to a disk that refuses (full, read-only, missing).

    sqlite3.OperationalError is a DatabaseError too: treating a full or read-only disk as
    corruption would move a healthy outbox aside and lose what it holds.
    """
    name = getattr(err, "sqlite_errorname", None)
    if name is None:  # raised by us (quick_check said so), not by SQLite
        return not isinstance(err, sqlite3.OperationalError)
    return str(name).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


class OutboxDatabase:
    """The outbox database; every method runs on the caller's thread, one transaction each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        # True when a corrupt database was moved aside: seq must not restart from 0.
        self.recovered_from_corruption = False
        self._state = SavedRows()
        # What the last commit wrote of the state (None: it stored none).
        self.last_state_write: StateWrite | None = None

    # -- opening --

    def open(self) -> None:
        self._state.forget()
        private_dir(self.path.parent, "state directory", tighten=True)
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as err:
            if not _is_corruption(err):
                raise  # full, read-only, unopenable: the data is fine, the disk is not
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error(
                "outbox database is corrupt: moved aside, starting empty",
                path=str(self.path),
                moved_to=str(aside),
                error=str(err),
            )
            self.recovered_from_corruption = True
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    src.rename(str(aside) + suffix)
            self._db = self._connect()

    def _make_private(self) -> None:
        """Refuse links and loose modes before SQLite opens anything; create the database 0600.

        SQLite gives the -wal and -shm it creates the database file's mode, so creating the
        database first (O_NOFOLLOW, 0600) makes all three private; ones left from before are
        checked as well. Python's sqlite3 cannot ask SQLite not to follow links, hence this.
        """
        for suffix in ("-wal", "-shm"):
            check_private(Path(f"{self.path}{suffix}"), f"outbox database's {suffix[1:]} file")
        # The state directory is ours alone (0700), so no link can appear between this and
        # SQLite's own open.
        check_private(self.path, "outbox database", create=True)

    def _connect(self) -> sqlite3.Connection:
        self._make_private()
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed event survives power loss, not just a crash.
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("PRAGMA foreign_keys=OFF")
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            db.executescript(_SCHEMA + SAVED_STATE_SCHEMA)
            connected = installed_hooks().connected
            if connected is not None:
                connected(db)
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        """Close the connection; `open()` may be called again."""
        db, self._db = self._db, None
        self._state.forget()
        if db is not None:
            db.close()

    def reopen(self) -> None:
        """Close the database and open it again. After the disk under it failed (I/O errors,
        an emergency read-only remount) a fresh connection, on whatever is mounted there now,
        is the only way back."""
        self.close()
        self.open()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise OutboxUnavailableError(f"the outbox {self.path} is not open")
        return self._db

    def _tx(self) -> _Transaction:
        return _Transaction(self.db)

    # -- the producer side --

    def commit(
        self,
        events: Sequence[Event],
        queues: Mapping[str, Sequence[int]],
        state: StateRecord | None,
    ) -> None:
        """Queue `events` for the sinks in `queues` (sink -> seqs) and store `state`, atomically
        (only its rows that changed: `watcher.store.saved_state`; `last_state_write` says which)."""
        now = time.time()
        written = None
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO events (seq, id, created, body) VALUES (?, ?, ?, ?)",
                [(e.seq, e.id, now, e.to_json()) for e in events],
            )
            for sink, seqs in queues.items():
                db.executemany(
                    "INSERT OR IGNORE INTO queue (sink, seq, enqueued) VALUES (?, ?, ?)",
                    [(sink, seq, now) for seq in seqs],
                )
            if state is not None:
                written = self._state.write(db, state)
            committing = installed_hooks().committing
            if committing is not None:
                committing(self.path, events)
        if state is not None:
            self._state.committed(state)
        self.last_state_write = written

    def load_state(self) -> StoredState:
        """The saved state as of the last commit (see `watcher.store.saved_state`)."""
        return self._state.load(self.db)

    def max_seq(self) -> int:
        """The highest seq still held (a floor for seq if the state is lost)."""
        row = self.db.execute(
            "SELECT MAX(m) FROM (SELECT MAX(seq) AS m FROM events "
            "UNION ALL SELECT MAX(seq) FROM dead_letters)"
        ).fetchone()
        return int(row[0] or 0)

    # -- sinks --

    def register(self, sinks: Iterable[str]) -> None:
        with self._tx() as db:
            db.executemany("INSERT OR IGNORE INTO sinks (name) VALUES (?)", [(s,) for s in sinks])

    def pending(self, sink: str, limit: int = 100) -> list[Event]:
        """The oldest queued events of `sink`, in seq order."""
        rows = self.db.execute(
            "SELECT e.body FROM queue q JOIN events e ON e.seq = q.seq "
            "WHERE q.sink = ? ORDER BY q.seq LIMIT ?",
            (sink, limit),
        ).fetchall()
        return [Event.from_dict(json.loads(body)) for (body,) in rows]

    def _prune(self, db: sqlite3.Connection) -> None:
        db.execute(
            "DELETE FROM events WHERE seq NOT IN (SELECT seq FROM queue) "
            "AND seq NOT IN (SELECT seq FROM dead_letters)"
        )

    def ack(self, sink: str, seqs: Sequence[int]) -> None:
        """`sink` has the events: forget them for it."""
        with self._tx() as db:
            db.executemany("DELETE FROM queue WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs])
            db.execute("UPDATE sinks SET delivered = delivered + ? WHERE name = ?", (len(seqs), sink))
            self._prune(db)

    def dead_letter(self, sink: str, seqs: Sequence[int], status: int | None, error: str) -> None:
        now = time.time()
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO dead_letters (sink, seq, failed, status, error) "
                "VALUES (?, ?, ?, ?, ?)",
                [(sink, s, now, status, error) for s in seqs],
            )
            db.executemany("DELETE FROM queue WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs])
            db.execute("UPDATE sinks SET dead = dead + ? WHERE name = ?", (len(seqs), sink))

    def enforce_caps(self, sink: str, max_events: int, max_age: float) -> int:
        """Drop the oldest rows of `sink` beyond the caps; return how many went."""
        with self._tx() as db:
            cutoff = time.time() - max_age
            aged = db.execute("DELETE FROM queue WHERE sink = ? AND enqueued < ?", (sink, cutoff)).rowcount
            (depth,) = db.execute("SELECT COUNT(*) FROM queue WHERE sink = ?", (sink,)).fetchone()
            over = max(0, depth - max_events)
            if over:
                db.execute(
                    "DELETE FROM queue WHERE sink = ? AND seq IN "
                    "(SELECT seq FROM queue WHERE sink = ? ORDER BY seq LIMIT ?)",
                    (sink, sink, over),
                )
            dropped = aged + over
            if dropped:
                db.execute("UPDATE sinks SET dropped = dropped + ? WHERE name = ?", (dropped, sink))
                self._prune(db)
        return int(dropped)

    def set_disabled(self, sink: str, reason: str | None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO sinks (name) VALUES (?)", (sink,))
            db.execute("UPDATE sinks SET disabled = ? WHERE name = ?", (reason, sink))

    def sink_names(self) -> list[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM sinks ORDER BY name")]

    def stats(self, sink: str) -> SinkStats:
        db = self.db
        depth, oldest = db.execute(
            "SELECT COUNT(*), MIN(enqueued) FROM queue WHERE sink = ?", (sink,)
        ).fetchone()
        row = db.execute(
            "SELECT delivered, dropped, dead, disabled FROM sinks WHERE name = ?", (sink,)
        ).fetchone()
        delivered, dropped, dead, disabled = row if row is not None else (0, 0, 0, None)
        return SinkStats(
            depth=depth,
            oldest_age=None if oldest is None else max(0.0, time.time() - oldest),
            delivered=delivered,
            dropped=dropped,
            dead=dead,
            disabled=disabled,
        )

    def kv_get(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def kv_set(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value, separators=(",", ":"))),
            )

    # -- dead letters (the `outbox` command) --

    def dead_letters(self, sink: str | None = None) -> list[DeadLetter]:
        rows = self.db.execute(
            "SELECT d.sink, d.seq, d.failed, d.status, d.error, e.body FROM dead_letters d "
            "JOIN events e ON e.seq = d.seq WHERE (? IS NULL OR d.sink = ?) ORDER BY d.sink, d.seq",
            (sink, sink),
        ).fetchall()
        return [
            DeadLetter(s, seq, failed, status, error, Event.from_dict(json.loads(body)))
            for s, seq, failed, status, error, body in rows
        ]

    def retry_dead(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters back on their sinks' queues (in seq order, with the same event ids)."""
        now = time.time()
        with self._tx() as db:
            chosen = self._chosen_dead(db, sink, seqs)
            db.executemany(
                "INSERT OR IGNORE INTO queue (sink, seq, enqueued) VALUES (?, ?, ?)",
                [(s, q, now) for s, q in chosen],
            )
            db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
        return len(chosen)

    def drop_dead(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        with self._tx() as db:
            chosen = self._chosen_dead(db, sink, seqs)
            db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
            self._prune(db)
        return len(chosen)

    @staticmethod
    def _chosen_dead(
        db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None
    ) -> list[tuple[str, int]]:
        rows = db.execute(
            "SELECT sink, seq FROM dead_letters WHERE (? IS NULL OR sink = ?) ORDER BY seq", (sink, sink)
        ).fetchall()
        wanted = set(seqs) if seqs else None
        return [(s, q) for s, q in rows if wanted is None or q in wanted]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            # SQLite may have rolled back already (disk full): a second ROLLBACK would raise
            # and hide the real error.
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            return
        try:
            self.db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT can leave the transaction open; every later BEGIN would fail.
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
