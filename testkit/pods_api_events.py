"""The kubelet's Pods API watch as the agent's own client reads it (`watcher.sources.pods_api.client`), each
event recorded with the time it came and the pod as the agent decodes it, for tests that measure
when a change reaches the Pods API and what it says."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from testkit.changes import Changes
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.devicehealth.pods import PodMeta
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.decoding import pod_meta

__all__ = ["PodEvent", "PodsApiEvents", "verdict", "watched"]


@dataclass(frozen=True)
class PodEvent:
    at: float  # time.monotonic() when it came
    kind: int  # pods_pb2.ADDED, MODIFIED, DELETED, INITIAL_SYNC_COMPLETE
    meta: PodMeta | None  # the pod, decoded (ADDED and MODIFIED)


def verdict(meta: PodMeta | None, container: str, resource_id: str) -> str | None:
    """The kubelet's health word for the device `resource_id` held by `container` (None: none)."""
    if meta is None:
        return None
    found = [v.health for v in meta.verdicts if (v.container, v.resource_id) == (container, resource_id)]
    return found[0] if found else None


class PodsApiEvents:
    """Every event of one WatchPods stream, in order."""

    def __init__(self) -> None:
        self.events: list[PodEvent] = []
        self.changes = Changes()
        self.task: asyncio.Task[None] | None = None

    def _check(self) -> None:
        """A watch that ended fails the wait with its own error, not a timeout."""
        if self.task is not None and self.task.done() and not self.task.cancelled():
            self.task.result()

    async def read(self, socket: Path) -> None:
        async with PodsApiClient(str(socket), timeout=5) as api:
            async for kind, raw in api.watch():
                meta = pod_meta(raw, labels=()) if kind in (pods_pb2.ADDED, pods_pb2.MODIFIED) else None
                self.events.append(PodEvent(time.monotonic(), kind, meta))
                self.changes.notify()

    async def until(self, mark: int, match: Callable[[PodEvent], bool], timeout: float = 15.0) -> PodEvent:
        """The first event from `mark` on that `match`es, once it came."""
        found: list[PodEvent] = []

        def seen() -> bool:
            found[:] = [e for e in self.events[mark:] if match(e)][:1]
            return bool(found)

        await self.changes.until(
            seen, timeout, check=self._check, describe=lambda: f"no such event in {self.events[mark:]}"
        )
        return found[0]


@contextlib.asynccontextmanager
async def watched(socket: Path) -> AsyncIterator[PodsApiEvents]:
    """A watch of the Pods API at `socket`, past its first snapshot (INITIAL_SYNC_COMPLETE)."""
    recorder = PodsApiEvents()
    task = recorder.task = asyncio.create_task(recorder.read(socket))
    try:
        await recorder.until(0, lambda e: e.kind == pods_pb2.INITIAL_SYNC_COMPLETE)
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
