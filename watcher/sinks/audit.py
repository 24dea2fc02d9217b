"""The tamper-evident audit log format, its head file, and verification.

One JSON record per line: {"n", "prev", "event", "hash"}. `n` counts records
from 1 and never restarts, across rotations and agent restarts; `prev` is the
`hash` of record n-1 (GENESIS for the first); `hash` is, over the record's
canonical JSON without the `hash` key, either its SHA-256 (`sha256:...`, an
unkeyed log) or its HMAC-SHA256 under the sink's key (`hmac-sha256:...`, a
keyed log). A gap record, {"n", "prev", "gap", "hash"}, takes the place of
events the sink's queue caps dropped before they were written (see
`watcher.model.gaps`): it is chained like any record, and `audit verify`
reports it (GAPS, not OK). Changing any byte of a record breaks its own hash; deleting one
breaks the count and the chain. Anyone can recompute SHA-256, so an unkeyed
chain only shows edits that were not re-chained; a keyed one cannot be
re-chained without the key.

The head file (`.NAME.head` beside the log, hidden so `NAME*` globs and log
shippers never take it for a log file) holds the last record's n and hash,
MAC'd when keyed; the file sink replaces it after the records it names are on
disk. It is what shows a cut tail: the log's last record must be the one it
names (or come after it, when the agent stopped between the two writes). It
cannot show a tail cut by someone who also put back an older head file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watcher.model.gaps import Gap

__all__ = [
    "GENESIS",
    "KEYED",
    "UNKEYED",
    "Head",
    "HeadError",
    "head_path",
    "is_head_file",
    "make_record",
    "make_gap_record",
    "record_hash",
    "RecordedGap",
    "VerifyResult",
    "verify_files",
    "last_record",
]

UNKEYED = "sha256:"
KEYED = "hmac-sha256:"
GENESIS = UNKEYED + "0" * 64
# A head's MAC covers this label too, so no record's MAC can pass for a head's, or back.
_HEAD_LABEL = "pod-resources-watcher.audit-head/v1"
_ROTATED = re.compile(r"\.[0-9]+\Z")
_FIELDS = {"n", "prev", "event", "hash"}
_GAP_FIELDS = {"n", "prev", "gap", "hash"}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: bytes, data: bytes) -> str:
    return KEYED + hmac.new(key, data, hashlib.sha256).hexdigest()


def _hash(body: dict[str, Any], key: bytes | None) -> str:
    data = _canonical(body)
    return _mac(key, data) if key is not None else UNKEYED + hashlib.sha256(data).hexdigest()


def record_hash(n: int, prev: str, event: Any, key: bytes | None = None) -> str:
    """The record's hash: SHA-256 without a key, HMAC-SHA256 with one."""
    return _hash({"n": n, "prev": prev, "event": event}, key)


def _make(body: dict[str, Any], key: bytes | None) -> tuple[str, str]:
    digest = _hash(body, key)
    return _canonical({**body, "hash": digest}).decode(), digest


def make_record(n: int, prev: str, event: dict[str, Any], key: bytes | None = None) -> tuple[str, str]:
    """(the line without newline, its hash)."""
    return _make({"n": n, "prev": prev, "event": event}, key)


def make_gap_record(n: int, prev: str, gap: Gap, key: bytes | None = None) -> tuple[str, str]:
    """A gap record (the line without newline, its hash): hashed like an event's record, over
    {"n", "prev", "gap"}."""
    return _make({"n": n, "prev": prev, "gap": gap.to_dict()}, key)


def head_path(log: Path) -> Path:
    """Where the head file of the log `log` lives."""
    return log.with_name(f".{log.name}.head")


class HeadError(ValueError):
    """A head file that is not one."""


@dataclass(frozen=True)
class Head:
    """The last record the log held on disk when the file sink last saved it: n and hash, and
    with a key, a MAC over both (so it cannot be rewritten to match a cut log without the key)."""

    n: int
    hash: str
    mac: str | None = None

    @classmethod
    def keyed(cls, n: int, digest: str, key: bytes | None) -> Head:
        return cls(n, digest, None if key is None else _head_mac(key, n, digest))

    def mac_ok(self, key: bytes) -> bool:
        return self.mac is not None and hmac.compare_digest(self.mac, _head_mac(key, self.n, self.hash))

    def to_line(self) -> str:
        fields: dict[str, Any] = {"n": self.n, "hash": self.hash}
        if self.mac is not None:
            fields["mac"] = self.mac
        return _canonical(fields).decode() + "\n"

    @classmethod
    def parse(cls, text: bytes) -> Head:
        try:
            fields = json.loads(text)
            n, digest, mac = fields["n"], fields["hash"], fields.get("mac")
            valid = (
                set(fields) <= {"n", "hash", "mac"}
                and isinstance(n, int)
                and n >= 1
                and isinstance(digest, str)
                and isinstance(mac, str | None)
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            valid = False
        if not valid:
            raise HeadError("not a head file (expected {n, hash[, mac]})")
        return cls(n, digest, mac)

    @classmethod
    def read(cls, path: Path) -> Head | None:
        """The head saved at `path`; None when there is none; HeadError when it is not one."""
        try:
            return cls.parse(path.read_bytes())
        except FileNotFoundError:
            return None


def _head_mac(key: bytes, n: int, digest: str) -> str:
    return _mac(key, _canonical({"head": _HEAD_LABEL, "n": n, "hash": digest}))


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


@dataclass(frozen=True)
class RecordedGap:
    """A gap record found in the log: record `n`, at `where` (FILE:LINE), says `gap`."""

    n: int
    where: str
    gap: Gap

    def describe(self) -> str:
        return f"record {self.n} at {self.where}: {self.gap.describe()}"


@dataclass(frozen=True)
class VerifyResult:
    """`ok`: intact. Otherwise `problem` says what is wrong, or, with `unverified`, what could
    not be checked (keyed records without the key). `notes` say what was and was not checked.
    `gaps`: the gap records found (events dropped before they were written), intact or not;
    `complete` is intact with none."""

    ok: bool
    records: int
    first: int | None
    last: int | None
    problem: str | None = None
    notes: tuple[str, ...] = ()
    unverified: bool = False
    gaps: tuple[RecordedGap, ...] = ()

    @property
    def complete(self) -> bool:
        return self.ok and not self.gaps


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


def _span(low: int, high: int) -> str:
    return f"record {low}" if low == high else f"records {low}..{high}"


def is_head_file(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".head")


def _head_of(logs: Sequence[Path]) -> Path | str | None:
    """The head file of the current log among `logs`; None when only rotated files were given
    (nothing says where the log ended then); a string when they belong to several logs."""
    current = [p for p in logs if not _ROTATED.search(p.name)]
    if not current:
        return None
    if len({p.resolve() for p in current}) > 1:
        return f"files of several logs given ({', '.join(map(str, current))}): verify one log at a time"
    return head_path(current[0])


class _BrokenError(Exception):
    pass


@dataclass
class _Scan:
    """What one pass over the records found."""

    count: int = 0
    first: int | None = None
    last: int | None = None
    last_hash: str | None = None
    first_keyed: int | None = None
    last_keyed: int | None = None
    gaps: list[RecordedGap] = field(default_factory=list)


def _body(rec: Any) -> tuple[str, Any]:
    """("event" or "gap", what it holds) of a record of either shape; ValueError otherwise."""
    fields = set(rec) if isinstance(rec, dict) else set()
    if fields == _FIELDS:
        return "event", rec["event"]
    if fields == _GAP_FIELDS:
        Gap.from_dict(rec["gap"])
        return "gap", rec["gap"]
    raise ValueError("unexpected shape")


def _scan(
    ordered: Sequence[Path], keys: Sequence[bytes], wanted: set[int], seen: dict[int, str], scan: _Scan
) -> None:
    """Check every record and the links between them; raise _BrokenError at the first bad one."""
    expected_n: int | None = None
    for path in ordered:
        for line in _lines(path):
            where = f"{line.path}:{line.lineno}"
            want = "the first record" if expected_n is None else f"record {expected_n}"
            try:
                rec = json.loads(line.raw)
                kind, body = _body(rec)
                n, prev, digest = rec["n"], rec["prev"], rec["hash"]
                if not isinstance(n, int) or not isinstance(digest, str):
                    raise ValueError("unexpected shape")
            except (ValueError, KeyError, TypeError):
                raise _BrokenError(f"{want} is broken at {where}: not a valid record") from None
            unhashed = {"n": n, "prev": prev, kind: body}
            if digest.startswith(KEYED):
                if keys and not any(hmac.compare_digest(_hash(unhashed, k), digest) for k in keys):
                    raise _BrokenError(
                        f"record {n} at {where} does not match its MAC under the key: altered, "
                        "re-chained without the key, or written with another key"
                    )
                if scan.first_keyed is None:
                    scan.first_keyed = n
                scan.last_keyed = n
            elif digest.startswith(UNKEYED):
                if _hash(unhashed, None) != digest:
                    raise _BrokenError(f"record {n} at {where} was altered (its hash does not match)")
                if keys and scan.first_keyed is not None:
                    raise _BrokenError(
                        f"record {n} at {where} is not keyed, but record {scan.first_keyed} before it "
                        "is: the log was downgraded (rewritten without the key)"
                    )
            else:
                raise _BrokenError(f"record {n} at {where} has a hash of no known kind")
            if expected_n is None:
                scan.first = n
                if n == 1 and prev != GENESIS:
                    raise _BrokenError(f"record 1 at {where} does not start the chain")
            elif n != expected_n:
                if n < expected_n:
                    raise _BrokenError(f"record {n} at {where} is out of order (expected {expected_n})")
                raise _BrokenError(f"{_span(expected_n, n - 1)} missing before {where}")
            elif prev != scan.last_hash:
                raise _BrokenError(f"record {n} at {where} does not chain to record {n - 1}")
            if n in wanted:
                seen[n] = digest
            if kind == "gap":
                scan.gaps.append(RecordedGap(n, where, Gap.from_dict(body)))
            scan.count += 1
            scan.last, scan.last_hash = n, digest
            expected_n = n + 1


def _check_head(
    path: Path, keys: Sequence[bytes], scan: _Scan, seen: dict[int, str], head: Head | None
) -> list[str]:
    """Compare the head file with the log's end; notes, or _BrokenError."""
    if head is None:
        if keys:
            raise _BrokenError(
                f"no head file {path}: the file sink keeps one beside a keyed log, so a cut tail "
                "cannot be ruled out"
            )
        return [
            f"no head file {path}: a cut tail would not be noticed (logs from before head files have none)"
        ]
    notes = []
    if keys:
        if head.mac is None:
            raise _BrokenError(f"the head file {path} is not keyed: it was rewritten without the key")
        if not any(head.mac_ok(k) for k in keys):
            raise _BrokenError(
                f"the head file {path} does not match its MAC under the key: forged, or written "
                "with another key"
            )
    elif head.mac is not None:
        notes.append("the head file's MAC was not checked (no --key-file)")
    last = scan.last
    if last is None or head.n > last:
        ends = "holds no records" if last is None else f"ends at record {last}"
        cut = _span((last or 0) + 1, head.n)
        raise _BrokenError(
            f"the log {ends}, but its head file {path} says record {head.n} was written: "
            f"{cut} {'was' if cut.startswith('record ') else 'were'} cut off"
        )
    assert scan.first is not None
    if head.n < scan.first:
        raise _BrokenError(
            f"the head file {path} names record {head.n}, before the first record given ({scan.first}): "
            "it is older than the log (replaced by an old copy?)"
        )
    if seen.get(head.n) != head.hash:
        raise _BrokenError(
            f"record {head.n} does not match the head file {path}: the log was rewritten after "
            "the head was saved"
        )
    if head.n < last:
        notes.append(
            f"the head file {path} names record {head.n}: {_span(head.n + 1, last)} came after it was saved "
            "(the agent stopped between writing them and the head), so a cut among them would not be seen"
        )
    else:
        notes.append(f"the head file {path} matches the last record, {last}")
    return notes


def verify_files(
    paths: Sequence[Path],
    *,
    keys: Sequence[bytes] = (),
    head: Path | None = None,
    expect: Sequence[tuple[int, str]] = (),
) -> VerifyResult:
    """Check a log (its rotated files in any order) and name the first broken or missing record.

    With `keys` (the file sink's key; several while a key is being replaced), every keyed record's
    MAC is checked and a log without keyed records, or whose keyed records give way to unkeyed
    ones, fails. The head file (`head`, or the current log's own when the current file is among
    `paths`) must name the log's last record. `expect` holds (n, hash) pairs reported earlier
    (X-Audit-Head): the log must still hold each of those records with that hash.
    """
    logs = [p for p in paths if not is_head_file(p)]
    heads = [p for p in paths if is_head_file(p)]
    head_file: Path | str | None = head or (heads[0] if heads else _head_of(logs))
    if isinstance(head_file, str):
        return VerifyResult(False, 0, None, None, head_file)
    saved: Head | None = None
    if head_file is not None:
        try:
            saved = Head.read(head_file)
        except HeadError as err:
            return VerifyResult(False, 0, None, None, f"the head file {head_file} is broken: {err}")
    wanted = {n for n, _ in expect} | ({saved.n} if saved is not None else set())
    seen: dict[int, str] = {}
    scan = _Scan()
    notes: list[str] = []
    try:
        _scan(sorted(logs, key=_first_n), keys, wanted, seen, scan)
        if keys and scan.count and scan.first_keyed is None:
            raise _BrokenError(
                f"none of the {scan.count} records is keyed: the log was written without the key, "
                "or rewritten without it"
            )
        if head_file is None:
            notes.append("the head was not checked: give the current log file too (not only rotated ones)")
        else:
            notes += _check_head(head_file, keys, scan, seen, saved)
        for n, digest in expect:
            if n not in seen:
                span = "none" if scan.first is None else f"{scan.first}..{scan.last}"
                raise _BrokenError(f"record {n} (--expect) is not in the files given (records {span})")
            if not hmac.compare_digest(seen[n], digest):
                raise _BrokenError(
                    f"record {n} has hash {seen[n]}, not {digest} as reported earlier (--expect): "
                    "the log was rewritten"
                )
            notes.append(f"record {n} has the hash reported earlier")
    except _BrokenError as err:
        gaps = tuple(scan.gaps)
        return VerifyResult(False, scan.count, scan.first, scan.last, str(err), tuple(notes), gaps=gaps)
    if scan.first_keyed is not None and not keys:
        assert scan.last_keyed is not None
        verb = "is" if scan.first_keyed == scan.last_keyed else "are"
        problem = (
            f"{_span(scan.first_keyed, scan.last_keyed)} {verb} keyed (hmac-sha256): only --key-file "
            "can check them; the numbering and links are intact"
        )
        return VerifyResult(
            False,
            scan.count,
            scan.first,
            scan.last,
            problem,
            tuple(notes),
            unverified=True,
            gaps=tuple(scan.gaps),
        )
    if keys and scan.first_keyed is not None:
        assert scan.first is not None
        if scan.first_keyed > scan.first:
            notes.insert(
                0,
                f"{_span(scan.first, scan.first_keyed - 1)} came before the key was set (unkeyed); "
                f"keyed record {scan.first_keyed} chains to them, so they are covered too",
            )
        else:
            notes.insert(0, "every record's MAC matches the key")
    return VerifyResult(True, scan.count, scan.first, scan.last, None, tuple(notes), gaps=tuple(scan.gaps))
