"""The saved state in rows: a commit writes what changed, atomically with its events, and the
state an older version left (one JSON document) is read once and written anew.

The state's rows are observed through the store's public seam, `last_state_write` (what the last
commit wrote), SQLite's own count of changed rows, and what a fresh database connection loads.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher.kubelet.decoding import Decoder
from watcher.model.build import build
from watcher.model.events import Event
from watcher.model.inventory import Inventory
from watcher.model.records import compact_json
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import large_node
from watcher.store.hooks import StoreHooks, install_hooks
from watcher.store.outbox import OUTBOX_FILE, OutboxDatabase
from watcher.store.saved_state import StateRecord, StateWrite

PODS = 2_000


def _node() -> tuple[FakeKubelet, Decoder]:
    return FakeKubelet("/nonexistent", large_node(pods=PODS), seed=5), Decoder()


def _decode(fake: FakeKubelet, decoder: Decoder) -> Inventory:
    inventory, _ = decoder.decode(
        fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()
    )
    return inventory


def _commit(db: OutboxDatabase, inventory: Inventory | None, seq: int) -> tuple[StateWrite | None, int]:
    """Commit `inventory` as the state; what the commit wrote, and how many rows SQLite changed."""
    changes = db.db.total_changes
    head = {"seq": seq, "hash": inventory.content_hash if inventory is not None else None}
    db.queues.commit([], {}, StateRecord(head, inventory))
    # Every commit also saves the age clock's one row (`watcher.store.ages`): not the state's.
    return db.last_state_write, db.db.total_changes - changes - 1


def _loaded(path: Path) -> Inventory | None:
    fresh = OutboxDatabase(path)
    fresh.open()
    try:
        return fresh.queues.load_state().inventory
    finally:
        fresh.close()


def test_a_single_pod_change_on_a_large_node_writes_that_pods_row_only(tmp_path: Path) -> None:
    fake, decoder = _node()
    db = OutboxDatabase(tmp_path / OUTBOX_FILE)
    db.open()
    first = _decode(fake, decoder)
    assert _commit(db, first, 1) == (StateWrite(pods_written=PODS, allocatable=True, full=True), PODS + 2)

    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])  # one pod's allocation changes
    one = _decode(fake, decoder)
    # The head and that pod's row: nothing else is written, however large the node.
    assert _commit(db, one, 2) == (StateWrite(pods_written=1), 2)
    assert _commit(db, one, 3) == (StateWrite(), 1)  # nothing new: the head (seq) alone

    fake.free("ns-4", "pod-4")
    assert _commit(db, _decode(fake, decoder), 4) == (StateWrite(pods_deleted=1), 2)
    fake.make_unhealthy("vendor0.example.com/dev", "dev-0-5")
    last = _decode(fake, decoder)
    assert _commit(db, last, 5) == (StateWrite(allocatable=True), 2)
    db.close()

    loaded = _loaded(tmp_path / OUTBOX_FILE)
    assert loaded == last and loaded is not None and loaded.content_hash == last.content_hash
    assert len(loaded.pods) == PODS - 1


def test_a_commit_that_fails_leaves_the_rows_and_the_next_writes_against_them(tmp_path: Path) -> None:
    """The rows a commit writes are found against what the database holds, not against what the
    last (failed) commit meant to write: after a rolled-back commit, the next one still leaves
    exactly its own state."""
    fake, decoder = _node()
    db = OutboxDatabase(tmp_path / OUTBOX_FILE)
    db.open()
    base = _decode(fake, decoder)
    _commit(db, base, 1)
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    failed = _decode(fake, decoder)

    def refuse(path: Path, events: Sequence[Event]) -> None:
        raise OSError(5, "Input/output error")

    previous = install_hooks(StoreHooks(committing=refuse))
    try:
        with pytest.raises(OSError, match="Input/output error"):
            _commit(db, failed, 2)
    finally:
        install_hooks(previous)
    fake.free("ns-3", "pod-3")  # pod-3 changed again: the row on disk is still the first one
    fake.allocate("ns-5", "pod-5", "c1", cpu_ids=[301])
    final = _decode(fake, decoder)
    written, _ = _commit(db, final, 2)
    assert written == StateWrite(pods_written=1, pods_deleted=1)
    # After a reopen nothing is known of what the rows hold until they are loaded: all is written.
    db.reopen()
    assert _commit(db, final, 3)[0] == StateWrite(pods_written=PODS - 1, allocatable=True, full=True)
    db.reopen()
    assert db.queues.load_state().inventory == final
    assert _commit(db, final, 4)[0] == StateWrite()
    db.close()
    assert _loaded(tmp_path / OUTBOX_FILE) == final


def test_no_inventory_removes_the_rows(tmp_path: Path) -> None:
    fake, decoder = _node()
    db = OutboxDatabase(tmp_path / OUTBOX_FILE)
    db.open()
    _commit(db, _decode(fake, decoder), 1)
    assert _commit(db, None, 2) == (StateWrite(pods_deleted=PODS, allocatable=True), PODS + 2)
    state = db.queues.load_state()
    assert state.head == {"seq": 2, "hash": None} and state.inventory is None
    db.close()


# --- through the agent ---


@pytest.fixture
async def fake(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(short_tmp / "kubelet", seed=42)
    yield kubelet
    await kubelet.stop(remove_socket=True)


async def test_the_agent_stores_a_one_pod_change_as_that_pods_row(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    kubelet = await start_kubelet(large_node(pods=PODS), seed=42)
    async with running_agent(make_settings(short_tmp, http=False), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        kubelet.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
        mark = len(run.recorder.events)
        await run.recorder.until(lambda: "allocation.changed" in run.recorder.kinds(mark))
        assert run.agent.outbox.last_state_write == StateWrite(pods_written=1)


def _legacy_state(inventory: Inventory, *, seq: int, node: str) -> dict[str, object]:
    """The state as version 2 stored it: one document, the inventory's canonical form (format 2)
    hashed as one compact JSON."""
    canonical = {**inventory.canonical, "format": 2}
    return {
        "version": 2,
        "node": node,
        "seq": seq,
        "hash": "sha256:" + hashlib.sha256(compact_json(canonical)).hexdigest(),
        "inventory": canonical,
        "socket": None,
        "saved_at": 1.0,
    }


def _write_legacy(state_dir: Path, doc: object) -> None:
    db = OutboxDatabase(state_dir / OUTBOX_FILE)
    db.open()
    db.kv.set("state", doc)
    db.close()


async def test_the_state_an_older_version_saved_is_read_once_and_stored_as_rows(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    saved = build(fake.allocatable_response(), fake.list_response())
    _write_legacy(short_tmp / "state", _legacy_state(saved, seq=41, node="node-a"))
    fake.allocate("ml", "trainer-0", "trainer", cpu_ids=[40])  # changed while the agent was away
    await fake.start()
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 2)
        await run.quiet_cycle()
        assert run.recorder.events[0].details["baseline"] == "saved"
        assert run.recorder.events[0].seq == 42  # seq continues from the saved state
        # The change made while it was away, against the saved inventory: not a fresh baseline.
        assert run.recorder.kinds()[:2] == ["watcher.started", "allocation.changed"]
        assert run.recorder.events[1].details["pod"] == "trainer-0"
        assert run.agent.outbox.last_state_write is not None and run.agent.outbox.last_state_write.full
    db = sqlite3.connect(short_tmp / "state" / OUTBOX_FILE)
    try:
        assert db.execute("SELECT COUNT(*) FROM kv WHERE key = 'state'").fetchone() == (0,)
        head = json.loads(db.execute("SELECT value FROM saved_state WHERE part = 'head'").fetchone()[0])
        assert head["version"] == 3 and head["seq"] == run.recorder.events[-1].seq
        assert db.execute("SELECT COUNT(*) FROM saved_pods").fetchone() == (len(saved.pods),)
    finally:
        db.close()
    # And the next start reads the rows: nothing changed, nothing but watcher.started.
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started"]
        assert run.recorder.events[0].details["baseline"] == "saved"


async def test_an_older_state_that_does_not_match_its_hash_is_a_fresh_baseline(
    fake: FakeKubelet, short_tmp: Path
) -> None:
    doc = _legacy_state(build(fake.allocatable_response(), fake.list_response()), seq=41, node="node-a")
    doc["inventory"]["pods"] = []  # type: ignore[index]  # damaged: no longer what was hashed
    _write_legacy(short_tmp / "state", doc)
    await fake.start()
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        assert run.recorder.events[0].details["baseline"] == "fresh"
        assert run.recorder.events[0].seq > 41


async def test_a_pod_row_changed_on_disk_is_a_fresh_baseline(fake: FakeKubelet, short_tmp: Path) -> None:
    """Each pod's row is hashed as it is stored; one edited behind the agent's back no longer
    matches the inventory's recorded hash."""
    await fake.start()
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        first_seq = run.recorder.events[0].seq
    db = sqlite3.connect(short_tmp / "state" / OUTBOX_FILE)
    with db:
        edited = db.execute(
            "UPDATE saved_pods SET body = replace(body, '\"cpu_ids\":[', '\"cpu_ids\":[1,') "
            "WHERE name = 'trainer-0'"
        ).rowcount
    db.close()
    assert edited == 1
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        assert run.recorder.events[0].details["baseline"] == "fresh"
        assert run.recorder.events[0].seq > first_seq
