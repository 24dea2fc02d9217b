"""The store: the outbox database as the agent, the delivery workers and the sinks use it.

Every database call runs on one dedicated thread, in the order it was made: sqlite3 is
blocking, and a commit's fsyncs must never stall the event loop. The database's
operations are the store's awaitables, one flat API over the database's parts (`await
store.ack(sink, seqs)` runs `Queues.ack` there, `store.retry_dead` runs
`DeadLetters.retry`); `run()` reaches any other.
The store also carries the storage health (watcher.store.health), and it is the
`KeyValue` the paging sinks keep their state in (`kv_get`, `kv_set`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from watcher.store.ages import Clocks
from watcher.store.health import StorageHealth
from watcher.store.outbox import OutboxDatabase
from watcher.store.outbox.caps import CapEnforcer
from watcher.store.outbox.dead_letters import DeadLetters
from watcher.store.outbox.gaps import Gaps
from watcher.store.outbox.kv import KeyValueTable
from watcher.store.outbox.queues import Queues
from watcher.store.outbox.sinks import Sinks
from watcher.store.saved_state import StateWrite

__all__ = ["Store"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _OnThread(Generic[T, P, R]):
    """A method of one of the database's parts (`part` finds it), as an awaitable method of the
    store: it runs on the database's thread."""

    def __init__(self, method: Callable[Concatenate[T, P], R], part: Callable[[OutboxDatabase], T]) -> None:
        self.method = method
        self.part = part
        self.name = method.__name__
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        # The store's name for it (`enforce_caps`), not the part's (`enforce`).
        self.name = name

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, store: Store, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, store: Store | None, owner: type[Any]) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if store is None:
            return self
        method, part = self.method, self.part

        def call(database: OutboxDatabase, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(part(database), *args, **kwargs)

        async def on_thread(*args: P.args, **kwargs: P.kwargs) -> R:
            return await store.run(call, *args, **kwargs)

        on_thread.__name__ = on_thread.__qualname__ = self.name
        on_thread.__doc__ = method.__doc__
        return on_thread


# Where each of the database's parts is, for `_OnThread`.
def _whole(database: OutboxDatabase) -> OutboxDatabase:
    return database


def _queues(database: OutboxDatabase) -> Queues:
    return database.queues


def _caps(database: OutboxDatabase) -> CapEnforcer:
    return database.caps


def _gaps(database: OutboxDatabase) -> Gaps:
    return database.gaps


def _dead_letters(database: OutboxDatabase) -> DeadLetters:
    return database.dead_letters


def _sinks(database: OutboxDatabase) -> Sinks:
    return database.sinks


def _kv(database: OutboxDatabase) -> KeyValueTable:
    return database.kv


class Store:
    def __init__(self, path: Path, *, clocks: Clocks | None = None) -> None:
        self.database = OutboxDatabase(path, clocks=clocks)
        self.health = StorageHealth()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")

    @property
    def path(self) -> Path:
        return self.database.path

    @property
    def last_state_write(self) -> StateWrite | None:
        """The rows of the state the last commit wrote (read after awaiting that commit)."""
        return self.database.last_state_write

    @property
    def recovered_from_corruption(self) -> bool:
        """A corrupt database was moved aside when it was opened: seq must not restart from 0."""
        return self.database.recovered_from_corruption

    async def run(
        self, method: Callable[Concatenate[OutboxDatabase, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`method(database, *args, **kwargs)` on the database thread."""
        call = functools.partial(method, self.database, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    open = _OnThread(OutboxDatabase.open, _whole)
    reopen = _OnThread(OutboxDatabase.reopen, _whole)
    # Close the database but keep the store usable: `open()` may be called again.
    disconnect = _OnThread(OutboxDatabase.close, _whole)

    async def close(self) -> None:
        """Close the database and end its thread: the store is done."""
        await self.run(OutboxDatabase.close)
        self._executor.shutdown(wait=True)

    async def register(self, sinks: Iterable[str]) -> None:
        # Read here, on the loop: callers pass live collections (the dispatcher's workers)
        # that a reload may change while the database thread would be reading them.
        names = list(sinks)
        await self.run(lambda database: database.sinks.register(names))

    commit = _OnThread(Queues.commit, _queues)
    load_state = _OnThread(Queues.load_state, _queues)
    max_seq = _OnThread(Queues.max_seq, _queues)
    pending = _OnThread(Queues.pending, _queues)
    take = _OnThread(Queues.take, _queues)
    release = _OnThread(Queues.release, _queues)
    ack = _OnThread(Queues.ack, _queues)
    dead_letter = _OnThread(DeadLetters.add, _dead_letters)
    enforce_caps = _OnThread(CapEnforcer.enforce, _caps)
    first_gap = _OnThread(Gaps.first, _gaps)
    gap_recorded = _OnThread(Gaps.recorded, _gaps)
    set_disabled = _OnThread(Sinks.set_disabled, _sinks)
    sink_names = _OnThread(Sinks.names, _sinks)
    stats = _OnThread(Sinks.stats, _sinks)
    kv_get = _OnThread(KeyValueTable.get, _kv)
    kv_set = _OnThread(KeyValueTable.set, _kv)
    dead_letters = _OnThread(DeadLetters.held, _dead_letters)
    retry_dead = _OnThread(DeadLetters.retry, _dead_letters)
    drop_dead = _OnThread(DeadLetters.drop, _dead_letters)
