"""The names that appear in and leave a directory while a test acts, from inotify.

A temporary name a kubelet listens or writes on lives for microseconds before its rename, too
short for a poll to see; an inotify watch queues every such event from the moment it is added,
so nothing here races the process under test. Linux only, through the C library.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["NameEvents"]

_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_KINDS = {
    _IN_CREATE: "created",
    _IN_DELETE: "deleted",
    _IN_MOVED_FROM: "moved-from",
    _IN_MOVED_TO: "moved-to",
}
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


class NameEvents:
    """A watch on `directory` (a context manager); `events()` is what happened since it began:
    (kind, name) in order, kind one of created, deleted, moved-from, moved-to."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd = -1
        self._seen: list[tuple[str, str]] = []

    def __enter__(self) -> NameEvents:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
        if libc.inotify_add_watch(fd, os.fsencode(self.directory), mask) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {self.directory}")
        self._fd = fd
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def events(self) -> list[tuple[str, str]]:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return list(self._seen)
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset : offset + length].rstrip(b"\0").decode()
                offset += length
                kind = next((k for bit, k in _KINDS.items() if mask & bit), None)
                if kind is not None:
                    self._seen.append((kind, name))

    async def until(
        self, predicate: Callable[[list[tuple[str, str]]], bool], timeout: float = 10.0
    ) -> list[tuple[str, str]]:
        """The events once `predicate` holds for them, woken by the inotify descriptor itself
        (a process may finish what it writes after the call that made it write has returned)."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        loop.add_reader(self._fd, readable.set)
        try:
            async with asyncio.timeout(timeout):
                while not predicate(seen := self.events()):
                    readable.clear()
                    if predicate(seen := self.events()):
                        break
                    await readable.wait()
        except TimeoutError:
            raise AssertionError(f"not seen in {self.directory} within {timeout:g} s: {self._seen}") from None
        finally:
            loop.remove_reader(self._fd)
        return seen

    def names(self) -> set[str]:
        """Every name that came or went."""
        return {name for _kind, name in self.events()}
