"""Task supervision, the one way the agent runs and stops long-lived work.

- `Supervisor`: named tasks, added (and retired, on reload) while it runs. The first task to crash, or
  to return while nothing asked it to stop, stops all of them and its error is re-raised; a stop
  request gives every task `grace` seconds to finish on its own before the rest are cancelled.
- `Scope`: a stop flag of its own that is also set when its parent is: what a part of the agent
  that can be retired alone (a sink worker, one configuration's watches) checks.
- `unless_stopped`, `wait_any`, `sleep_or_stop`: "this work, or the stop flag, whichever comes
  first". Nothing else in the package races futures by hand: every such race is a chance to leak
  a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import structlog

__all__ = [
    "Scope",
    "StopFlag",
    "SettableStop",
    "StoppedError",
    "Supervisor",
    "TaskExitedError",
    "sleep_or_stop",
    "stop_on_signals",
    "unless_stopped",
    "wait_any",
]

log = structlog.get_logger("watcher.supervision")
T = TypeVar("T")


class TaskExitedError(RuntimeError):
    """A supervised task returned although nothing asked it to stop."""


class StoppedError(Exception):
    """The stop flag was set before the work finished (the work was cancelled)."""


class StopFlag(Protocol):
    """asyncio.Event's reading half: what a loop checks to know it should end."""

    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


class SettableStop(StopFlag, Protocol):
    """A stop flag its owner can set: asyncio.Event, or a Scope (which leaves its parent alone)."""

    def set(self) -> None: ...


async def wait_any(*flags: StopFlag, within: float | None = None) -> None:
    """Return when any of `flags` is set, or after `within` seconds."""
    if any(f.is_set() for f in flags):
        return
    waits = [asyncio.ensure_future(f.wait()) for f in flags]
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def unless_stopped(stop: StopFlag, work: Awaitable[T]) -> T:
    """The result of `work`, unless `stop` is set first: then `work` is cancelled and `StoppedError`
    raised, so a hung call never holds up shutdown. A crash in `work` propagates."""
    task = asyncio.ensure_future(work)
    stop_wait = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(stop_wait, return_exceptions=True)
    if task.cancelled() or not task.done():
        await asyncio.gather(task, return_exceptions=True)
        raise StoppedError
    return task.result()


async def sleep_or_stop(stop: StopFlag, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    await wait_any(stop, within=max(0.0, seconds))


class Scope:
    """A stop flag set by its own `set()` (retired alone) or by its parent's (everything stops)."""

    def __init__(self, parent: StopFlag) -> None:
        self._parent = parent
        self._own = asyncio.Event()

    def is_set(self) -> bool:
        return self._own.is_set() or self._parent.is_set()

    def set(self) -> None:
        self._own.set()

    async def wait(self) -> bool:
        await wait_any(self._own, self._parent)
        return True


class Supervisor:
    """Named tasks under one stop flag; see the module docstring.

    On a failure it sets `stop` to stop its own tasks and re-raises. A supervisor nested in a
    task of another is given a `Scope` of the outer stop flag: a failure then stops only its own
    tasks, and the outer supervisor sees the failure as its task's crash.
    """

    def __init__(self, stop: SettableStop, *, grace: float = 10.0) -> None:
        self.stop = stop
        self.grace = grace
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    @property
    def tasks(self) -> Mapping[str, asyncio.Task[None]]:
        """The supervised tasks by name (health checks report the ones that ended)."""
        return dict(self._tasks)

    def spawn(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Start `factory()` as task `name`; allowed while `run()` is waiting."""
        if name in self._tasks and not self._tasks[name].done():
            raise RuntimeError(f"task {name} is already running")
        self._tasks[name] = asyncio.create_task(_as_coroutine(factory), name=name)
        self._changed.set()

    async def retire(self, names: list[str], *, grace: float) -> None:
        """Stop watching these tasks (they were asked to end), wait `grace` seconds, then cancel them."""
        tasks = [t for n in names if (t := self._tasks.pop(n, None)) is not None]
        self._changed.set()
        await _end(tasks, grace)

    async def run(self) -> None:
        """Wait until the stop flag or a failure, then stop everything (see the module docstring)."""
        stopper: asyncio.Task[Any] = asyncio.create_task(self.stop.wait(), name="stop-request")
        failure: BaseException | None = None
        try:
            while failure is None and not self.stop.is_set():
                self._changed.clear()
                changed = asyncio.create_task(self._changed.wait(), name="supervisor-changed")
                current = {task: name for name, task in self._tasks.items()}
                try:
                    done, _ = await asyncio.wait(
                        [*current, stopper, changed], return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                    await asyncio.gather(changed, return_exceptions=True)
                for finished in done:
                    name = current.get(finished)
                    # A task retired meanwhile ended on purpose.
                    if name is None or self._tasks.get(name) is not finished:
                        continue
                    failure = self._failure(name, finished) or failure
        finally:
            self.stop.set()
            await self._stop_all(failure)
            stopper.cancel()
            await asyncio.gather(stopper, return_exceptions=True)
        if failure is not None:
            raise failure

    def _failure(self, name: str, task: asyncio.Task[None]) -> BaseException | None:
        if task.cancelled():
            return TaskExitedError(f"task {name} was cancelled")
        if (exc := task.exception()) is not None:
            log.error("task crashed; stopping", task=name, error=repr(exc), exc_info=exc)
            return exc
        if not self.stop.is_set():
            log.error("task exited unexpectedly; stopping", task=name)
            return TaskExitedError(f"task {name} exited unexpectedly")
        return None

    async def _stop_all(self, failure: BaseException | None) -> None:
        running = {task: name for name, task in self._tasks.items()}
        await _end(list(running), self.grace, names=running)
        for task, name in running.items():
            if failure is None and task.done() and not task.cancelled() and task.exception() is not None:
                log.error("task failed while stopping", task=name, error=repr(task.exception()))


async def _end(
    tasks: list[asyncio.Task[None]], grace: float, *, names: Mapping[asyncio.Task[None], str] | None = None
) -> None:
    """Give `tasks` `grace` seconds to finish, then cancel the rest. Cancelled while waiting (an
    outer supervisor's grace ran out first), it cancels them all before it lets go: no task
    outlives its supervisor."""
    pending = [t for t in tasks if not t.done()]
    if not pending:
        return
    try:
        _, still = await asyncio.wait(pending, timeout=grace)
    except asyncio.CancelledError:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    for task in still:
        if names is not None:
            log.warning("task did not stop in time; cancelling", task=names[task], grace_s=grace)
        task.cancel()
    await asyncio.gather(*still, return_exceptions=True)


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
