"""The audit log on disk: records appended in batches, rotated by size, and the head file.

The writer is synchronous: the file sink runs it on a worker thread, one call at a time. It holds
where the chain ends (read back from the files whenever it opens them, never trusted from memory),
the open descriptor, and what the head file says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from watcher.files import check_private, open_private, private_dir
from watcher.model.events import Event
from watcher.model.gaps import Gap
from watcher.sinks.audit import (
    GENESIS,
    Head,
    HeadError,
    head_path,
    last_record,
    make_gap_record,
    make_record,
)
from watcher.sinks.file.settings import FileSinkSettings

__all__ = ["AuditLogWriter"]

log = structlog.get_logger("watcher.sinks.file")


class AuditLogWriter:
    """One audit log: its current file, the rotated ones beside it, and its head file."""

    def __init__(self, settings: FileSinkSettings, path: Path) -> None:
        self.settings = settings
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._synced = 0  # bytes of the current file covered by a successful fsync
        self._n = 0
        self._prev = GENESIS
        self._last_seq = 0
        self._dirty = False
        self.head_file = head_path(path)
        self._saved: tuple[int, str] | None = None  # what the head file says: (n, hash)
        self._key: bytes | None = None  # the key of the last batch: the head is MAC'd with it

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def rotated(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def _open_log(self) -> int:
        # O_APPEND: every write lands at the end, whatever else holds the file. Readable too: a
        # torn tail is cut through this checked descriptor, never by opening the path again.
        return open_private(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, "audit log")

    def open(self) -> None:
        """Open the log unless it is open: cut a torn tail, and read where the chain ends from
        the files and the head file."""
        if self._fd is not None:
            return
        # A missing directory is made private; an existing one is the operator's (it may be
        # /var/log): the files in it are private anyway.
        private_dir(self.path.parent, "audit log's directory", tighten=False)
        fd = self._open_log()
        try:
            self._cut_torn_tail(fd)
            rotated = [self.rotated(i) for i in range(1, self.settings.keep + 1)]
            for path in rotated:
                check_private(path, "rotated audit log")  # kept from before: 0600 too, no links
            last = last_record([self.path, *rotated])
        except BaseException:
            os.close(fd)
            raise
        # From the files, never from memory: they may have been cut back since.
        self._n, self._prev, self._last_seq = last if last is not None else (0, GENESIS, 0)
        head = self._read_head()
        self._saved = None if head is None else (head.n, head.hash)
        if head is not None and head.n >= self._n and (head.n, head.hash) != (self._n, self._prev):
            # The head is only ever saved after the records it names were on disk, so a log that
            # ends before it, or elsewhere, was cut or rewritten. Numbering on from the head keeps
            # that visible to `audit verify` (a gap, or a broken link) after the head is replaced.
            log.error(
                "audit log does not end where its head file says: records were cut off or rewritten; "
                "numbering continues after the head so `audit verify` still shows it",
                path=str(self.path),
                log_ends_at=self._n,
                head_says=head.n,
            )
            self._n, self._prev = head.n, head.hash
        self._fd = fd
        self._size = self._synced = os.fstat(fd).st_size

    def _read_head(self) -> Head | None:
        try:
            head = Head.read(self.head_file)
        except (HeadError, OSError) as err:
            log.error("audit head file is unreadable; ignored", path=str(self.head_file), error=str(err))
            return None
        key = self._key_now()
        if head is not None and key is not None and head.mac is not None and not head.mac_ok(key):
            log.error(
                "audit head file does not match its MAC under the key: forged, or written with another key",
                path=str(self.head_file),
            )
        return head

    def _key_now(self) -> bytes | None:
        """The key as its secret says now (a replaced key file is used from the next batch)."""
        return None if self.settings.key is None else self.settings.key.get().encode()

    def _save_head(self) -> None:
        """Replace the head file with the last record, once the records are on disk.

        Never before: after a crash, a head naming records the disk lost would read as a cut
        log. The new head is fsynced before the rename, so a crash leaves the old head or the
        new one, never an empty file. The rename itself may be lost in a crash (the directory
        is not fsynced): the older head it leaves is one `audit verify` accepts, with the
        records after it named as not covered.
        """
        if self._dirty or self._n == 0 or self._saved == (self._n, self._prev):
            return
        head = Head.keyed(self._n, self._prev, self._key)
        tmp = self.head_file.with_name(self.head_file.name + ".tmp")
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "audit head file")
        try:
            _write_all(fd, head.to_line().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.head_file)
        self._saved = (self._n, self._prev)

    def _cut_torn_tail(self, fd: int) -> None:
        """Cut off a last line that has no newline: half a record, from a crash mid-write.

        It is never a valid record, and appending after it would spoil the next
        one too. The event it was writing was not acknowledged, so it is still
        queued and is written again, whole.
        """
        size = end = os.fstat(fd).st_size
        if size == 0:
            return
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            block = os.pread(fd, end - start, start)
            if end == size and block.endswith(b"\n"):
                return
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        os.ftruncate(fd, keep)
        os.fsync(fd)
        log.warning(
            "audit log ended in half a record (the agent stopped mid-write): cut it off; "
            "its event is written again",
            path=str(self.path),
            bytes_cut=size - keep,
        )

    def _rotate(self) -> None:
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        keep = self.settings.keep
        self.rotated(keep).unlink(missing_ok=True)
        for i in range(keep - 1, 0, -1):
            if self.rotated(i).exists():
                os.replace(self.rotated(i), self.rotated(i + 1))
        # Renames move the files themselves (0600), never what a link points to.
        os.replace(self.path, self.rotated(1))
        self._fd = self._open_log()
        self._size = self._synced = os.fstat(self._fd).st_size

    def _append(self, data: bytes) -> None:
        assert self._fd is not None
        try:
            _write_all(self._fd, data)
        except OSError:
            # A full disk can take part of a record. Never keep half of one: cut the file back
            # to where this write began; the batch is retried.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._dirty = True

    def write(self, records: Sequence[tuple[int, Event | Gap]]) -> None:
        """Append (seq, event or gap) records: one write per file (a rotation starts a new
        one), then one fsync and one head file for the batch. A record whose seq the log
        already covers (re-sent after a crash) is skipped."""
        # Before anything is written: a key that cannot be read must never give unkeyed records.
        self._key = self._key_now()
        self.open()
        assert self._fd is not None
        n, prev, last_seq = self._n, self._prev, self._last_seq
        pending = bytearray()
        for seq, item in records:
            if seq <= last_seq:
                continue  # already in the log: a re-send after a crash
            if isinstance(item, Gap):
                line, digest = make_gap_record(n + 1, prev, item, self._key)
            else:
                line, digest = make_record(n + 1, prev, item.to_dict(), self._key)
            data = (line + "\n").encode()
            size = self._size + len(pending)
            if size > 0 and size + len(data) > self.settings.max_bytes:
                if pending:
                    self._append(bytes(pending))
                    pending.clear()
                    self._n, self._prev, self._last_seq = n, prev, last_seq
                self._rotate()
            pending += data
            n, prev, last_seq = n + 1, digest, seq
        if pending:
            self._append(bytes(pending))
            self._n, self._prev, self._last_seq = n, prev, last_seq
        if self.settings.fsync == "event" and self._dirty:
            try:
                os.fsync(self._fd)
            except OSError:
                # After a failed fsync the kernel may have dropped what it could not write while
                # reads still show it. Cut back to what the last good fsync covered, so the retry
                # writes those records again instead of skipping them as present.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._synced)
                raise
            self._dirty = False
            self._synced = self._size
        self._save_head()

    def write_gap(self, gap: Gap) -> None:
        """Write a gap record for the part of `gap` the log does not cover yet, if any."""
        self._key = self._key_now()
        self.open()  # where the log ends is read from the files
        if gap.last <= self._last_seq:
            return
        if gap.first <= self._last_seq:
            # Only the seqs after the log's last are missing; at most that many were dropped.
            first = self._last_seq + 1
            gap = dataclasses.replace(gap, first=first, count=min(gap.count, gap.last - first + 1))
        self.write([(gap.last, gap)])

    def forget_fd(self) -> None:
        """Drop the descriptor, so the next write opens the file afresh."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def sync(self) -> None:
        """Fsync what was written since the last fsync, then save the head."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False
            self._synced = self._size
        self._save_head()

    def close(self) -> None:
        """Sync what is written, save the head, and close the file."""
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    # os.write may write less than asked (a disk that fills up mid-record).
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
