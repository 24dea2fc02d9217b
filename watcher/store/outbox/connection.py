"""The outbox's connection: opening the file privately, a corrupt one moved aside, the clocks.

Every event's payload is in the database, so the state directory is 0700 and the database (with
its -wal and -shm) 0600, whatever the umask; none of them may be a symbolic link (refused before
SQLite opens anything, so a link's target is never touched; see `watcher.files`).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import structlog

from watcher.files import check_private, private_dir
from watcher.store.ages import AgeClock, Clocks
from watcher.store.hooks import installed_hooks
from watcher.store.outbox.schema import migrate, save_clock, settle
from watcher.store.outbox.transaction import Transaction

__all__ = ["OUTBOX_FILE", "Connection", "OutboxUnavailableError"]

OUTBOX_FILE = "outbox.db"

log = structlog.get_logger("watcher.store.outbox")


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


class Connection:
    """The open database (or none), the clocks its rows are stamped with, and its transactions.

    `clocks` is a seam: the wall clock only dates what people read (a dead letter's failure, a
    gap), the boot clock is what ages are measured on (see `watcher.store.ages`)."""

    def __init__(self, path: Path, clocks: Clocks | None = None) -> None:
        self.path = path
        self.clocks = clocks or Clocks()
        self.ages = AgeClock(self.clocks.boot)
        self._db: sqlite3.Connection | None = None
        # True when a corrupt database was moved aside: seq must not restart from 0.
        self.recovered_from_corruption = False

    def open(self) -> None:
        private_dir(self.path.parent, "state directory", tighten=True, own=(self.path.name,))
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

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise OutboxUnavailableError(f"the outbox {self.path} is not open")
        return self._db

    def tx(self) -> Transaction:
        return Transaction(self.db)

    def save_clock(self, db: sqlite3.Connection) -> None:
        """Save the age clock, in a transaction that stamps rows with it (`schema.save_clock`)."""
        save_clock(db, self.ages)

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
            migrate(db, self.ages, self.clocks)
            settle(db, self.ages)
            connected = installed_hooks().connected
            if connected is not None:
                connected(db)
        except BaseException:
            db.close()
            raise
        return db
