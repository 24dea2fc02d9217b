"""Events appended to a JSONL file, fsynced per batch: the seed of the audit log."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from watcher.events import Event

__all__ = ["FileSink"]


class FileSink:
    def __init__(self, path: Path, *, name: str = "file", fsync: bool = True) -> None:
        self.name = name
        self.path = path
        self.fsync = fsync

    def _append(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: each write lands at the end even if someone else appends too.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    async def send(self, events: Sequence[Event]) -> None:
        if not events:
            return
        data = "".join(e.to_json() + "\n" for e in events).encode()
        # Disk latency (fsync) must not stall the event loop.
        await asyncio.to_thread(self._append, data)

    async def close(self) -> None:
        return None
