"""One outbox transaction: BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error."""

from __future__ import annotations

import sqlite3

__all__ = ["Transaction"]


class Transaction:
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
