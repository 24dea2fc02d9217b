"""The Pods API as a source: the watch (what pods are and what their status says of devices) and the
reads it asks of the cycle (the pods it named changed, re-read with Get), as one `Source`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watcher.backoff import Backoff
from watcher.kubelet.triggers import Trigger
from watcher.kubelet.watching import DirectoryWatches
from watcher.model.inventory import Inventory
from watcher.sources.base import Evidence
from watcher.sources.pods_api.reads import PodReads
from watcher.sources.pods_api.snapshot import SnapshotBounds
from watcher.sources.pods_api.watch import PodsWatch

__all__ = ["OFF", "PodsApiSource"]

# `/readyz` for an agent that does not watch the Pods API.
OFF = {"state": "off", "detail": "[pods] api = false"}


class PodsApiSource:
    """`watch` keeps the index of the node's pods; `reads` is what the cycle re-reads for them."""

    name = "pods-watch"
    status_key = "pods_api"

    def __init__(
        self,
        socket: Path,
        *,
        labels: tuple[str, ...],
        trigger: Trigger,
        watches: DirectoryWatches,
        backoff: Backoff,
        stop: asyncio.Event,
        on_state: Callable[[str, str], None],
        timeout: float,
        snapshot_timeout: float,
        resync_interval: float,
    ) -> None:
        self.reads = PodReads(trigger)
        self.watch = PodsWatch(
            socket,
            labels=labels,
            backoff=backoff,
            stop=stop,
            on_changes=self.reads.on_changes,
            on_state=on_state,  # its stream's end: the agent looks again at once
            timeout=timeout,
            watches=watches,
            bounds=SnapshotBounds(seconds=snapshot_timeout),
            resync_interval=resync_interval,
        )
        self.reads.index = self.watch.index  # a reused name's pods told apart

    @property
    def live(self) -> bool:
        """The index is complete and live: down, or still reading its snapshot, nothing of the
        pods' status is judged."""
        return self.watch.state == "watching"

    async def run(self) -> None:
        await self.watch.run()

    async def first_look(self) -> None:
        # The first look names pods' owners when the API can: what changed while no agent ran too.
        await self.watch.settled()

    def status(self) -> dict[str, Any]:
        return {"state": self.watch.state, "detail": self.watch.detail}

    def evidence(self, after: Inventory) -> Evidence:
        pods = self.watch.index if self.live else None
        return Evidence(pods=pods, gone=self.reads.take_gone(after))
