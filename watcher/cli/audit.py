"""`audit verify`: check a tamper-evident audit log written by a `file` sink."""

from __future__ import annotations

import argparse
from pathlib import Path

from watcher.cli.common import PIPE, Subparsers, exit_codes, fail
from watcher.secrets import Secret, SecretError
from watcher.sinks.audit import verify_files

__all__ = ["add_parser"]

AUDIT_DESCRIPTION = """\
`audit verify FILE...` checks an audit log written by a `file` sink (pass the current file and
its rotated ones, in any order), names the first altered, missing or misplaced record, and
compares the log's end with the head file the sink keeps beside it (.NAME.head).

What it detects, and what it cannot:
  any log     a changed byte in a record that was not re-chained; a deleted record in the
              middle (the gap names the missing numbers); records out of order.
  unkeyed     SHA-256 is public: whoever can write the log can edit a record, recompute every
              later hash and the head file, and it passes.
  --key-file  each hash is an HMAC under the sink's key: re-chaining without the key fails, and
              so do keyed records followed by unkeyed ones (a downgrade). Without --key-file a
              keyed log is reported NOT VERIFIED.
  head file   a cut tail (the last records deleted), unless an older head file (a copy of an
              earlier one, or, unkeyed, one rewritten by hand) was put back as well. A missing
              head file fails with --key-file; without a key it is only noted.
  --expect    any rewrite of the records up to one whose head a receiver was sent
              (X-Audit-Head), key or no key.
  never       the oldest records gone with rotated-out files (the count starts later).

Gaps: when the sink's queue caps (max_queue, max_age) dropped events before they were
written, the sink wrote a gap record in their place (chained like any record) naming the
seq range and how many. An intact log with gap records is reported GAPS, each one named.
"""
AUDIT_EXIT_CODES = exit_codes(
    (0, "intact and complete"),
    (1, "broken, a file missing, or keyed records that could not be checked (no --key-file)"),
    (2, "bad command line, or an unreadable key file"),
    (3, "intact, but with gaps: events dropped by the sink's queue caps before they were written"),
    PIPE,
)


def _expectation(text: str) -> tuple[int, str]:
    """--expect: `N:HASH`, or an X-Audit-Head value `NAME;n=N;hash=HASH`."""
    fields = dict(part.strip().partition("=")[::2] for part in text.split(";")[1:])
    number, digest = (fields.get("n", ""), fields.get("hash", "")) if fields else text.partition(":")[::2]
    if not number.isascii() or not number.isdigit() or int(number) < 1 or ":" not in digest:
        raise argparse.ArgumentTypeError(f"{text!r} is not N:HASH (e.g. 41:sha256:...) or NAME;n=N;hash=HASH")
    return int(number), digest.strip()


def _audit(args: argparse.Namespace) -> int:
    missing = [f for f in [*args.files, *([args.head] if args.head else [])] if not f.exists()]
    if missing:
        return fail(f"no such file: {missing[0]}")
    keys = []
    for path in args.key_file:
        try:
            keys.append(Secret(file=path).get().encode())
        except SecretError as err:
            return fail(str(err), 2)
    result = verify_files(args.files, keys=keys, head=args.head, expect=args.expect)
    span = f"records {result.first}..{result.last}" if result.records else "no records"
    if result.complete:
        print(f"OK: {result.records} records intact ({span})")
    elif result.ok:
        dropped = sum(g.gap.count for g in result.gaps)
        print(
            f"GAPS: {result.records} records intact ({span}), but {len(result.gaps)} gap record(s): "
            f"{dropped} event(s) were dropped by the sink's queue caps before they were written"
        )
    else:
        print(f"{'NOT VERIFIED' if result.unverified else 'BROKEN'}: {result.problem}")
    for gap in result.gaps:
        print(f"  gap: {gap.describe()}")
    for note in result.notes:
        print(f"  {note}")
    return 0 if result.complete else 3 if result.ok else 1


def add_parser(subparsers: Subparsers) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="verify a tamper-evident audit log",
        description=AUDIT_DESCRIPTION,
        epilog=AUDIT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("action", choices=("verify",))
    audit.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="the current log file and its rotated ones (FILE.1 ...), in any order",
    )
    audit.add_argument(
        "--key-file",
        type=Path,
        action="append",
        default=[],
        metavar="K",
        help="the file sink's key: check every record's MAC and the head's (repeat while replacing a key)",
    )
    audit.add_argument(
        "--head",
        type=Path,
        metavar="FILE",
        help="the head file to check the log's end against (default: .NAME.head beside the current log)",
    )
    audit.add_argument(
        "--expect",
        type=_expectation,
        action="append",
        default=[],
        metavar="N:HASH",
        help="a head reported earlier, as N:HASH or an X-Audit-Head value: the log must still hold "
        "record N with that hash (repeatable)",
    )
    audit.set_defaults(handler=_audit)
