"""`OutboxDatabase`: the outbox's parts over one connection, opened and closed together."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from watcher.store.ages import Clocks
from watcher.store.outbox.caps import CapEnforcer
from watcher.store.outbox.connection import Connection
from watcher.store.outbox.dead_letters import DeadLetters
from watcher.store.outbox.gaps import Gaps
from watcher.store.outbox.kv import KeyValueTable
from watcher.store.outbox.queues import Queues
from watcher.store.outbox.sinks import Sinks
from watcher.store.saved_state import StateWrite

__all__ = ["OutboxDatabase"]


class OutboxDatabase:
    """The outbox database; every call runs on the caller's thread, one transaction each.

    Its work is in its parts: `queues` (commit, take, ack, release), `caps` (enforce), `gaps`
    (the gap rows), `dead_letters` (add, held, retry, drop), `sinks` (register, stats) and `kv`.
    `clocks` is a seam: the wall clock only dates what people read (a dead letter's failure, a
    gap), the boot clock is what ages are measured on (see `watcher.store.ages`)."""

    def __init__(self, path: Path, *, clocks: Clocks | None = None) -> None:
        self.connection = Connection(path, clocks)
        self.gaps = Gaps(self.connection)
        self.queues = Queues(self.connection, self.gaps)
        self.caps = CapEnforcer(self.connection, self.queues, self.gaps)
        self.dead_letters = DeadLetters(self.connection, self.queues)
        self.sinks = Sinks(self.connection)
        self.kv = KeyValueTable(self.connection)

    @property
    def path(self) -> Path:
        return self.connection.path

    @property
    def clocks(self) -> Clocks:
        return self.connection.clocks

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection (OutboxUnavailableError when there is none)."""
        return self.connection.db

    @property
    def recovered_from_corruption(self) -> bool:
        """A corrupt database was moved aside when it was opened: seq must not restart from 0."""
        return self.connection.recovered_from_corruption

    @property
    def last_state_write(self) -> StateWrite | None:
        """What the last commit wrote of the state (None: it stored none)."""
        return self.queues.last_state_write

    def open(self) -> None:
        self.queues.forget_state()
        self.connection.open()

    def close(self) -> None:
        """Close the connection; `open()` may be called again."""
        self.connection.close()
        self.queues.forget_state()

    def reopen(self) -> None:
        """Close the database and open it again. After the disk under it failed (I/O errors,
        an emergency read-only remount) a fresh connection, on whatever is mounted there now,
        is the only way back."""
        self.close()
        self.open()
