"""`audit verify`'s check: a log's records, the links between them and its head file, with the
first broken or missing record named (`watcher.cli.audit` prints what it finds)."""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watcher.model.gaps import Gap
from watcher.sinks.audit.chain import EVENT_FIELDS, GAP_FIELDS, GENESIS, KEYED, UNKEYED, chain_hash
from watcher.sinks.audit.head import Head, HeadError, head_path, is_head_file

__all__ = ["RecordedGap", "VerifyResult", "verify_files"]

_ROTATED = re.compile(r"\.[0-9]+\Z")


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
    if fields == EVENT_FIELDS:
        return "event", rec["event"]
    if fields == GAP_FIELDS:
        Gap.from_dict(rec["gap"])
        return "gap", rec["gap"]
    raise ValueError("unexpected shape")


def _record(line: _Line, want: str) -> tuple[str, Any, int, Any, str]:
    """(kind, body, n, prev, hash) of a record; _BrokenError if it is none."""
    try:
        rec = json.loads(line.raw)
        kind, body = _body(rec)
        n, prev, digest = rec["n"], rec["prev"], rec["hash"]
        if not isinstance(n, int) or not isinstance(digest, str):
            raise ValueError("unexpected shape")
    except (ValueError, KeyError, TypeError):
        raise _BrokenError(f"{want} is broken at {line.path}:{line.lineno}: not a valid record") from None
    return kind, body, n, prev, digest


def _check_hash(
    n: int, where: str, digest: str, unhashed: dict[str, Any], keys: Sequence[bytes], scan: _Scan
) -> None:
    """The record's hash or MAC matches it, and no unkeyed record follows a keyed one."""
    if digest.startswith(KEYED):
        if keys and not any(hmac.compare_digest(chain_hash(unhashed, k), digest) for k in keys):
            raise _BrokenError(
                f"record {n} at {where} does not match its MAC under the key: altered, "
                "re-chained without the key, or written with another key"
            )
        if scan.first_keyed is None:
            scan.first_keyed = n
        scan.last_keyed = n
    elif digest.startswith(UNKEYED):
        if chain_hash(unhashed, None) != digest:
            raise _BrokenError(f"record {n} at {where} was altered (its hash does not match)")
        if keys and scan.first_keyed is not None:
            raise _BrokenError(
                f"record {n} at {where} is not keyed, but record {scan.first_keyed} before it "
                "is: the log was downgraded (rewritten without the key)"
            )
    else:
        raise _BrokenError(f"record {n} at {where} has a hash of no known kind")


def _check_link(n: int, prev: Any, where: str, expected_n: int | None, scan: _Scan) -> None:
    """The record is the one expected after the last, and chains to it."""
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


def _scan(
    ordered: Sequence[Path], keys: Sequence[bytes], wanted: set[int], seen: dict[int, str], scan: _Scan
) -> None:
    """Check every record and the links between them; raise _BrokenError at the first bad one."""
    expected_n: int | None = None
    for path in ordered:
        for line in _lines(path):
            where = f"{line.path}:{line.lineno}"
            kind, body, n, prev, digest = _record(
                line, "the first record" if expected_n is None else f"record {expected_n}"
            )
            _check_hash(n, where, digest, {"n": n, "prev": prev, kind: body}, keys, scan)
            _check_link(n, prev, where, expected_n, scan)
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
        _check_expected(expect, scan, seen, notes)
    except _BrokenError as err:
        gaps = tuple(scan.gaps)
        return VerifyResult(False, scan.count, scan.first, scan.last, str(err), tuple(notes), gaps=gaps)
    return _intact(scan, keys, notes)


def _check_expected(
    expect: Sequence[tuple[int, str]], scan: _Scan, seen: dict[int, str], notes: list[str]
) -> None:
    """The records reported earlier (`--expect`) are there with the same hash: a note for each in
    `notes` (those before a broken one are kept), or _BrokenError."""
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


def _intact(scan: _Scan, keys: Sequence[bytes], notes: list[str]) -> VerifyResult:
    """The result for a log found intact: unverified if it has keyed records and no key was given."""
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
