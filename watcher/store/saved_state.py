"""The watcher's saved state in the outbox database: a row per pod, so a commit writes what changed.

A large node's inventory is megabytes; rewriting it on every change wrote (with SQLite's WAL and
its checkpoint) several times that per change, for a one-pod change. The state is therefore
kept in rows, and a commit writes only the rows whose content changed, in the same transaction
as the events (`Queues.commit`, watcher.store.outbox.queues):

- `saved_state`, part `head`: the small JSON the cycle layer gives (seq, node, the inventory's
  hash, the socket: `watcher.cycle.state`), rewritten on every commit;
- `saved_state`, part `allocatable`: the inventory without its pods (`Inventory.allocatable_bytes`),
  written when the allocatable side changed; absent when there is no inventory;
- `saved_pods`: each pod's canonical JSON (`Pod.canonical_bytes`), keyed by namespace and name;
  a commit inserts, updates or deletes the rows of the pods that changed.

Which rows changed is found against the inventory the database is known to hold (`SavedRows`
remembers it: the last one loaded or committed, the same object the committer holds, so it
costs no memory). When that is not known (the database was just opened or reopened and nothing
was loaded, or what was loaded did not parse), the next commit rewrites the whole state.

Older versions kept the whole state as one JSON document in `kv` under `state`. It is returned
as it is (`StoredState.legacy`) for the cycle layer to read once; the first commit after it
writes the rows and deletes it, in one transaction.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from watcher.model.inventory import Inventory, changed_pods
from watcher.model.records import Pod
from watcher.model.restore import allocatable_from_canonical, pod_from_json

__all__ = ["SCHEMA", "StateRecord", "StoredState", "StateWrite", "SavedRows"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS saved_state (
    part TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saved_pods (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
"""

_LEGACY_KEY = "state"  # kv's key of the whole-document state of older versions


@dataclass(frozen=True)
class StateRecord:
    """What a commit stores as the watcher's state: `head` (small, JSON-ready) and the inventory."""

    head: Mapping[str, Any]
    inventory: Inventory | None


@dataclass(frozen=True)
class StoredState:
    """What the database holds. `head` None: no state (a first run). `error`: the rows did not
    parse (the inventory is then None). `legacy`: an older version's whole document instead."""

    head: Mapping[str, Any] | None = None
    inventory: Inventory | None = None
    error: str | None = None
    legacy: Any = None


@dataclass(frozen=True)
class StateWrite:
    """The rows one commit wrote for the state (the head row aside): what a change cost."""

    pods_written: int = 0  # inserted or updated
    pods_deleted: int = 0
    allocatable: bool = False  # the allocatable row written (or deleted)
    full: bool = False  # everything rewritten: what the database held was not known

    @property
    def rows(self) -> int:
        """Rows written, the head's included."""
        return 1 + self.pods_written + self.pods_deleted + int(self.allocatable)


class _Unknown:
    pass


_UNKNOWN = _Unknown()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class SavedRows:
    """The state's rows in one database: loading them, and writing what a commit changed."""

    def __init__(self) -> None:
        # The inventory the rows hold (None: no inventory), or _UNKNOWN.
        self._held: Inventory | _Unknown | None = _UNKNOWN

    def forget(self) -> None:
        """The database was (re)opened: what it holds is known again only once loaded."""
        self._held = _UNKNOWN

    def load(self, db: sqlite3.Connection) -> StoredState:
        self._held = _UNKNOWN
        parts = dict(db.execute("SELECT part, value FROM saved_state").fetchall())
        try:
            if "head" not in parts:
                row = db.execute("SELECT value FROM kv WHERE key = ?", (_LEGACY_KEY,)).fetchone()
                return StoredState(legacy=json.loads(row[0])) if row is not None else StoredState()
            head = json.loads(parts["head"])
            inventory = None
            if "allocatable" in parts:
                devices, cpu_ids, memory, known = allocatable_from_canonical(json.loads(parts["allocatable"]))
                inventory = Inventory(devices, cpu_ids, memory, self._pods(db), allocatable_known=known)
        except ValueError as err:  # json's errors are ValueErrors too
            return StoredState(error=str(err))
        # No inventory: whatever rows there are get cleared by the next commit's full write.
        self._held = inventory if inventory is not None else _UNKNOWN
        return StoredState(head=head, inventory=inventory)

    @staticmethod
    def _pods(db: sqlite3.Connection) -> tuple[Pod, ...]:
        """Every pod, in the inventory's order. One row at a time: never every pod's JSON in
        memory at once. Each row's bytes are its pod's digest as they are (`pod_from_json`): the
        inventory's hash, checked against the recorded one, covers them without re-encoding."""
        # SQLite's order of TEXT (UTF-8 bytes) is Python's order of str (code points).
        rows = db.execute("SELECT body FROM saved_pods ORDER BY namespace, name")
        pods = tuple(pod_from_json(body.encode()) for (body,) in rows)
        if any((a.namespace, a.name) >= (b.namespace, b.name) for a, b in itertools.pairwise(pods)):
            raise ValueError("saved pods out of order or listed twice")
        return pods

    def write(self, db: sqlite3.Connection, state: StateRecord) -> StateWrite:
        """Write `state` inside the caller's transaction; `committed()` once it is committed."""
        db.execute(
            "INSERT INTO saved_state (part, value) VALUES ('head', ?) "
            "ON CONFLICT (part) DO UPDATE SET value = excluded.value",
            (_dumps(state.head),),
        )
        held, full = self._held, False
        if isinstance(held, _Unknown):
            db.execute("DELETE FROM saved_pods")
            db.execute("DELETE FROM saved_state WHERE part = 'allocatable'")
            db.execute("DELETE FROM kv WHERE key = ?", (_LEGACY_KEY,))
            held, full = None, True
        inventory = state.inventory
        if inventory is None:
            if held is None:
                return StateWrite(full=full)
            db.execute("DELETE FROM saved_state WHERE part = 'allocatable'")
            cleared = db.execute("DELETE FROM saved_pods").rowcount
            return StateWrite(pods_deleted=cleared, allocatable=True, full=full)
        allocatable = held is None or not _same_allocatable(held, inventory)
        if allocatable:
            db.execute(
                "INSERT INTO saved_state (part, value) VALUES ('allocatable', ?) "
                "ON CONFLICT (part) DO UPDATE SET value = excluded.value",
                (inventory.allocatable_bytes.decode(),),
            )
        if held is None:
            written, deleted = list(inventory.pods), []
        else:
            gone, written = changed_pods(held, inventory)
            kept = {(p.namespace, p.name) for p in written}
            deleted = [p for p in gone if (p.namespace, p.name) not in kept]
        if written:
            db.executemany(
                "INSERT INTO saved_pods (namespace, name, body) VALUES (?, ?, ?) "
                "ON CONFLICT (namespace, name) DO UPDATE SET body = excluded.body",
                ((p.namespace, p.name, p.canonical_bytes.decode()) for p in written),
            )
        if deleted:
            db.executemany(
                "DELETE FROM saved_pods WHERE namespace = ? AND name = ?",
                ((p.namespace, p.name) for p in deleted),
            )
        return StateWrite(
            pods_written=len(written), pods_deleted=len(deleted), allocatable=allocatable, full=full
        )

    def committed(self, state: StateRecord) -> None:
        self._held = state.inventory


def _same_allocatable(a: Inventory, b: Inventory) -> bool:
    # The decoder carries an unchanged allocatable side over as the same tuples: `is` first.
    return a.allocatable_known == b.allocatable_known and all(
        x is y or x == y for x, y in ((a.devices, b.devices), (a.cpu_ids, b.cpu_ids), (a.memory, b.memory))
    )
