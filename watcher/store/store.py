"""The store: the outbox database as the agent, the delivery workers and the sinks use it.

Every database call runs on one dedicated thread, in the order it was made: sqlite3 is
blocking, and a commit's fsyncs must never stall the event loop. The database's
operations are the store's awaitables of the same name and signature (`await
store.ack(sink, seqs)` runs `OutboxDatabase.ack` there); `run()` reaches any other.
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
from watcher.store.saved_state import StateWrite

__all__ = ["Store"]

P = ParamSpec("P")
R = TypeVar("R")


class _OnThread(Generic[P, R]):
    """A method of the database, as an awaitable method of the store: it runs on its thread."""

    def __init__(self, method: Callable[Concatenate[OutboxDatabase, P], R]) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, store: Store, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, store: Store | None, owner: type[Any]) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if store is None:
            return self
        method = self.method

        async def on_thread(*args: P.args, **kwargs: P.kwargs) -> R:
            return await store.run(method, *args, **kwargs)

        on_thread.__name__ = on_thread.__qualname__ = method.__name__
        on_thread.__doc__ = method.__doc__
        return on_thread


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

    open = _OnThread(OutboxDatabase.open)
    reopen = _OnThread(OutboxDatabase.reopen)
    # Close the database but keep the store usable: `open()` may be called again.
    disconnect = _OnThread(OutboxDatabase.close)

    async def close(self) -> None:
        """Close the database and end its thread: the store is done."""
        await self.run(OutboxDatabase.close)
        self._executor.shutdown(wait=True)

    async def register(self, sinks: Iterable[str]) -> None:
        # Read here, on the loop: callers pass live collections (the dispatcher's workers)
        # that a reload may change while the database thread would be reading them.
        await self.run(OutboxDatabase.register, list(sinks))

    commit = _OnThread(OutboxDatabase.commit)
    load_state = _OnThread(OutboxDatabase.load_state)
    max_seq = _OnThread(OutboxDatabase.max_seq)
    pending = _OnThread(OutboxDatabase.pending)
    take = _OnThread(OutboxDatabase.take)
    release = _OnThread(OutboxDatabase.release)
    ack = _OnThread(OutboxDatabase.ack)
    dead_letter = _OnThread(OutboxDatabase.dead_letter)
    enforce_caps = _OnThread(OutboxDatabase.enforce_caps)
    first_gap = _OnThread(OutboxDatabase.first_gap)
    gap_recorded = _OnThread(OutboxDatabase.gap_recorded)
    set_disabled = _OnThread(OutboxDatabase.set_disabled)
    sink_names = _OnThread(OutboxDatabase.sink_names)
    stats = _OnThread(OutboxDatabase.stats)
    kv_get = _OnThread(OutboxDatabase.kv_get)
    kv_set = _OnThread(OutboxDatabase.kv_set)
    dead_letters = _OnThread(OutboxDatabase.dead_letters)
    retry_dead = _OnThread(OutboxDatabase.retry_dead)
    drop_dead = _OnThread(OutboxDatabase.drop_dead)
