"""The tamper-evident audit log format, and its verification.

One JSON record per line: {"n", "prev", "event", "hash"}. `n` counts records
from 1 and never restarts, across rotations and agent restarts; `prev` is the
`hash` of record n-1 (GENESIS for the first); `hash` is the SHA-256 of the
record's canonical JSON without the `hash` key. Changing any byte of a record
breaks its own hash; deleting one breaks the count and the chain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENESIS", "make_record", "record_hash", "VerifyResult", "verify_files", "last_record"]

GENESIS = "sha256:" + "0" * 64


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(n: int, prev: str, event: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical({"n": n, "prev": prev, "event": event})).hexdigest()


def make_record(n: int, prev: str, event: dict[str, Any]) -> tuple[str, str]:
    """(the line without newline, its hash)."""
    digest = record_hash(n, prev, event)
    line = _canonical({"n": n, "prev": prev, "event": event, "hash": digest}).decode()
    return line, digest


def last_record(paths: Sequence[Path]) -> tuple[int, str, int] | None:
    """(n, hash, event seq) of the newest record in the first of `paths` that has one (newest first)."""
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
                return int(rec["n"]), str(rec["hash"]), int(rec["event"]["seq"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: the one before it counts
    return None


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    first: int | None
    last: int | None
    problem: str | None = None


@dataclass(frozen=True)
class _Line:
    path: Path
    lineno: int
    raw: bytes


def _lines(path: Path) -> Iterator[_Line]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                yield _Line(path, lineno, raw.rstrip(b"\n"))


def _first_n(path: Path) -> int:
    for line in _lines(path):
        try:
            return int(json.loads(line.raw)["n"])
        except (ValueError, KeyError, TypeError):
            return 1 << 62
    return 1 << 62


def verify_files(paths: Sequence[Path]) -> VerifyResult:
    """Check a log (its rotated files in any order) and name the first broken or missing record."""
    ordered = sorted(paths, key=_first_n)
    expected_n: int | None = None
    prev_hash: str | None = None
    count = 0
    first: int | None = None
    for path in ordered:
        for line in _lines(path):
            where = f"{line.path}:{line.lineno}"
            want = "the first record" if expected_n is None else f"record {expected_n}"
            try:
                rec = json.loads(line.raw)
                n, prev, event, digest = rec["n"], rec["prev"], rec["event"], rec["hash"]
                if not isinstance(n, int) or set(rec) != {"n", "prev", "event", "hash"}:
                    raise ValueError("unexpected shape")
            except (ValueError, KeyError, TypeError):
                return VerifyResult(
                    False, count, first, expected_n, f"{want} is broken at {where}: not a valid record"
                )
            if record_hash(n, prev, event) != digest:
                return VerifyResult(
                    False, count, first, n, f"record {n} at {where} was altered (its hash does not match)"
                )
            if expected_n is None:
                first = n
                if n == 1 and prev != GENESIS:
                    return VerifyResult(
                        False, count, first, n, f"record 1 at {where} does not start the chain"
                    )
            elif n != expected_n:
                missing = f"record {expected_n}" if n == expected_n + 1 else f"records {expected_n}..{n - 1}"
                if n < expected_n:
                    return VerifyResult(
                        False,
                        count,
                        first,
                        n,
                        f"record {n} at {where} is out of order (expected {expected_n})",
                    )
                return VerifyResult(False, count, first, n, f"{missing} missing before {where}")
            elif prev != prev_hash:
                return VerifyResult(
                    False, count, first, n, f"record {n} at {where} does not chain to record {n - 1}"
                )
            count += 1
            expected_n = n + 1
            prev_hash = digest
    last = None if expected_n is None else expected_n - 1
    return VerifyResult(True, count, first, last)
