"""The watcher's persisted state: the last inventory, its hash, `seq`, and the socket it came from.

Written atomically (temp file, fsync, rename, fsync of the directory) so a
crash leaves either the old state or the new one, never half of each. On
start the watcher diffs against it, so an agent restart reports only what
really changed while it was away.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from watcher.inventory import Inventory, from_canonical
from watcher.watching import FileIdentity

__all__ = ["SavedState", "load_state", "save_state", "write_atomically", "STATE_FILE"]

STATE_FILE = "state.json"
VERSION = 1

log = structlog.get_logger("watcher.state")


@dataclass(frozen=True)
class SavedState:
    seq: int = 0
    inventory: Inventory | None = None
    socket: FileIdentity | None = None
    node: str | None = None


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename itself must reach the disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_state(state_dir: Path, state: SavedState) -> None:
    doc: dict[str, Any] = {
        "version": VERSION,
        "node": state.node,
        "seq": state.seq,
        "hash": state.inventory.content_hash if state.inventory is not None else None,
        "inventory": state.inventory.canonical if state.inventory is not None else None,
        "socket": state.socket.to_json() if state.socket is not None else None,
        "saved_at": time.time(),
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(state_dir / STATE_FILE, json.dumps(doc, separators=(",", ":")).encode())


def _fresh_seq() -> int:
    # The old seq is lost: continue from the wall clock in milliseconds, far
    # above anything a node reaches otherwise, so consumers never see a repeat.
    return int(time.time() * 1000)


def load_state(state_dir: Path) -> SavedState:
    """The saved state; a missing one is a first run, a corrupt one a warning and a fresh baseline."""
    path = state_dir / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        log.info("no saved state: first run, taking a fresh baseline", path=str(path))
        return SavedState()
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError(
                f"unsupported state version {doc.get('version') if isinstance(doc, dict) else doc!r}"
            )
        seq = doc["seq"]
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"bad seq {seq!r}")
        inventory = from_canonical(doc["inventory"]) if doc.get("inventory") is not None else None
        if inventory is not None and doc.get("hash") != inventory.content_hash:
            raise ValueError("inventory does not match its recorded hash")
        node = doc.get("node")
        return SavedState(
            seq=seq,
            inventory=inventory,
            socket=FileIdentity.from_json(doc.get("socket")),
            node=node if isinstance(node, str) else None,
        )
    except (ValueError, KeyError, TypeError) as err:
        seq = _fresh_seq()
        log.warning(
            "saved state is corrupt: taking a fresh baseline",
            path=str(path),
            error=str(err),
            seq_restarts_at=seq + 1,
        )
        return SavedState(seq=seq)
