"""The durable outbox: SQLite (WAL) in the state directory.

Events, the per-sink queues and the watcher's state are committed in ONE
transaction, so the state can never move past an event that is not safely
queued, and a crash re-sends rather than loses (or re-invents under a new id).
Each sink drains its own queue in `seq` order; delivered rows are deleted,
permanent failures move to a dead-letter table that is kept until an operator
retries or drops them, or its caps do. Queues and dead letters are bounded by
count and by age (on the age clock, `watcher.store.ages`, which no wall-clock
step moves): the oldest rows go first, every drop is counted, and for a sink
that records gaps in its stream (the audit log) a gap row says what it lost.

What an ack, a commit and a cap costs does not grow with what is queued: every
statement on those paths is an index search (a test checks their query plans),
an event is pruned when the ack or drop that may have released it says so (never
by scanning the table), and each sink's depth and dead letters are counted in
its `sinks` row.

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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from watcher.files import check_private, private_dir
from watcher.model.events import Event, rfc3339
from watcher.model.gaps import GAP_REASONS, Gap
from watcher.store.ages import AgeClock, Clocks
from watcher.store.hooks import installed_hooks
from watcher.store.saved_state import SCHEMA as SAVED_STATE_SCHEMA
from watcher.store.saved_state import SavedRows, StateRecord, StateWrite, StoredState

__all__ = [
    "OutboxDatabase",
    "OUTBOX_FILE",
    "OutboxUnavailableError",
    "DeadLetter",
    "SinkStats",
    "Caps",
    "Dropped",
    "Enforced",
]

OUTBOX_FILE = "outbox.db"

log = structlog.get_logger("watcher.store.outbox")

# `since` columns are readings of the age clock (watcher.store.ages); `enqueued`, `failed`,
# `created` and a gap's `time` are wall-clock times, for people only.
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
    since REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
    sink TEXT NOT NULL,
    seq INTEGER NOT NULL,
    failed REAL NOT NULL,
    status INTEGER,
    error TEXT NOT NULL,
    since REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sinks (
    name TEXT PRIMARY KEY,
    disabled TEXT,
    delivered INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0,
    dead INTEGER NOT NULL DEFAULT 0,
    queued INTEGER NOT NULL DEFAULT 0,
    dead_kept INTEGER NOT NULL DEFAULT 0,
    dead_dropped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS gaps (
    sink TEXT NOT NULL,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    count INTEGER NOT NULL,
    reasons TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (sink, first)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot TEXT NOT NULL,
    boottime REAL NOT NULL,
    age REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
# After the columns they cover exist (an outbox from an older version gains them first).
_INDEXES = """
CREATE INDEX IF NOT EXISTS queue_seq ON queue (seq);
CREATE INDEX IF NOT EXISTS queue_since ON queue (sink, since);
CREATE INDEX IF NOT EXISTS dead_letters_seq ON dead_letters (seq);
CREATE INDEX IF NOT EXISTS dead_letters_since ON dead_letters (sink, since);
"""
# Columns added since the first version, added to an older outbox when it is opened.
_ADDED_COLUMNS = {
    "queue": ("since REAL NOT NULL DEFAULT 0",),
    "dead_letters": ("since REAL NOT NULL DEFAULT 0",),
    "sinks": (
        "queued INTEGER NOT NULL DEFAULT 0",
        "dead_kept INTEGER NOT NULL DEFAULT 0",
        "dead_dropped INTEGER NOT NULL DEFAULT 0",
    ),
}
# An event goes once no queue row and no dead letter holds it: asked only for the seqs an ack or
# a drop released, each an index search (never `NOT IN (SELECT ...)` over the whole table).
_PRUNE = (
    "DELETE FROM events WHERE seq = ?1 AND NOT EXISTS (SELECT 1 FROM queue WHERE seq = ?1) "
    "AND NOT EXISTS (SELECT 1 FROM dead_letters WHERE seq = ?1)"
)


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
    """What `enforce_caps` did: the drops, and whether the queue's caps waited because a batch
    was in flight (its worker applies them again once the batch is done with)."""

    dropped: list[Dropped]
    deferred: bool = False


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


def _seqs(rows: Iterable[tuple[Any, ...]]) -> list[int]:
    return [int(row[0]) for row in rows]


class OutboxDatabase:
    """The outbox database; every method runs on the caller's thread, one transaction each.

    `clocks` is a seam: the wall clock only dates what people read (a dead letter's failure, a
    gap), the boot clock is what ages are measured on (see `watcher.store.ages`)."""

    def __init__(self, path: Path, *, clocks: Clocks | None = None) -> None:
        self.path = path
        self.clocks = clocks or Clocks()
        self._ages = AgeClock(self.clocks.boot)
        self._db: sqlite3.Connection | None = None
        # True when a corrupt database was moved aside: seq must not restart from 0.
        self.recovered_from_corruption = False
        # Sinks whose worker has taken a batch (`take`) and not yet acked, dead-lettered or
        # released it: their queue caps wait until it is done with, so an event is never both
        # delivered and counted as dropped, and what goes is always the oldest.
        self._in_flight: set[str] = set()
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
            self._upgrade(db)
            connected = installed_hooks().connected
            if connected is not None:
                connected(db)
        except BaseException:
            db.close()
            raise
        return db

    def _upgrade(self, db: sqlite3.Connection) -> None:
        """Bring an outbox from an older version up to date, start the age clock, and count
        what each sink holds (once per open: from then on the counts are kept in step)."""
        with _Transaction(db):
            added: set[str] = set()
            for table, columns in _ADDED_COLUMNS.items():
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for column in columns:
                    name = column.split()[0]
                    if name not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                        added.add(f"{table}.{name}")
            # One by one: executescript would COMMIT the transaction first.
            for statement in filter(None, (s.strip() for s in _INDEXES.split(";"))):
                db.execute(statement)
            row = db.execute("SELECT boot, boottime, age FROM clock WHERE id = 1").fetchone()
            self._ages.start(None if row is None else (str(row[0]), float(row[1]), float(row[2])))
            age, wall = self._ages.now(), self.clocks.wall()
            # Rows from before the age clock carry wall-clock times only: they keep the age the
            # wall clock gives them now (never negative), once.
            if "queue.since" in added:
                db.execute("UPDATE queue SET since = ?1 - max(0, ?2 - enqueued)", (age, wall))
            if "dead_letters.since" in added:
                db.execute("UPDATE dead_letters SET since = ?1 - max(0, ?2 - failed)", (age, wall))
            db.execute("INSERT OR IGNORE INTO sinks (name) SELECT DISTINCT sink FROM queue")
            db.execute("INSERT OR IGNORE INTO sinks (name) SELECT DISTINCT sink FROM dead_letters")
            db.execute(
                "UPDATE sinks SET queued = (SELECT COUNT(*) FROM queue q WHERE q.sink = sinks.name), "
                "dead_kept = (SELECT COUNT(*) FROM dead_letters d WHERE d.sink = sinks.name)"
            )
            self._save_clock(db)

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

    def _save_clock(self, db: sqlite3.Connection) -> None:
        """Save the age clock; in every transaction that stamps rows with it, so that after a
        reboot it carries on from at least the newest stamp."""
        db.execute(
            "INSERT INTO clock (id, boot, boottime, age) VALUES (1, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, boottime = excluded.boottime, "
            "age = excluded.age",
            self._ages.reading(),
        )

    # -- the producer side --

    def commit(
        self,
        events: Sequence[Event],
        queues: Mapping[str, Sequence[int]],
        state: StateRecord | None,
    ) -> None:
        """Queue `events` for the sinks in `queues` (sink -> seqs) and store `state`, atomically
        (only its rows that changed: `watcher.store.saved_state`; `last_state_write` says which)."""
        now = self.clocks.wall()
        written = None
        with self._tx() as db:
            since = self._ages.now()
            db.executemany(
                "INSERT OR IGNORE INTO events (seq, id, created, body) VALUES (?, ?, ?, ?)",
                [(e.seq, e.id, now, e.to_json()) for e in events],
            )
            for sink, seqs in queues.items():
                self._enqueue(db, sink, seqs, now, since)
            self._save_clock(db)
            if state is not None:
                written = self._state.write(db, state)
            committing = installed_hooks().committing
            if committing is not None:
                committing(self.path, events)
        if state is not None:
            self._state.committed(state)
        self.last_state_write = written

    @staticmethod
    def _enqueue(db: sqlite3.Connection, sink: str, seqs: Sequence[int], now: float, since: float) -> None:
        if not seqs:
            return
        added = db.executemany(
            "INSERT OR IGNORE INTO queue (sink, seq, enqueued, since) VALUES (?, ?, ?, ?)",
            [(sink, seq, now, since) for seq in seqs],
        ).rowcount
        db.execute("INSERT OR IGNORE INTO sinks (name) VALUES (?)", (sink,))
        db.execute("UPDATE sinks SET queued = queued + ? WHERE name = ?", (added, sink))

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

    def take(self, sink: str, limit: int, *, gaps: bool = False) -> list[Event] | Gap:
        """What `sink`'s worker delivers next: its oldest queued events (at most `limit`, marked in
        flight, so the caps leave them alone until they are acked, dead-lettered or released),
        or, with `gaps`, the gap its stream must record first. Events after a gap wait for it."""
        events = self.pending(sink, limit)
        gap = self.first_gap(sink) if gaps else None
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

    def release(self, sink: str) -> None:
        """`sink`'s worker no longer holds its batch (a failed attempt): the caps may drop it."""
        self._in_flight.discard(sink)

    def _prune(self, db: sqlite3.Connection, seqs: Iterable[int]) -> None:
        db.executemany(_PRUNE, [(s,) for s in seqs])

    def ack(self, sink: str, seqs: Sequence[int]) -> None:
        """`sink` has the events: forget them for it."""
        self._in_flight.discard(sink)
        with self._tx() as db:
            gone = db.executemany(
                "DELETE FROM queue WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs]
            ).rowcount
            db.execute(
                "UPDATE sinks SET delivered = delivered + ?, queued = queued - ? WHERE name = ?",
                (len(seqs), gone, sink),
            )
            self._prune(db, seqs)

    def dead_letter(self, sink: str, seqs: Sequence[int], status: int | None, error: str) -> None:
        """Move `seqs` from `sink`'s queue to its dead letters (its caps apply at `enforce_caps`)."""
        self._in_flight.discard(sink)
        now = self.clocks.wall()
        with self._tx() as db:
            since = self._ages.now()
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
            self._save_clock(db)

    def enforce_caps(self, sink: str, caps: Caps, *, gaps: bool = False) -> Enforced:
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
        deferred = sink in self._in_flight
        with self._tx() as db:
            age = self._ages.now()
            if not deferred:
                aged = _seqs(
                    db.execute(
                        "DELETE FROM queue WHERE sink = ? AND since < ? RETURNING seq",
                        (sink, age - caps.max_age),
                    )
                )
                if aged:
                    drops.append(Dropped.of("max_age", aged))
                row = db.execute("SELECT queued FROM sinks WHERE name = ?", (sink,)).fetchone()
                over = (0 if row is None else int(row[0]) - len(aged)) - caps.max_queue
                if over > 0:
                    capped = _seqs(
                        db.execute(
                            "DELETE FROM queue WHERE sink = ? AND seq IN (SELECT seq FROM queue "
                            "WHERE sink = ? ORDER BY seq LIMIT ?) RETURNING seq",
                            (sink, sink, over),
                        )
                    )
                    if capped:
                        drops.append(Dropped.of("max_queue", capped))
            dead_aged = _seqs(
                db.execute(
                    "DELETE FROM dead_letters WHERE sink = ? AND since < ? RETURNING seq",
                    (sink, age - caps.max_dead_letter_age),
                )
            )
            if dead_aged:
                drops.append(Dropped.of("max_dead_letter_age", dead_aged))
            row = db.execute("SELECT dead_kept FROM sinks WHERE name = ?", (sink,)).fetchone()
            over = (0 if row is None else int(row[0]) - len(dead_aged)) - caps.max_dead_letters
            if over > 0:
                dead_capped = _seqs(
                    db.execute(
                        "DELETE FROM dead_letters WHERE sink = ? AND seq IN (SELECT seq FROM dead_letters "
                        "WHERE sink = ? ORDER BY since, seq LIMIT ?) RETURNING seq",
                        (sink, sink, over),
                    )
                )
                if dead_capped:
                    drops.append(Dropped.of("max_dead_letters", dead_capped))
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
                        self._add_gap(db, sink, drop)
            self._prune(db, [s for d in drops for s in d.seqs])
            self._save_clock(db)
        return Enforced(drops, deferred)

    def _add_gap(self, db: sqlite3.Connection, sink: str, drop: Dropped) -> None:
        """Record the drop as a gap of `sink`'s stream: merged into the gap before it when no
        queued event lies between the two (so a sink that stays blocked has one gap, not one
        per drop), a gap of its own otherwise."""
        wall = self.clocks.wall()
        prev = db.execute(
            "SELECT first, last, reasons FROM gaps WHERE sink = ? ORDER BY first DESC LIMIT 1", (sink,)
        ).fetchone()
        if prev is not None and prev[1] < drop.first:
            between = db.execute(
                "SELECT 1 FROM queue WHERE sink = ? AND seq > ? AND seq < ? LIMIT 1",
                (sink, prev[1], drop.first),
            ).fetchone()
            if between is None:
                db.execute(
                    "UPDATE gaps SET last = ?, count = count + ?, reasons = ?, time = ? "
                    "WHERE sink = ? AND first = ?",
                    (drop.last, drop.count, _reasons(prev[2], drop.reason), wall, sink, prev[0]),
                )
                return
        self._put_gap(db, sink, drop.first, drop.last, drop.count, drop.reason, wall)

    @staticmethod
    def _put_gap(
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

    def first_gap(self, sink: str) -> Gap | None:
        """The oldest gap `sink`'s stream has not recorded yet."""
        row = self.db.execute(
            "SELECT first, last, count, reasons, time FROM gaps WHERE sink = ? ORDER BY first LIMIT 1",
            (sink,),
        ).fetchone()
        if row is None:
            return None
        first, last, count, reasons, when = row
        moment = datetime.fromtimestamp(when, UTC)
        return Gap(first, last, count, tuple(reasons.split(",")), rfc3339(moment))

    def gap_recorded(self, sink: str, gap: Gap) -> None:
        """`sink`'s stream holds `gap`: forget it. A drop merged into it meanwhile stays, as a
        gap of its own from the seq after `gap`."""
        with self._tx() as db:
            row = db.execute(
                "SELECT last, count, reasons, time FROM gaps WHERE sink = ? AND first = ?", (sink, gap.first)
            ).fetchone()
            if row is None:
                return
            db.execute("DELETE FROM gaps WHERE sink = ? AND first = ?", (sink, gap.first))
            last, count, reasons, when = row
            if last > gap.last and count > gap.count:
                self._put_gap(db, sink, gap.last + 1, last, count - gap.count, reasons, when)

    def set_disabled(self, sink: str, reason: str | None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO sinks (name) VALUES (?)", (sink,))
            db.execute("UPDATE sinks SET disabled = ? WHERE name = ?", (reason, sink))

    def sink_names(self) -> list[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM sinks ORDER BY name")]

    def stats(self, sink: str) -> SinkStats:
        db = self.db
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
            oldest_age=None if oldest is None else max(0.0, self._ages.now() - oldest),
            delivered=delivered,
            dropped=dropped,
            dead=dead,
            disabled=disabled,
            dead_letters=kept,
            dead_dropped=dead_dropped,
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
        now = self.clocks.wall()
        with self._tx() as db:
            since = self._ages.now()
            chosen = self._chosen_dead(db, sink, seqs)
            for name in sorted({s for s, _ in chosen}):
                self._enqueue(db, name, [q for s, q in chosen if s == name], now, since)
            self._forget_dead(db, chosen)
            self._save_clock(db)
        return len(chosen)

    def drop_dead(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        with self._tx() as db:
            chosen = self._chosen_dead(db, sink, seqs)
            self._forget_dead(db, chosen)
            self._prune(db, [q for _, q in chosen])
        return len(chosen)

    @staticmethod
    def _forget_dead(db: sqlite3.Connection, chosen: Sequence[tuple[str, int]]) -> None:
        db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
        for name in {s for s, _ in chosen}:
            n = sum(1 for s, _ in chosen if s == name)
            db.execute("UPDATE sinks SET dead_kept = dead_kept - ? WHERE name = ?", (n, name))

    @staticmethod
    def _chosen_dead(
        db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None
    ) -> list[tuple[str, int]]:
        rows = db.execute(
            "SELECT sink, seq FROM dead_letters WHERE (? IS NULL OR sink = ?) ORDER BY seq", (sink, sink)
        ).fetchall()
        wanted = set(seqs) if seqs else None
        return [(s, q) for s, q in rows if wanted is None or q in wanted]


def _reasons(*reasons: str) -> str:
    """The reasons of a gap, in one order, once each: "max_queue,max_age"."""
    given = {r for joined in reasons for r in joined.split(",") if r}
    return ",".join([r for r in GAP_REASONS if r in given] + sorted(given - set(GAP_REASONS)))


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
