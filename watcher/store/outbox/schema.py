"""The outbox's schema: numbered migrations under `PRAGMA user_version`, and what every open does.

A new outbox and an old one are made the same way: each migration after the database's
`user_version` is applied once, in order, in a transaction of its own that also sets
`user_version` to its number, so an upgrade stopped half-way (a crash, a full disk) resumes
from the last step that committed. A migration, once released, is never edited: a change to
the schema is a new one at the end of `MIGRATIONS`.

Outboxes written before the numbering all say `user_version` 0, whatever their shape (the first
version's, or one with the columns added since), so every step is written to be a no-op on what
is already there: `CREATE ... IF NOT EXISTS`, and a column added only when it is missing. An
outbox at 0 therefore goes through every step and keeps its tables as they are.

After the migrations, every open starts the age clock from the saved reading and counts what
each sink holds (from then on the `sinks` row keeps the count in step): `settle`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from watcher.store.ages import AgeClock, Clocks, Reading
from watcher.store.outbox.transaction import Transaction
from watcher.store.saved_state import SCHEMA as SAVED_STATE_SCHEMA

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "migrate",
    "settle",
    "load_clock",
    "save_clock",
    "user_version",
]

log = structlog.get_logger("watcher.store.outbox")

_FIRST = """
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
# The `since` columns (added by `_ages`) are readings of the age clock (watcher.store.ages);
# `enqueued`, `failed`, `created` and a gap's `time` are wall-clock times, for people only.
_CLOCK = """
CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot TEXT NOT NULL,
    boottime REAL NOT NULL,
    age REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_since ON queue (sink, since);
CREATE INDEX IF NOT EXISTS dead_letters_since ON dead_letters (sink, since);
"""
_GAPS = """
CREATE TABLE IF NOT EXISTS gaps (
    sink TEXT NOT NULL,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    count INTEGER NOT NULL,
    reasons TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (sink, first)
) WITHOUT ROWID;
"""


def _run(db: sqlite3.Connection, script: str) -> None:
    # One by one: executescript would COMMIT the migration's transaction first.
    for statement in filter(None, (s.strip() for s in script.split(";"))):
        db.execute(statement)


def _add_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    """Add `column` (its definition) to `table` unless it is there already; True if added."""
    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if column.split()[0] in have:
        return False
    db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    return True


def _first(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    _run(db, _FIRST)


def _ages(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    queue = _add_column(db, "queue", "since REAL NOT NULL DEFAULT 0")
    dead = _add_column(db, "dead_letters", "since REAL NOT NULL DEFAULT 0")
    _run(db, _CLOCK)
    if not (queue or dead):
        return
    ages.start(load_clock(db))
    age, wall = ages.now(), clocks.wall()
    # Rows from before the age clock carry wall-clock times only: they keep the age the wall
    # clock gives them now (never negative), once.
    if queue:
        db.execute("UPDATE queue SET since = ?1 - max(0, ?2 - enqueued)", (age, wall))
    if dead:
        db.execute("UPDATE dead_letters SET since = ?1 - max(0, ?2 - failed)", (age, wall))
    save_clock(db, ages)


def _counted_sinks(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    for column in ("queued", "dead_kept", "dead_dropped"):
        _add_column(db, "sinks", f"{column} INTEGER NOT NULL DEFAULT 0")


def _gaps(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    _run(db, _GAPS)


def _saved_state(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    _run(db, SAVED_STATE_SCHEMA)


@dataclass(frozen=True)
class Migration:
    """Step `version`: what it brings, and how. `apply` runs inside the step's transaction; it
    may read the age clock (to stamp rows that predate it) and the wall clock."""

    version: int
    brings: str
    apply: Callable[[sqlite3.Connection, AgeClock, Clocks], None]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "events, per-sink queues, dead letters, sinks and the key-value table", _first),
    Migration(2, "ages on the boot clock: rows stamped `since`, the clock row, age indexes", _ages),
    Migration(3, "each sink's queued and dead letters counted in its row", _counted_sinks),
    Migration(4, "gap rows: what a sink's caps dropped from its stream", _gaps),
    Migration(5, "the saved state as rows (watcher.store.saved_state)", _saved_state),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, ages: AgeClock, clocks: Clocks) -> None:
    """Apply, in order, each migration the database has not had yet, each in its own transaction."""
    version = user_version(db)
    if version > SCHEMA_VERSION:
        # A newer agent wrote it and this one was rolled back to: the tables it knows are still
        # there (migrations only add), so it carries on rather than refuse to store anything.
        log.warning("outbox schema is newer than this version knows", version=version, known=SCHEMA_VERSION)
    for step in MIGRATIONS:
        if step.version <= version:
            continue
        with Transaction(db):
            step.apply(db, ages, clocks)
            # PRAGMA takes no parameters; the version is one of ours, an int.
            db.execute(f"PRAGMA user_version = {int(step.version)}")


def settle(db: sqlite3.Connection, ages: AgeClock) -> None:
    """Start the age clock and count what each sink holds: once per open, after `migrate`."""
    with Transaction(db):
        ages.start(load_clock(db))
        db.execute("INSERT OR IGNORE INTO sinks (name) SELECT DISTINCT sink FROM queue")
        db.execute("INSERT OR IGNORE INTO sinks (name) SELECT DISTINCT sink FROM dead_letters")
        db.execute(
            "UPDATE sinks SET queued = (SELECT COUNT(*) FROM queue q WHERE q.sink = sinks.name), "
            "dead_kept = (SELECT COUNT(*) FROM dead_letters d WHERE d.sink = sinks.name)"
        )
        save_clock(db, ages)


def load_clock(db: sqlite3.Connection) -> Reading | None:
    row = db.execute("SELECT boot, boottime, age FROM clock WHERE id = 1").fetchone()
    return None if row is None else (str(row[0]), float(row[1]), float(row[2]))


def save_clock(db: sqlite3.Connection, ages: AgeClock) -> None:
    """Save the age clock; in every transaction that stamps rows with it, so that after a
    reboot it carries on from at least the newest stamp."""
    db.execute(
        "INSERT INTO clock (id, boot, boottime, age) VALUES (1, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, boottime = excluded.boottime, "
        "age = excluded.age",
        ages.reading(),
    )
