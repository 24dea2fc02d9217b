"""The tamper-evident audit log the file sink writes: its record and head file formats, and the
check `audit verify` makes.

`chain` holds the records and how each is hashed and chained to the one before it, `head` the
head file that shows a cut tail, `verify` the check of a log and its head (`verify_files`).
"""

from watcher.sinks.audit.chain import (
    GENESIS,
    KEYED,
    UNKEYED,
    last_record,
    make_gap_record,
    make_record,
    record_hash,
)
from watcher.sinks.audit.head import Head, HeadError, head_path, is_head_file
from watcher.sinks.audit.verify import RecordedGap, VerifyResult, verify_files

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
