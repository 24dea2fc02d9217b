"""The watcher's persisted state: the last inventory, `seq`, and the socket it came from.

It is stored in the outbox database, in the same transaction as the events it
produced (watcher.store.outbox), so it can never move past an event that is not
safely queued: a small head (this module's JSON) and the inventory, a row per pod
(watcher.store.saved_state), so a change writes what changed. This module makes the
record to store and reads it back; anything unreadable is a warning and a fresh
baseline, never a crash. Version 2 (the whole state as one JSON document) is read
once, after an upgrade; the next commit stores it as version 3.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from watcher.kubelet.health import KubeletHealth
from watcher.kubelet.identity import FileIdentity
from watcher.model.devicehealth.evictions import Evictions
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.expected import Expected
from watcher.model.flapping import Flaps
from watcher.model.incidents import Incidents
from watcher.model.inventory import Inventory
from watcher.model.records import compact_json
from watcher.model.rejections import Rejections
from watcher.model.resets import Resets
from watcher.model.restore import from_canonical
from watcher.model.settling import Settling
from watcher.store.saved_state import StateRecord, StoredState

__all__ = ["CycleState", "SavedState", "state_record", "state_from_store", "VERSION"]

VERSION = 3
_LEGACY_VERSION = 2  # the whole state in one document, hashed as one canonical JSON

log = structlog.get_logger("watcher.cycle.state")


@dataclass(frozen=True)
class SavedState:
    seq: int = 0
    inventory: Inventory | None = None
    socket: FileIdentity | None = None
    node: str | None = None
    device_health: DeviceHealth = field(default_factory=DeviceHealth)
    incidents: Incidents = field(default_factory=Incidents)
    flaps: Flaps = field(default_factory=Flaps)
    evictions: Evictions = field(default_factory=Evictions)
    expected: Expected = field(default_factory=Expected)
    rejections: Rejections = field(default_factory=Rejections)
    resets: Resets = field(default_factory=Resets)


@dataclass(frozen=True)
class CycleState:
    """Everything a re-query may move. A cycle works on a copy and the copy replaces this value
    only when its events are stored (or when it has nothing to store); a failed commit drops it,
    so the lifecycle events it held (restarted, unreachable, reachable, degraded) come again."""

    seq: int = 0
    inventory: Inventory | None = None
    socket: FileIdentity | None = None  # the socket the inventory came from
    health: KubeletHealth = field(default_factory=KubeletHealth)
    started_reported: bool = False  # watcher.started is stored
    last_snapshot: float = 0.0  # monotonic time of the last inventory.snapshot
    settling: Settling = field(default_factory=Settling)  # what the kubelet's warm-up holds back
    invalid_text: frozenset[str] = frozenset()  # repaired strings already reported
    flaps: Flaps = field(default_factory=Flaps)  # devices changing health often
    incidents: Incidents = field(default_factory=Incidents)  # mass failures not yet back
    device_health: DeviceHealth = field(default_factory=DeviceHealth)  # DRA verdicts reported
    evictions: Evictions = field(default_factory=Evictions)  # device-taint evictions told
    expected: Expected = field(default_factory=Expected)  # resources short of their expected count
    rejections: Rejections = field(default_factory=Rejections)  # admission rejections told
    resets: Resets = field(default_factory=Resets)  # failed devices; heals a plugin's restart explains


def state_record(state: SavedState) -> StateRecord:
    """What a commit stores: the head (small JSON) and the inventory, stored a row per pod."""
    head = {
        "version": VERSION,
        "node": state.node,
        "seq": state.seq,
        "hash": state.inventory.content_hash if state.inventory is not None else None,
        "socket": state.socket.to_json() if state.socket is not None else None,
        # The DRA failures reported and not healed: a restart must neither page them again nor
        # lose their resolve. Small (the open stories only); unreadable reads back empty.
        "device_health": state.device_health.to_json(),
        # Open incidents and flapping devices likewise: a restart must still send their ends.
        "incidents": state.incidents.to_json(),
        "flaps": state.flaps.to_json(),
        # The evictions told: a restart must not tell them again.
        "evictions": state.evictions.to_json(now=time.monotonic()),
        # Resources short of their expected devices: a restart must neither page nor lose the resolve.
        "expected": state.expected.to_json(),
        # The rejected pods told (a restart must not tell them again) and an open incident.
        "rejections": state.rejections.to_json(now=time.monotonic()),
        # Failed devices and the heals held after a plugin's reset: told once across restarts.
        "resets": state.resets.to_json(),
        "saved_at": time.time(),
    }
    return StateRecord(head=head, inventory=state.inventory)


def _fresh_seq() -> int:
    # The old seq is lost: continue from the wall clock in milliseconds, far
    # above anything a node reaches otherwise, so consumers never see a repeat.
    return int(time.time() * 1000)


def state_from_store(stored: StoredState, *, min_seq: int = 0, lost: bool = False) -> SavedState:
    """The saved state; nothing stored is a first run, anything unreadable a warning and a fresh baseline.

    `min_seq` is the highest seq known to exist elsewhere (the outbox's events); `lost`
    says an earlier state was lost (a corrupt outbox), so seq must not start from 0 again.
    """
    nothing = stored.head is None and stored.legacy is None and stored.error is None
    if nothing and lost:
        seq = max(_fresh_seq(), min_seq)
        log.warning("saved state was lost with the outbox: fresh baseline", seq_restarts_at=seq + 1)
        return SavedState(seq=seq)
    if nothing:
        log.info("no saved state: first run, taking a fresh baseline")
        return SavedState(seq=min_seq)
    try:
        if stored.error is not None:
            raise ValueError(stored.error)
        if stored.legacy is not None:
            doc, inventory = stored.legacy, _legacy_inventory(stored.legacy)
            log.info("saved state of version 2 read: it is stored as version 3 from the next commit")
        else:
            doc, inventory = stored.head, stored.inventory
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                version = doc.get("version") if isinstance(doc, dict) else doc
                raise ValueError(f"unsupported state version {version!r}")
            if (inventory.content_hash if inventory is not None else None) != doc.get("hash"):
                raise ValueError("inventory does not match its recorded hash")
        seq = doc["seq"]
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"bad seq {seq!r}")
        node = doc.get("node")
        return SavedState(
            seq=max(seq, min_seq),
            inventory=inventory,
            socket=FileIdentity.from_json(doc.get("socket")),
            node=node if isinstance(node, str) else None,
            device_health=DeviceHealth.from_json(doc.get("device_health"), now=time.monotonic()),
            incidents=Incidents.from_json(doc.get("incidents")),
            flaps=Flaps.from_json(doc.get("flaps"), now=time.monotonic()),
            evictions=Evictions.from_json(doc.get("evictions"), now=time.monotonic()),
            expected=Expected.from_json(doc.get("expected")),
            rejections=Rejections.from_json(doc.get("rejections"), now=time.monotonic()),
            resets=Resets.from_json(doc.get("resets"), now=time.monotonic()),
        )
    except (ValueError, KeyError, TypeError) as err:
        seq = max(_fresh_seq(), min_seq)
        log.warning(
            "saved state is unreadable: taking a fresh baseline", error=str(err), seq_restarts_at=seq + 1
        )
        return SavedState(seq=seq)


def _legacy_inventory(doc: Any) -> Inventory | None:
    """Version 2's inventory, checked against its hash as version 2 made it (of the whole canonical JSON)."""
    if not isinstance(doc, dict) or doc.get("version") != _LEGACY_VERSION:
        version = doc.get("version") if isinstance(doc, dict) else doc
        raise ValueError(f"unsupported state version {version!r}")
    canonical = doc.get("inventory")
    if canonical is None:
        return None
    if doc.get("hash") != "sha256:" + hashlib.sha256(compact_json(canonical)).hexdigest():
        raise ValueError("inventory does not match its recorded hash")
    return from_canonical(canonical)
