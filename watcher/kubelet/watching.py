"""Watching directories with inotify (watchfiles), with a polling fallback.

The kubelet replaces its socket on every start (unlink, listen on a temporary
name, rename into place), so the DIRECTORY is watched, never the socket file.
Directory events are only a prompt: a delete and a create may arrive in one
batch, in any order, or not at all, so callers decide with the file's identity
(watcher.kubelet.identity) and use the events as evidence.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import structlog
import watchfiles
from watchfiles._rust_notify import WatchfilesRustInternalError

from watcher.supervision import StopFlag, sleep_or_stop

__all__ = ["DirectoryWatch", "Batch", "StopFlag"]

log = structlog.get_logger("watcher.kubelet.watching")

# name -> what happened to it: "added", "deleted", "modified". Empty: a tick.
Batch = dict[str, set[str]]
_RawChanges = set[tuple[watchfiles.Change, str]]


class _DirectoryGoneError(Exception):
    pass


class DirectoryWatch:
    """Yield batches of what changed directly inside `directory`, and empty ticks.

    - If the directory does not exist (yet, or any more), watch its nearest
      existing parent until it does (saying so once), then yield every matching
      name in it as "added".
    - If inotify cannot be had (instance or watch limits), fall back to polling
      with a warning and keep going.
    - A batch arrives `step_ms` after the last change and at most `debounce_ms`
      after the first: watchfiles' defaults (1.6 s) are for editors, not daemons.
    - An empty batch is a tick, at most every `tick_s`: a chance for the caller
      to re-check what events may have missed (e.g. a change made before the
      watch was in place).
    """

    def __init__(
        self,
        directory: Path,
        match: Callable[[str], bool],
        *,
        stop: StopFlag,
        debounce_ms: int = 30,
        step_ms: int = 10,
        force_polling: bool = False,
        poll_delay_ms: int = 100,
        tick_s: float = 1.0,
        name: str = "directory",
    ) -> None:
        self.directory = directory
        self.match = match
        self.stop = stop
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.polling = force_polling
        self.poll_delay_ms = poll_delay_ms
        # Also bounds how long the watch thread takes to notice `stop`.
        self.tick_ms = max(100, round(tick_s * 1000))
        self.log = log.bind(watch=name, directory=str(directory))
        self._said_waiting = False

    def _awatch(self, path: Path) -> AsyncGenerator[_RawChanges, None]:
        return watchfiles.awatch(
            path,
            watch_filter=None,
            debounce=self.debounce_ms,
            step=self.step_ms,
            stop_event=self.stop,
            rust_timeout=self.tick_ms,
            yield_on_timeout=True,
            force_polling=self.polling,
            poll_delay_ms=self.poll_delay_ms,
            recursive=False,
            ignore_permission_denied=True,
        )

    async def _watching(self, path: Path) -> AsyncGenerator[_RawChanges, None]:
        """awatch, falling back to polling when inotify is not to be had; ends if `path` goes."""
        while not self.stop.is_set():
            try:
                async with contextlib.aclosing(self._awatch(path)) as changes_iter:
                    async for changes in changes_iter:
                        yield changes
                return
            except FileNotFoundError as err:
                raise _DirectoryGoneError(str(path)) from err
            except (WatchfilesRustInternalError, OSError) as err:
                if not os.path.isdir(path):  # noqa: ASYNC240 - one stat, cheaper than a thread hop
                    raise _DirectoryGoneError(str(path)) from err
                if self.polling or not _is_limit_error(err):
                    # Unknown trouble: say so, wait a little, try again; never crash the agent.
                    self.log.error("directory watch failed; retrying", error=str(err))
                    await sleep_or_stop(self.stop, 1.0)
                    continue
                self.polling = True
                self.log.warning(
                    "inotify limits exhausted, falling back to polling",
                    error=str(err),
                    poll_ms=self.poll_delay_ms,
                    hint="raise fs.inotify.max_user_instances / max_user_watches on the node",
                )

    def _nearest_existing_parent(self) -> Path:
        path = self.directory.parent
        while not path.is_dir() and path != path.parent:
            path = path.parent
        return path

    async def _wait_for_directory(self) -> None:
        while not self.stop.is_set() and not self.directory.is_dir():
            parent = self._nearest_existing_parent()
            if not self._said_waiting:
                self._said_waiting = True
                self.log.warning("directory does not exist, waiting for it", watching=str(parent))
            try:
                async with contextlib.aclosing(self._watching(parent)) as batches:
                    async for _ in batches:
                        # Any change may be a step on the way (a parent created): re-plan.
                        if self.directory.is_dir() or self._nearest_existing_parent() != parent:
                            break
            except _DirectoryGoneError:
                continue
        if self._said_waiting and self.directory.is_dir():
            self.log.info("directory appeared")
            self._said_waiting = False

    def _present(self) -> Batch:
        """The matching names already in the directory, as if just added."""
        try:
            return {p.name: {"added"} for p in self.directory.iterdir() if self.match(p.name)}
        except OSError:
            return {}

    async def batches(self) -> AsyncGenerator[Batch, None]:
        while not self.stop.is_set():
            if not self.directory.is_dir():
                await self._wait_for_directory()
                if self.stop.is_set():
                    return
                yield self._present()
            try:
                async with contextlib.aclosing(self._watching(self.directory)) as raw_batches:
                    async for changes in raw_batches:
                        batch: Batch = {}
                        for change, raw in changes:
                            p = Path(raw)
                            if p.parent == self.directory and self.match(p.name):
                                batch.setdefault(p.name, set()).add(change.name)
                        if batch or not changes:
                            yield batch
                        if not self.directory.is_dir():
                            break
            except _DirectoryGoneError:
                pass
            if not self.directory.is_dir() and not self.stop.is_set():
                self.log.warning("directory vanished, waiting for it to come back")


def _is_limit_error(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOSPC):
        return True
    text = str(err).lower()
    return any(
        s in text
        for s in ("too many open files", "no space left", "watch limit", "os error 24", "os error 28")
    )
