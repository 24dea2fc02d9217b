"""One supervisor for every long-lived task: named, logged, stopped together.

The first task to crash (or to return while it should not) stops all of them
and its error is re-raised; a stop request gives every task `grace` seconds to
finish on its own before the rest are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol

import structlog

__all__ = ["StopFlag", "TaskExitedError", "sleep_or_stop", "stop_on_signals", "supervise"]

log = structlog.get_logger("watcher.supervision")


class TaskExitedError(RuntimeError):
    """A supervised task returned although nothing asked it to stop."""


async def supervise(
    tasks: Mapping[str, Callable[[], Awaitable[None]]],
    *,
    stop: asyncio.Event,
    grace: float = 10.0,
    on_start: Callable[[dict[str, asyncio.Task[None]]], None] | None = None,
) -> None:
    running: dict[asyncio.Task[None], str] = {}
    for task_name, factory in tasks.items():
        running[asyncio.create_task(_as_coroutine(factory), name=task_name)] = task_name
    if on_start is not None:
        # Lets health checks see which supervised tasks are alive.
        on_start({name: task for task, name in running.items()})
    stopper: asyncio.Task[Any] = asyncio.create_task(stop.wait(), name="stop-request")
    failure: BaseException | None = None
    try:
        waiting: list[asyncio.Task[Any]] = [*running, stopper]
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            name = running.get(finished)
            if name is None:
                continue
            if finished.cancelled():
                failure = TaskExitedError(f"task {name} was cancelled")
            elif (exc := finished.exception()) is not None:
                failure = exc
                log.error("task crashed; stopping", task=name, error=repr(exc), exc_info=exc)
            elif not stop.is_set():
                failure = TaskExitedError(f"task {name} exited unexpectedly")
                log.error("task exited unexpectedly; stopping", task=name)
    finally:
        stop.set()
        pending = [t for t in running if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                log.warning("task did not stop in time; cancelling", task=running[task], grace_s=grace)
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        for task in running:
            if task.done() and not task.cancelled() and task.exception() is not None and failure is None:
                exc = task.exception()
                log.error("task failed while stopping", task=running[task], error=repr(exc))
        stopper.cancel()
        await asyncio.gather(stopper, return_exceptions=True)
    if failure is not None:
        raise failure


async def _as_coroutine(factory: Callable[[], Awaitable[None]]) -> None:
    # create_task() needs a coroutine; factories may return any awaitable.
    await factory()


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (a flag; shutdown proceeds in the normal flow)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


class StopFlag(Protocol):
    """asyncio.Event's reading half: what a loop checks to know it should end."""

    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


async def sleep_or_stop(stop: StopFlag, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
