"""The committer: a cycle's changes become events, stored with the new state in one transaction.

It holds the agent's committed `CycleState` and replaces it whole when a commit succeeds; when
a commit fails nothing moves (seq, inventory, the lifecycle bookkeeping), the failure is said
loudly, and the next cycle tries again — even with nothing new, which is how the agent notices
that the state directory works again. It also opens the outbox and restores the saved state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import structlog

from watcher import heap
from watcher.backoff import Backoff
from watcher.cycle.state import CycleState, SavedState, state_from_store, state_record
from watcher.delivery.dispatcher import Dispatcher
from watcher.model import lifecycle
from watcher.model.changes import LIFECYCLE_KINDS, Change
from watcher.model.events import Event, envelope
from watcher.model.inventory import Inventory
from watcher.ops.metrics import Metrics
from watcher.settings import Settings
from watcher.store.store import Store

__all__ = ["Committer", "EventObserver"]

log = structlog.get_logger("watcher.cycle.committer")

EventObserver = Callable[[Event], None]
# Asks for a re-query: (reason, urgent).
Wake = Callable[[str, bool], None]


class Committer:
    def __init__(
        self,
        settings: Settings,
        *,
        outbox: Store,
        dispatcher: Dispatcher,
        metrics: Metrics,
        backoff: Backoff,
        wake: Wake,
        state: CycleState,
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.storage = outbox.health
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.backoff = backoff
        self.wake = wake
        self.state = state
        self.observers: list[EventObserver] = []

    @property
    def log(self) -> structlog.stdlib.BoundLogger:
        return log.bind(socket=str(self.settings.kubelet.socket))  # type: ignore[no-any-return]

    # -- opening --

    async def open(self, *, first: bool) -> bool:
        """Open the outbox and restore the saved state; False (said loudly) if the disk refuses.
        The caller holds the cycle lock: no cycle may commit meanwhile."""
        try:
            await self.outbox.open()
            await self.outbox.register(self.dispatcher.workers)
            saved = await self._stored_state()
        except Exception as err:  # sqlite3.Error, OSError: full, read-only, missing
            try:
                await self.outbox.disconnect()  # half open: start clean next time
            except Exception as close_err:  # already broken: the first error says it all
                self.log.debug("closing a half-open outbox failed", error=repr(close_err))
            self.storage.open_failed(err)
            if first:
                self.log.error(
                    "cannot open the outbox: watching anyway, but nothing is emitted until it can be "
                    "written; retrying (check the state directory: full, read-only, wrong owner?)",
                    state_dir=str(self.settings.state_dir),
                    error=repr(err),
                )
            return False
        self.state = self._restored(self.state, saved)
        if not first:
            self.log.info("outbox open: events flow again", state_dir=str(self.settings.state_dir))
            self.storage.ok()
            self.wake("outbox", True)
        self.storage.ready.set()
        return True

    async def _stored_state(self) -> SavedState:
        """The state the outbox holds, as of its last commit."""
        saved, max_seq = await self.outbox.load_state(), await self.outbox.max_seq()
        return state_from_store(saved, min_seq=max_seq, lost=self.outbox.recovered_from_corruption)

    def _restored(self, state: CycleState, saved: SavedState) -> CycleState:
        if saved.node is not None and saved.node != self.settings.node:
            self.log.warning(
                "saved state belongs to another node: taking a fresh baseline", saved_node=saved.node
            )
            return dataclasses.replace(state, seq=saved.seq, inventory=None, socket=None)
        return dataclasses.replace(
            state,
            seq=saved.seq,
            inventory=saved.inventory,
            socket=saved.socket,
            device_health=saved.device_health,
            incidents=saved.incidents,
            flaps=saved.flaps,
            evictions=saved.evictions,
            expected=saved.expected,
            rejections=saved.rejections,
            resets=saved.resets,
        )

    def outbox_trouble(self, err: Exception) -> None:
        """A sink worker could not use the outbox. On a quiet node no commit would find out:
        say so, and make the next cycle reopen it (a commit with nothing new, if need be)."""
        if not self.storage.writable:
            return  # said already, or not open yet
        self.storage.failed(err)
        self.log.error(
            "the outbox failed under a sink: reopening it at the next cycle",
            state_dir=str(self.settings.state_dir),
            error=repr(err),
        )
        self.wake("outbox", False)

    # -- committing --

    async def commit(
        self,
        changes: Sequence[Change],
        cycle: str,
        draft: CycleState,
        *,
        before: Inventory | None = None,
        baseline: bool = False,
    ) -> bool:
        """Store `changes` as events and `draft` (seq aside) as the new state. True when `draft`
        became the committed state (stored, nothing to store, or the database was found ahead and
        taken as it is); False when the store refused: nothing moved, and a retry is scheduled."""
        current = self.state
        after = draft.inventory
        changes = self._with_started(changes, draft, baseline=baseline)
        # After a failed commit, try again even with nothing new: that is how the agent
        # finds out the disk is back (and /readyz, the metrics and the sinks with it).
        if after is current.inventory and not changes and self.storage.error is None:
            self.state = draft
            return True
        events = self._envelopes(changes, cycle, before if before is not None else current.inventory, after)
        seq = current.seq + len(events)
        saved = SavedState(
            seq=seq,
            inventory=after,
            socket=draft.socket,
            node=self.settings.node,
            device_health=draft.device_health,
            incidents=draft.incidents,
            flaps=draft.flaps,
            evictions=draft.evictions,
            expected=draft.expected,
            rejections=draft.rejections,
            resets=draft.resets,
        )
        try:
            self.storage.require_ready()
            if self.storage.error is not None:
                await self.outbox.reopen()  # the last commit failed: the disk may be back
                if await self._database_is_ahead(draft):
                    return True
            with self.metrics.commit_duration.time():
                await self.dispatcher.commit(events, state_record(saved))
        except Exception as err:  # disk full, read-only, corrupt: never crash, never advance
            self._failed(err)
            return False
        if self.storage.error is not None:
            self.log.info("events and state stored again", state_dir=str(self.settings.state_dir))
        self.storage.ok()
        if after is not None:
            # Not only when the inventory changed: after an agent restart the answer often equals
            # the saved inventory, and the gauges must show it all the same (a failed GPU's 0).
            self.metrics.set_inventory(after)
        self.state = dataclasses.replace(draft, seq=seq, started_reported=True)
        if not current.started_reported:
            heap.settle("the first inventory")  # the node's view, built whole: watcher.heap
        await self.dispatcher.hand_over()
        self._announce(events)
        return True

    def _with_started(self, changes: Sequence[Change], draft: CycleState, *, baseline: bool) -> list[Change]:
        """`changes`, after the agent's `started` event if this is its first commit."""
        current = self.state
        changes = list(changes)
        if not current.started_reported:
            started = lifecycle.started(
                draft.inventory if draft.health.ever_connected else None,
                baseline="fresh" if baseline or current.inventory is None else "saved",
                changes=sum(1 for c in changes if c.kind not in LIFECYCLE_KINDS),
                error=draft.health.last_error,
            )
            changes.insert(0, started)
        return changes

    def _envelopes(
        self, changes: Sequence[Change], cycle: str, before: Inventory | None, after: Inventory | None
    ) -> list[Event]:
        """The events of `changes`, numbered on from the committed state's seq."""
        return [
            envelope(
                c,
                seq=self.state.seq + i,
                node=self.settings.node,
                cycle=cycle,
                before=before.content_hash if before is not None else None,
                after=after.content_hash if after is not None else None,
            )
            for i, c in enumerate(changes, start=1)
        ]

    def _announce(self, events: Sequence[Event]) -> None:
        """Count, log and hand to the observers the events just stored."""
        for event in events:
            self.metrics.events.labels(str(event.kind)).inc()
            self.log.info(
                "event",
                kind=str(event.kind),
                seq=event.seq,
                severity=str(event.severity),
                summary=event.summary,
            )
            for observer in self.observers:
                observer(event)

    def _failed(self, err: Exception) -> None:
        self.log.error(
            "could not commit events and state; will retry next cycle (check the state directory)",
            state_dir=str(self.settings.state_dir),
            error=repr(err),
        )
        failures = self.storage.count_failure()  # its own count: the kubelet's is 0 here
        self.storage.failed(err)
        self.metrics.commit_failures.inc()
        retry_at = time.monotonic() + self.backoff.delay(failures)
        self.state = dataclasses.replace(self.state, health=self.state.health.retry_after(retry_at))

    async def _database_is_ahead(self, draft: CycleState) -> bool:
        """After a reopen: did a commit that reported failure reach the disk after all (an
        fsync error, a remount)? Then continue from what the database holds: the events it
        stored are delivered from there, and numbering them again would lose later ones."""
        saved = await self._stored_state()
        if saved.seq <= self.state.seq:
            return False
        self.log.warning(
            "the outbox holds events from a commit reported as failed: continuing from them",
            stored_seq=saved.seq,
            seq=self.state.seq,
        )
        # The draft's lifecycle bookkeeping is kept: the events the database holds came from a
        # cycle that saw what this one saw again (a restart, an outage's end), and taking the
        # older bookkeeping would report those a second time.
        self.state = self._restored(
            dataclasses.replace(draft, started_reported=self.state.started_reported), saved
        )
        self.storage.ok()
        self.dispatcher.notify()
        self.wake("outbox", True)  # diff the current answer against it
        return True
