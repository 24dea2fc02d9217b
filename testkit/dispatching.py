"""The real Dispatcher on a real outbox, running for the length of a block, and what its delivery
observers reported, awaitable."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testkit.changes import Changes
from watcher.delivery.dispatcher import Dispatcher
from watcher.delivery.worker import SinkWorker
from watcher.model.events import Event
from watcher.sinks.base import Sink
from watcher.store.store import Store

__all__ = ["Deliveries", "Dispatching", "dispatching", "open_outbox"]


@contextlib.asynccontextmanager
async def open_outbox(path: Path) -> AsyncIterator[Store]:
    """A real outbox (the dispatcher's queues, the sinks' KeyValue) at `path`, open for the block."""
    outbox = Store(path)
    await outbox.open()
    try:
        yield outbox
    finally:
        await outbox.close()


class Deliveries:
    """What the dispatcher's observers reported: (sink, result, seqs) per batch, awaitable."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, list[int]]] = []
        self._changes = Changes()

    def __call__(self, sink: str, result: str, batch: Sequence[Event], _elapsed: float) -> None:
        self.seen.append((sink, result, [e.seq for e in batch]))
        self._changes.notify()

    def seqs(self, result: str) -> list[int]:
        return [seq for _, r, seqs in self.seen if r == result for seq in seqs]

    async def wait_for(self, predicate: Callable[[Deliveries], bool], timeout: float = 10.0) -> None:
        await self._changes.until(
            lambda: predicate(self),
            timeout,
            describe=lambda: f"deliveries not as expected within {timeout:g} s: {self.seen}",
        )


@dataclass
class Dispatching:
    """A running dispatcher, its outbox and what it delivered."""

    dispatcher: Dispatcher
    outbox: Store
    deliveries: Deliveries = field(default_factory=Deliveries)

    async def enqueue(self, events: Sequence[Event]) -> None:
        await self.outbox.commit(events, self.dispatcher.queues(events), None)
        self.dispatcher.notify()

    def worker(self, name: str) -> SinkWorker:
        return self.dispatcher.workers[name]


@contextlib.asynccontextmanager
async def dispatching(outbox: Store, sinks: Sequence[Sink], *, seed: int = 7) -> AsyncIterator[Dispatching]:
    """The real Dispatcher's tasks, running until the block ends; then stopped and awaited (a task's
    exception is raised then). `seed` seeds its retry jitter."""
    stop = asyncio.Event()
    dispatcher = Dispatcher(outbox, sinks, stop=stop, rng=random.Random(seed))
    run = Dispatching(dispatcher, outbox)
    dispatcher.observers.append(run.deliveries)
    task = asyncio.create_task(dispatcher.run(), name="dispatcher")  # it owns the workers' tasks
    try:
        yield run
    finally:
        stop.set()
        async with asyncio.timeout(15):
            results = await asyncio.gather(task, return_exceptions=True)
        await dispatcher.close()
    for result in results:
        if isinstance(result, BaseException):
            raise result
