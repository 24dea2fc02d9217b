"""The store's own seams: one database thread, the storage health, and the test hooks."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.store.health import StorageHealth
from watcher.store.hooks import StoreHooks, install_hooks
from watcher.store.outbox import OutboxDatabase, OutboxUnavailableError
from watcher.store.saved_state import StateRecord
from watcher.store.store import Store


def _events(*seqs: int) -> list[Event]:
    change = Change(Kind.DEVICE_ADDED, Severity.INFO, "test", {"resource": "gpu", "device": "x", "numa": [0]})
    return [envelope(change, seq=s, node="n", cycle="c", before=None, after=None) for s in seqs]


async def test_every_database_call_runs_on_the_one_store_thread(tmp_path: Path) -> None:
    store = Store(tmp_path / "outbox.db")
    threads: set[str] = set()

    def where(db: OutboxDatabase) -> None:
        threads.add(threading.current_thread().name)

    await store.open()
    await store.register({"hook": None})
    await store.commit(_events(1, 2), {"hook": [1, 2]}, StateRecord({"seq": 2}, None))
    assert [e.seq for e in await store.pending("hook")] == [1, 2]
    await store.ack("hook", [1])
    assert (await store.stats("hook")).depth == 1
    await store.kv_set("k", {"v": 1})
    assert await store.kv_get("k") == {"v": 1}
    assert (await store.load_state()).head == {"seq": 2}
    for _ in range(3):
        await store.run(where)
    await store.close()
    assert len(threads) == 1 and threads != {threading.current_thread().name}


def test_storage_health_reports_and_counts() -> None:
    health = StorageHealth()
    told: list[bool] = []
    health.subscribe(told.append)
    with pytest.raises(OutboxUnavailableError, match="the outbox could not be opened: None"):
        health.require_ready()
    health.open_failed(OSError(28, "No space left on device"))
    assert health.error == health.open_error == "OSError: [Errno 28] No space left on device"
    health.ready.set()
    health.require_ready()
    health.failed(RuntimeError("later"))
    assert (health.error, health.open_error) == (
        "RuntimeError: later",
        "OSError: [Errno 28] No space left on device",
    )
    failing = (health.writable, [health.count_failure() for _ in range(3)], health.failures)
    assert failing == (False, [0, 1, 2], 3)
    health.ok()
    health.ok()
    assert (health.writable, health.error is None, health.failures) == (True, True, 0)
    assert told == [False, False, True, True]


def test_the_hooks_run_at_their_points_and_are_gone_once_put_back(tmp_path: Path) -> None:
    connected: list[sqlite3.Connection] = []
    seen: list[list[int]] = []

    def committing(path: Path, events: Sequence[Event]) -> None:
        seen.append([e.seq for e in events])
        raise OSError(5, "Input/output error")  # a failure inside the transaction rolls it back

    previous = install_hooks(StoreHooks(connected=connected.append, committing=committing))
    db = OutboxDatabase(tmp_path / "outbox.db")
    try:
        db.open()
        db.sinks.register(["hook"])
        with pytest.raises(OSError, match="Input/output error"):
            db.queues.commit(_events(1), {"hook": [1]}, StateRecord({"seq": 1}, None))
    finally:
        install_hooks(previous)
    assert len(connected) == 1 and seen == [[1]]
    assert db.queues.pending("hook") == [] and db.queues.load_state().head is None
    db.queues.commit(_events(1), {"hook": [1]}, StateRecord({"seq": 1}, None))
    assert seen == [[1]] and db.queues.load_state().head == {"seq": 1}
    db.close()
