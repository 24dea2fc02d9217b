"""What the HTTP endpoints report: liveness, readiness, the inventory and the metrics."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from watcher.cycle.committer import Committer
from watcher.cycle.reactor import Reactor
from watcher.delivery.dispatcher import Dispatcher
from watcher.kubelet.watching import DirectoryWatches
from watcher.model.inventory import Inventory
from watcher.ops.http import Health
from watcher.ops.metrics import Metrics
from watcher.settings import Settings
from watcher.sources.pods_api.source import OFF
from watcher.store.store import Store

__all__ = ["AgentStatus", "InventoryDocument"]

log = structlog.get_logger("watcher.status")


@dataclass(frozen=True)
class InventoryDocument:
    """/inventory's answer for one committed state: `{"derived", "hash", "inventory", "node", "seq"}`.

    `render()` runs in a thread: it reads only this frozen state. The inventory itself is not
    serialised again: its canonical bytes (the ones its hash is computed over) are spliced in.
    """

    node: str
    seq: int
    inventory: Inventory

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.node, self.seq, self.inventory.content_hash)

    def render(self) -> bytes:
        def value(v: Any) -> bytes:
            return json.dumps(v, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()

        inv = self.inventory
        return b"".join(
            (
                b'{"derived":',
                value(inv.derived()),
                b',"hash":',
                value(inv.content_hash),
                b',"inventory":',
                inv.canonical_bytes,
                b',"node":',
                value(self.node),
                b',"seq":',
                value(self.seq),
                b"}",
            )
        )


class AgentStatus:
    """Answers the `Status` the HTTP server asks for, from the parts that know."""

    def __init__(
        self,
        *,
        settings: Callable[[], Settings],
        tasks: Callable[[], Mapping[str, asyncio.Task[None]]],
        reactor: Reactor,
        committer: Committer,
        dispatcher: Dispatcher,
        outbox: Store,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._tasks = tasks
        self.reactor = reactor
        self.committer = committer
        self.dispatcher = dispatcher
        self.outbox = outbox
        self.storage = outbox.health
        self.metrics = metrics

    def liveness(self) -> Health:
        tasks = self._tasks()
        dead = sorted(name for name, task in tasks.items() if task.done())
        details: dict[str, Any] = {
            "tasks": {n: ("done" if t.done() else "running") for n, t in tasks.items()}
        }
        if dead:
            return Health(False, f"supervised task(s) ended: {', '.join(dead)}", details)
        return Health(True, "event loop responsive, all tasks alive", details)

    def readiness(self) -> Health:
        settings = self._settings()
        state = self.committer.state
        h = state.health
        last = self.reactor.last_success
        age = None if last is None else time.monotonic() - last
        details: dict[str, Any] = {
            "kubelet_reachable": h.ever_connected and h.failing_since is None,
            "last_success_age_s": None if age is None else round(age, 3),
            "seq": state.seq,
            # Which way pod changes are seen: the kubelet's Pods API, or pod-resources alone.
            "pods_api": dict(OFF),
        }
        # Each source says how it is doing; none is a reason to be unready on its own.
        for source in self.reactor.sources:
            details[source.status_key] = source.status()
        # What each trigger directory shows through the mounts: a missing mount is named here.
        details["watches"] = watch_report(self.reactor.notifier.watches)
        if self.storage.error is not None:
            where = settings.state_dir
            return Health(False, f"cannot store events and state in {where}: {self.storage.error}", details)
        if age is None:
            return Health(
                False, f"the kubelet has not answered yet ({h.last_error or 'no query yet'})", details
            )
        if h.failing_since is not None:
            return Health(False, f"the kubelet is not answering: {h.last_error}", details)
        if age > settings.http.ready_stale_after:
            return Health(False, f"the last successful re-query is {age:.0f} s old", details)
        return Health(True, "kubelet reachable, inventory fresh", details)

    def inventory_document(self) -> InventoryDocument | None:
        state = self.committer.state
        if state.inventory is None:
            return None
        return InventoryDocument(self._settings().node, state.seq, state.inventory)

    async def metrics_text(self) -> bytes:
        names = list(self.dispatcher.workers)  # a reload may change the dict while we await
        try:
            self.metrics.set_outbox({name: await self.outbox.stats(name) for name in names})
        except Exception as err:  # a failing state directory: /metrics must still say so
            log.debug("outbox figures unavailable", error=repr(err))
        return self.metrics.render()


def watch_report(watches: DirectoryWatches, limit: int = 16) -> dict[str, dict[str, Any]]:
    """Each watched directory, whether it exists, and the matching names in it (at most `limit`:
    device plugins choose their socket names). An operator reads here what a missing mount costs:
    a trigger directory that is `missing`, or there with none of the files it waits for."""
    out: dict[str, dict[str, Any]] = {}
    for sub in watches.subscriptions:
        # Names are bytes to the kernel: one that is not UTF-8 must not make the answer invalid JSON.
        names = sorted(os.fsencode(name).decode("utf-8", "replace") for name in sub.present())
        out[sub.name] = {
            "directory": str(sub.directory),
            "state": "unknown" if not sub.seen else "missing" if sub.waiting else "watching",
            "files": names[:limit],
            "more_files": max(0, len(names) - limit),
        }
    return out
