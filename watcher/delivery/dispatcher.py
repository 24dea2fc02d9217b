"""Delivery: routing new events into the sinks' queues, and the workers that drain them.

Each sink has its own worker task (see `watcher.delivery.worker`), supervised here,
so a slow or dead sink never delays another sink or the watch loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Awaitable, Callable, Sequence

import structlog

from watcher.delivery.worker import DeliveryObserver, SinkWorker
from watcher.model.events import Event
from watcher.sinks.base import Sink
from watcher.store.saved_state import StateRecord
from watcher.store.store import Store
from watcher.supervision import Scope, StoppedError, Supervisor, unless_stopped

__all__ = ["Dispatcher", "SinkWorker", "DeliveryObserver"]

log = structlog.get_logger("watcher.delivery.dispatcher")
# How long a stopping worker may hand over what is queued before it is cancelled.
WORKER_STOP_GRACE_S = 4.0  # inside the agent's own shutdown grace


class Dispatcher:
    """The sinks' workers, routing of new events into their queues, and reloads.

    `run()` is one supervised task whose Supervisor owns a task per worker (and
    per sink background loop); `reload()` swaps the sinks whose settings changed
    and leaves the others, and every queue, untouched. A producer calls
    `commit()` (route and store, in one transaction) and, once it has taken the
    stored events as its own, `hand_over()` (wake the workers, enforce the caps).
    """

    def __init__(
        self,
        outbox: Store,
        sinks: Sequence[Sink],
        *,
        stop: asyncio.Event,
        rng: random.Random | None = None,
        on_outbox_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.outbox = outbox
        self.stop = stop
        self.observers: list[DeliveryObserver] = []
        self.rng = rng if rng is not None else random.Random()
        # Told of every outbox failure a worker meets, so the agent can reopen it and say so.
        self._on_outbox_error = on_outbox_error or (lambda _err: None)
        # The workers' own stop flag: a crashed worker stops its siblings and the crash goes up
        # to the agent's supervisor through run(); the agent's stop stops them all.
        self._scope = Scope(stop)
        self.supervisor = Supervisor(self._scope, grace=WORKER_STOP_GRACE_S)
        self.workers: dict[str, SinkWorker] = {s.name: self._worker(s) for s in sinks}
        self._started: set[str] = set()
        self._running = False

    def _worker(self, sink: Sink) -> SinkWorker:
        # Each worker has its own stop scope so one can be retired on reload.
        worker = SinkWorker(
            sink, self.outbox, stop=Scope(self._scope), rng=self.rng, observers=self.observers
        )
        worker.on_outbox_error = self._on_outbox_error
        return worker

    async def commit(self, events: Sequence[Event], state: StateRecord | None) -> None:
        """Queue `events` for the sinks that asked for them and store `state`, in one
        transaction. Raises if the store refused: then nothing was stored."""
        await self.outbox.commit(events, self.queues(events), state)

    async def hand_over(self) -> None:
        """After a commit: wake the workers and enforce the queues' caps (logs, never raises:
        the events are stored already)."""
        self.notify()
        await self.enforce_caps()

    def queues(self, events: Sequence[Event]) -> dict[str, list[int]]:
        """sink name -> seqs of the events it asked for."""
        return {name: [e.seq for e in events if w.route.matches(e)] for name, w in self.workers.items()}

    def notify(self) -> None:
        for worker in self.workers.values():
            worker.wake.set()

    async def enforce_caps(self) -> None:
        """Apply every sink's caps; each worker counts and logs what its caps dropped."""
        for name, worker in list(self.workers.items()):  # a reload may change the dict meanwhile
            try:
                await worker.enforce_caps()
            except Exception as err:  # a failing disk must not stop the agent: next time
                log.error("could not enforce a sink's queue caps; will retry", sink=name, error=repr(err))

    def _start(self, worker: SinkWorker) -> None:
        self._started.add(worker.name)
        self.supervisor.spawn(f"deliver:{worker.name}", worker.run)
        background = worker.sink.background()
        if background is not None:
            loop = functools.partial(_background, worker.stop, background)
            self.supervisor.spawn(f"sink:{worker.name}", loop)

    async def reload(self, sinks: Sequence[Sink]) -> list[str]:
        """Replace changed sinks, add new ones, retire removed ones; return what changed.

        Does nothing once the dispatcher is stopping: nothing would supervise new workers.

        A replacement goes into `workers` before the old worker is waited for, so
        events committed meanwhile are queued for it and none is lost.
        """
        if self.stop.is_set():
            for sink in sinks:
                with contextlib.suppress(Exception):
                    await sink.close()
            return []
        new = {s.name: s for s in sinks}
        changed: list[str] = []
        retiring: list[SinkWorker] = []
        for name, old in list(self.workers.items()):
            if name in new and new[name].settings == old.sink.settings:
                continue
            changed.append(name)
            retiring.append(old)
            if name in new:
                self.workers[name] = self._worker(new[name])
            else:
                del self.workers[name]
        for name, sink in new.items():
            if name not in self.workers:
                self.workers[name] = self._worker(sink)
                changed.append(name)
            elif self.workers[name].sink is not sink:
                with contextlib.suppress(Exception):
                    await sink.close()  # an unchanged twin built by the reload: keep the running one
        for old in retiring:
            old.stop.set()
            old.wake.set()
            if old.name in self._started:
                self._started.discard(old.name)
                await self.supervisor.retire([f"deliver:{old.name}", f"sink:{old.name}"], grace=5.0)
            with contextlib.suppress(Exception):
                await old.sink.close()
        for name in changed:
            if name in self.workers and name not in self._started:
                try:
                    await self.outbox.register([name])
                except Exception as err:  # the outbox is not open: it registers every sink when it is
                    log.error("could not register a sink in the outbox yet", sink=name, error=repr(err))
                if self._running:  # before that, run() starts every worker
                    self._start(self.workers[name])
        self.notify()
        return sorted(set(changed))

    async def run(self) -> None:
        """Run every worker under the dispatcher's Supervisor until the stop flag or a crash."""
        self._running = True
        for worker in self.workers.values():
            if worker.name not in self._started:
                self._start(worker)
        try:
            await self.supervisor.run()
        finally:
            self._running = False

    async def close(self) -> None:
        for worker in list(self.workers.values()):
            with contextlib.suppress(Exception):
                await worker.sink.close()


async def _background(stop: Scope, factory: Callable[[], Awaitable[None]]) -> None:
    """Run a sink's endless background loop until its worker is retired or the agent stops."""
    with contextlib.suppress(StoppedError):
        await unless_stopped(stop, factory())
