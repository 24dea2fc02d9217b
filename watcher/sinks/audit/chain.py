"""The audit log's records: one JSON record per line, each chained to the one before it.

A record is {"n", "prev", "event", "hash"}. `n` counts records from 1 and never restarts, across
rotations and agent restarts; `prev` is the `hash` of record n-1 (GENESIS for the first); `hash`
is, over the record's canonical JSON without the `hash` key, either its SHA-256 (`sha256:...`, an
unkeyed log) or its HMAC-SHA256 under the sink's key (`hmac-sha256:...`, a keyed log). A gap
record, {"n", "prev", "gap", "hash"}, takes the place of events the sink's queue caps dropped
before they were written (see `watcher.model.gaps`): it is chained like any record, and `audit
verify` reports it (GAPS, not OK). Changing any byte of a record breaks its own hash; deleting one
breaks the count and the chain. Anyone can recompute SHA-256, so an unkeyed chain only shows edits
that were not re-chained; a keyed one cannot be re-chained without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from watcher.model.gaps import Gap

__all__ = [
    "GENESIS",
    "KEYED",
    "UNKEYED",
    "EVENT_FIELDS",
    "GAP_FIELDS",
    "canonical_json",
    "hmac_digest",
    "chain_hash",
    "record_hash",
    "make_record",
    "make_gap_record",
    "last_record",
]

UNKEYED = "sha256:"
KEYED = "hmac-sha256:"
GENESIS = UNKEYED + "0" * 64
EVENT_FIELDS = {"n", "prev", "event", "hash"}
GAP_FIELDS = {"n", "prev", "gap", "hash"}


def canonical_json(obj: Any) -> bytes:
    """The one encoding every hash and MAC of the log is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def hmac_digest(key: bytes, data: bytes) -> str:
    return KEYED + hmac.new(key, data, hashlib.sha256).hexdigest()


def chain_hash(body: dict[str, Any], key: bytes | None) -> str:
    """The hash of a record's body (the record without its `hash`), keyed or not."""
    data = canonical_json(body)
    return hmac_digest(key, data) if key is not None else UNKEYED + hashlib.sha256(data).hexdigest()


def record_hash(n: int, prev: str, event: Any, key: bytes | None = None) -> str:
    """The record's hash: SHA-256 without a key, HMAC-SHA256 with one."""
    return chain_hash({"n": n, "prev": prev, "event": event}, key)


def _make(field: str, n: int, prev: str, value: Any, key: bytes | None) -> tuple[str, str]:
    # The payload is encoded once, not once for the hash and again for the line: both are the
    # canonical JSON of a dict whose keys sort as `field` ("event" or "gap") < "hash" < "n" <
    # "prev", so the two are spliced around the one encoding, byte for byte what encoding each
    # dict whole gives (tests/test_audit_integrity.py holds them equal).
    payload = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    tail = f',"n":{int(n)},"prev":{json.dumps(prev, ensure_ascii=False)}}}'
    head = f'{{"{field}":{payload}'
    data = (head + tail).encode()
    digest = hmac_digest(key, data) if key is not None else UNKEYED + hashlib.sha256(data).hexdigest()
    return f'{head},"hash":"{digest}"{tail}', digest


def make_record(n: int, prev: str, event: dict[str, Any], key: bytes | None = None) -> tuple[str, str]:
    """(the line without newline, its hash)."""
    return _make("event", n, prev, event, key)


def make_gap_record(n: int, prev: str, gap: Gap, key: bytes | None = None) -> tuple[str, str]:
    """A gap record (the line without newline, its hash): hashed like an event's record, over
    {"n", "prev", "gap"}."""
    return _make("gap", n, prev, gap.to_dict(), key)


def last_record(paths: Sequence[Path]) -> tuple[int, str, int] | None:
    """(n, hash, seq) of the newest record in the first of `paths` that has one (newest first):
    the event's seq, or the last seq a gap record covers."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                chunk = min(size, 1 << 20)
                f.seek(size - chunk)
                lines = [ln for ln in f.read().splitlines() if ln.strip()]
        except FileNotFoundError:
            continue
        for raw in reversed(lines):
            try:
                rec = json.loads(raw)
                seq = rec["gap"]["last"] if "gap" in rec else rec["event"]["seq"]
                return int(rec["n"]), str(rec["hash"]), int(seq)
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: the one before it counts
    return None
