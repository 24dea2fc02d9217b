"""Watching directories with inotify (watchfiles), and telling one socket file from the next.

The kubelet replaces its socket on every start (unlink, listen on a temporary
name, rename into place), so the DIRECTORY is watched, never the socket file.
Directory events are only a prompt: a delete and a create may arrive in one
batch, in any order, or not at all (a missed event, a polling gap), so what
decides "a new socket" is the file's identity before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import watchfiles
from watchfiles._rust_notify import WatchfilesRustInternalError

__all__ = ["FileIdentity", "SocketState", "probe_socket", "DirectoryWatch"]

log = structlog.get_logger("watcher.watching")


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Device, inode AND change time: ext4 hands a freed inode number straight to the next file."""

    dev: int
    ino: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns)

    def to_json(self) -> list[int]:
        return [self.dev, self.ino, self.ctime_ns]

    @classmethod
    def from_json(cls, data: Any) -> FileIdentity | None:
        if isinstance(data, list) and len(data) == 3 and all(isinstance(x, int) for x in data):
            return cls(data[0], data[1], data[2])
        return None


@dataclass(frozen=True, slots=True)
class SocketState:
    """What is at the socket path now: nothing, a socket (with its identity), or something else."""

    identity: FileIdentity | None
    is_socket: bool

    @property
    def present(self) -> bool:
        return self.identity is not None and self.is_socket


def probe_socket(path: Path) -> SocketState:
    try:
        st = os.stat(path)
    except OSError:
        return SocketState(None, False)
    return SocketState(FileIdentity.of(st), stat.S_ISSOCK(st.st_mode))


class DirectoryWatch:
    """Yield batches of names that changed directly inside `directory`, and empty ticks.

    - If the directory does not exist yet, watch its nearest existing parent
      until it does (saying so once), then yield every matching name in it.
    - If inotify cannot be had (instance or watch limits), fall back to polling
      with a warning and keep going.
    - A batch arrives at most `debounce_ms` after its first change, and
      `step_ms` after the last one: watchfiles' defaults (1.6 s) are for editors.
    """

    def __init__(
        self,
        directory: Path,
        match: Callable[[str], bool],
        *,
        stop: asyncio.Event,
        debounce_ms: int = 50,
        step_ms: int = 10,
        force_polling: bool = False,
        poll_delay_ms: int = 100,
        # Bounds how long the watch thread takes to notice `stop`, and how long a
        # vanished directory goes unnoticed when no event reports it.
        rust_timeout_ms: int = 1000,
        name: str = "directory",
    ) -> None:
        self.directory = directory
        self.match = match
        self.stop = stop
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.polling = force_polling
        self.poll_delay_ms = poll_delay_ms
        self.rust_timeout_ms = rust_timeout_ms
        self.log = log.bind(watch=name, directory=str(directory))
        self._said_waiting = False

    def _awatch(self, path: Path) -> AsyncGenerator[set[tuple[watchfiles.Change, str]], None]:
        return watchfiles.awatch(
            path,
            watch_filter=None,
            debounce=self.debounce_ms,
            step=self.step_ms,
            stop_event=self.stop,
            rust_timeout=self.rust_timeout_ms,
            yield_on_timeout=True,
            force_polling=self.polling,
            poll_delay_ms=self.poll_delay_ms,
            recursive=False,
            ignore_permission_denied=True,
        )

    def _nearest_existing_parent(self) -> Path:
        path = self.directory.parent
        while not path.is_dir() and path != path.parent:
            path = path.parent
        return path

    async def _watching(self, path: Path) -> AsyncGenerator[set[tuple[watchfiles.Change, str]], None]:
        """awatch with the fallback to polling when inotify is not to be had."""
        while not self.stop.is_set():
            try:
                async with contextlib.aclosing(self._awatch(path)) as changes_iter:
                    async for changes in changes_iter:
                        yield changes
                return
            except (WatchfilesRustInternalError, OSError) as err:
                if self.polling:
                    raise
                self.polling = True
                self.log.warning(
                    "inotify unavailable, falling back to polling",
                    error=str(err),
                    poll_ms=self.poll_delay_ms,
                    hint="raise fs.inotify.max_user_instances / max_user_watches on the node",
                )

    async def _wait_for_directory(self) -> None:
        while not self.stop.is_set() and not self.directory.is_dir():
            parent = self._nearest_existing_parent()
            if not self._said_waiting:
                self._said_waiting = True
                self.log.warning("directory does not exist yet, waiting for it", watching=str(parent))
            async for _ in self._watching(parent):
                # Any change may be a step on the way (a parent created): re-plan.
                if (
                    self.directory.is_dir()
                    or not parent.is_dir()
                    or self._nearest_existing_parent() != parent
                ):
                    break
        if self._said_waiting and self.directory.is_dir():
            self.log.info("directory appeared")
            self._said_waiting = False

    async def batches(self) -> AsyncIterator[set[str]]:
        while not self.stop.is_set():
            if not self.directory.is_dir():
                await self._wait_for_directory()
                if self.stop.is_set():
                    return
                present = {p.name for p in self.directory.iterdir() if self.match(p.name)}
                yield present
            async with contextlib.aclosing(self._watching(self.directory)) as batches:
                async for changes in batches:
                    names = {
                        Path(p).name
                        for _, p in changes
                        if Path(p).parent == self.directory and self.match(Path(p).name)
                    }
                    # An empty batch is a tick (at most every `rust_timeout_ms`): a
                    # chance for the caller to re-check what events may have missed,
                    # e.g. a change made before the watch was in place.
                    if names or not changes:
                        yield names
                    if not self.directory.is_dir():
                        self.log.warning("directory vanished, waiting for it to come back")
                        break
