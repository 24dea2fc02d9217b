"""The outbox's schema upgrades: an outbox at any older `user_version` is brought up to date step by
step and keeps its rows; one written before the numbering keeps its tables exactly; a new one gets
the same schema an old one is upgraded to.

The old files are built here with sqlite3 from the shapes earlier versions wrote, written out by
hand (not taken from the migrations, which they check), then opened with the public API only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from testkit.old_outboxes import BEFORE_THE_NUMBERING, HISTORY
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.store.ages import Clocks
from watcher.store.outbox import OutboxDatabase
from watcher.store.outbox.schema import SCHEMA_VERSION

WALL = 1_800_000_000.0
BOOT = ("boot-1", 1_000.0)


def _events(first: int, last: int) -> list[Event]:
    change = Change(Kind.DEVICE_ADDED, Severity.INFO, "GPU-x joined", {"resource": "gpu", "device": "GPU-x"})
    return [
        envelope(change, seq=s, node="n", cycle="c", before=None, after=None) for s in range(first, last + 1)
    ]


def _clocks() -> Clocks:
    return Clocks(wall=lambda: WALL, boot=lambda: BOOT)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _write_rows(db: sqlite3.Connection) -> None:
    """Rows of every table the file has: 3 events, 2 queued (an hour and a minute old), 1 dead
    letter (a day old), the sink's counts, a key, and from version 4 on a gap and a saved state."""
    db.executemany(
        "INSERT INTO events (seq, id, created, body) VALUES (?, ?, ?, ?)",
        [(e.seq, e.id, WALL, e.to_json()) for e in _events(1, 3)],
    )
    aged = "since" in _columns(db, "queue")
    if aged:  # stamped on the age clock, which stands at 0 (the clock row below)
        db.execute("INSERT INTO clock VALUES (1, ?, ?, 0)", BOOT)
        db.executemany(
            "INSERT INTO queue (sink, seq, enqueued, since) VALUES ('hook', ?, ?, ?)",
            [(1, WALL - 3600, -3600.0), (2, WALL - 60, -60.0)],
        )
        db.execute("INSERT INTO dead_letters VALUES ('hook', 3, ?, 400, 'bad', ?)", (WALL - 86400, -86400.0))
    else:  # wall-clock stamps only: the upgrade gives them the ages these make
        db.executemany("INSERT INTO queue VALUES ('hook', ?, ?)", [(1, WALL - 3600), (2, WALL - 60)])
        db.execute("INSERT INTO dead_letters VALUES ('hook', 3, ?, 400, 'bad')", (WALL - 86400,))
    # Counts a version that keeps them may have got wrong: every open counts afresh.
    db.execute("INSERT INTO sinks (name, delivered, dead) VALUES ('hook', 7, 1)")
    db.execute("""INSERT INTO kv VALUES ('k', '{"v":1}')""")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "gaps" in tables:
        db.execute("INSERT INTO gaps VALUES ('audit', 10, 12, 3, 'max_queue', ?)", (WALL,))
    if "saved_state" in tables:
        db.execute("""INSERT INTO saved_state VALUES ('head', '{"seq":3}')""")


def _old_outbox(path: Path, version: int, script: str | None = None) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(script or "".join(HISTORY[v] for v in range(1, max(version, 1) + 1)))
    db.execute("BEGIN")
    _write_rows(db)
    db.execute("COMMIT")
    db.execute(f"PRAGMA user_version = {version}")
    db.close()


def _user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def _schema(path: Path) -> dict[str, Any]:
    """Every table's columns (name, type, not null, default, key), WITHOUT ROWID or not, and
    every index's columns: the schema as SQLite uses it, whatever text made it."""
    db = sqlite3.connect(path)
    try:
        shape: dict[str, Any] = {}
        for name, _type, _ncol, without_rowid, _strict in db.execute(
            "SELECT name, type, ncol, wr, strict FROM pragma_table_list WHERE schema = 'main' "
            "AND name NOT LIKE 'sqlite_%'"
        ):
            columns = [row[1:] for row in db.execute(f"PRAGMA table_xinfo({name})")]
            indexes = {
                idx[1]: ([c[2] for c in db.execute(f"PRAGMA index_info({idx[1]})")], idx[2], idx[3])
                for idx in db.execute(f"PRAGMA index_list({name})")
            }
            shape[name] = (columns, without_rowid, indexes)
        return shape
    finally:
        db.close()


def test_the_migrations_are_numbered_from_one_without_a_hole() -> None:
    assert sorted(HISTORY) == list(range(1, SCHEMA_VERSION + 1)), "a new migration needs its shape here"


@pytest.mark.parametrize("version", range(SCHEMA_VERSION), ids=lambda v: f"user_version={v}")
def test_an_outbox_at_an_older_version_is_upgraded_and_keeps_its_rows(tmp_path: Path, version: int) -> None:
    path = tmp_path / "outbox.db"
    _old_outbox(path, version)
    db = OutboxDatabase(path, clocks=_clocks())
    db.open()
    try:
        assert [e.seq for e in db.queues.pending("hook")] == [1, 2]
        assert [(d.seq, d.status, d.error) for d in db.dead_letters.held("hook")] == [(3, 400, "bad")]
        stats = db.sinks.stats("hook")
        assert (stats.depth, stats.delivered, stats.dead, stats.dead_letters) == (2, 7, 1, 1)
        assert stats.oldest_age == pytest.approx(3600)
        assert db.kv.get("k") == {"v": 1}
        assert db.queues.max_seq() == 3
        gap = db.gaps.first("audit")
        assert (gap is not None) == (version >= 4)
        assert db.queues.load_state().head == ({"seq": 3} if version >= 5 else None)
        # And it works as a new one does: a commit, an ack, a dead letter put back.
        db.queues.commit(_events(4, 4), {"hook": [4]}, None)
        db.queues.ack("hook", [1])
        assert db.dead_letters.retry("hook") == 1
        assert [e.seq for e in db.queues.pending("hook")] == [2, 3, 4]
    finally:
        db.close()
    assert _user_version(path) == SCHEMA_VERSION
    assert _schema(path) == _schema(_fresh(tmp_path))


def _fresh(tmp_path: Path) -> Path:
    path = tmp_path / "fresh" / "outbox.db"
    db = OutboxDatabase(path, clocks=_clocks())
    db.open()
    db.close()
    return path


def test_an_outbox_from_before_the_numbering_keeps_its_tables_exactly(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    _old_outbox(path, 0, BEFORE_THE_NUMBERING)

    def master() -> list[tuple[str, str, str]]:
        db = sqlite3.connect(path)
        try:
            return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        finally:
            db.close()

    before = master()
    db = OutboxDatabase(path, clocks=_clocks())
    db.open()
    assert [e.seq for e in db.queues.pending("hook")] == [1, 2]
    assert db.sinks.stats("hook").oldest_age == pytest.approx(3600)  # its stamps are kept as they are
    db.close()
    assert master() == before
    assert _user_version(path) == SCHEMA_VERSION
    # A new outbox has that schema too (its text differs where a column was added by ALTER TABLE).
    assert _schema(_fresh(tmp_path)) == _schema(path)


def test_an_outbox_from_a_newer_version_is_opened_as_it_is(tmp_path: Path) -> None:
    """An agent rolled back to: migrations only add, so the tables it knows are all there."""
    path = tmp_path / "outbox.db"
    _old_outbox(path, SCHEMA_VERSION + 1, "".join(HISTORY.values()))
    db = OutboxDatabase(path, clocks=_clocks())
    db.open()
    assert [e.seq for e in db.queues.pending("hook")] == [1, 2]
    db.close()
    assert _user_version(path) == SCHEMA_VERSION + 1
