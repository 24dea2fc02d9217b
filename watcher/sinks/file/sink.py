"""The file sink: batches and gap records handed to the audit log's writer, one at a time on a
worker thread, its failures as outcomes the delivery worker retries, and its one registration."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import structlog

from watcher.errors import UnsafePathError
from watcher.model.events import Event
from watcher.model.gaps import Gap
from watcher.secrets import SecretError
from watcher.sinks.base import Capabilities, Outcome, SinkContext
from watcher.sinks.file.settings import FileSinkSettings, check_settings, log_path
from watcher.sinks.file.writer import AuditLogWriter
from watcher.sinks.registry import SinkType, register

__all__ = ["FileSink"]

log = structlog.get_logger("watcher.sinks.file")
T = TypeVar("T")


class FileSink:
    def __init__(self, settings: FileSinkSettings, path: Path) -> None:
        self.name = settings.name
        self.settings = settings
        self.path = path
        self._writer = AuditLogWriter(settings, path)
        self.head_file = self._writer.head_file
        self._lock = asyncio.Lock()

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        return await self._locked(self._writer.write, [(e.seq, e) for e in events])

    async def record_gap(self, gap: Gap) -> Outcome:
        """Write a gap record for events the queue's caps dropped. The part of it the log
        already covers (written, then dropped before the ack: a crash between the two) is
        left out; a gap the log covers wholly is not written at all."""
        return await self._locked(self._writer.write_gap, gap)

    async def _locked(self, write: Callable[[T], None], what: T) -> Outcome:
        async with self._lock:
            try:
                await asyncio.to_thread(write, what)
            except UnsafePathError as err:
                # Retried, not dead-lettered: once the operator has replaced the link, the
                # queued events are written, none lost.
                self._writer.forget_fd()
                return Outcome(retry=True, error=str(err))
            except OSError as err:
                # Open the file afresh next time: after the disk was remounted or replaced,
                # the old descriptor may point at a filesystem that is gone.
                self._writer.forget_fd()
                where = err.filename or self.path
                return Outcome(retry=True, error=f"cannot write {where}: {err.strerror or err}")
            except SecretError as err:
                return Outcome(retry=True, error=f"the audit log's key is unreadable: {err}")
        return Outcome.ok()

    def background(self) -> Callable[[], Awaitable[None]] | None:
        if self.settings.fsync != "interval":
            return None

        async def fsync_periodically() -> None:
            while True:
                await asyncio.sleep(self.settings.fsync_interval)
                async with self._lock:
                    try:
                        await asyncio.to_thread(self._writer.sync)
                    except OSError as err:  # a bad disk must not stop the agent; the next write says so too
                        log.error("audit log fsync failed", path=str(self.path), error=str(err))

        return fsync_periodically

    async def close(self) -> None:
        async with self._lock:
            if self._writer.is_open:
                await asyncio.to_thread(self._writer.close)


def _file_sink(settings: FileSinkSettings, context: SinkContext) -> FileSink:
    return FileSink(settings, log_path(settings, context.state_dir))


def _send_test_copy(settings: FileSinkSettings) -> FileSinkSettings:
    """send-test writes beside the audit log, never into it: a test record in the real chain
    would take a seq the agent's events need and stay in the log for good."""
    path = settings.path.with_name(settings.path.name + ".send-test")
    return dataclasses.replace(settings, path=path)


register(
    SinkType(
        name="file",
        settings=FileSinkSettings,
        factory=_file_sink,
        validate=check_settings,
        capabilities=Capabilities(batches=True),
        order=20,
        for_send_test=_send_test_copy,
        audit_log=log_path,
    )
)
