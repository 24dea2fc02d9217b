"""The one supervision module: failures go up, nothing outlives its supervisor, stop flags nest."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from watcher.app import Agent
from watcher.model.events import Event
from watcher.settings import HttpSettings, KubeletSettings, Settings
from watcher.sinks.base import Outcome
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.supervision import (
    Scope,
    StoppedError,
    Supervisor,
    TaskExitedError,
    sleep_or_stop,
    unless_stopped,
    wait_any,
)


async def test_the_first_crash_stops_the_others_and_is_reraised() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop, grace=1.0)
    stopped_cleanly = asyncio.Event()

    async def crash() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("boom")

    async def steady() -> None:
        await stop.wait()
        stopped_cleanly.set()

    supervisor.spawn("crash", crash)
    supervisor.spawn("steady", steady)
    with pytest.raises(ValueError, match="boom"):
        await supervisor.run()
    assert stop.is_set() and stopped_cleanly.is_set()


async def test_a_task_that_returns_unasked_is_a_failure() -> None:
    supervisor = Supervisor(asyncio.Event(), grace=1.0)

    async def done() -> None:
        return None

    supervisor.spawn("quitter", done)
    with pytest.raises(TaskExitedError, match="quitter exited unexpectedly"):
        await supervisor.run()


async def test_a_nested_supervisor_stops_only_its_own_tasks_and_its_failure_reaches_the_outer() -> None:
    stop = asyncio.Event()
    outer = Supervisor(stop, grace=1.0)
    inner_scope = Scope(stop)
    inner = Supervisor(inner_scope, grace=1.0)
    sibling_saw: list[bool] = []

    async def crash() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("a worker died")

    async def sibling() -> None:
        await inner_scope.wait()
        sibling_saw.append(stop.is_set())  # stopped by the inner scope, before the outer stop

    inner.spawn("worker", crash)
    inner.spawn("sibling", sibling)
    outer.spawn("delivery", inner.run)
    outer.spawn("other", stop.wait)
    with pytest.raises(ValueError, match="a worker died"):
        await outer.run()
    assert sibling_saw == [False]
    assert stop.is_set()


async def test_no_task_outlives_a_supervisor_cancelled_during_its_grace() -> None:
    """The outer grace runs out while the inner supervisor still waits for a slow task: the slow
    task is cancelled with it, not left running."""
    stop = asyncio.Event()
    outer = Supervisor(stop, grace=0.1)
    inner = Supervisor(Scope(stop), grace=30.0)
    slow_cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            slow_cancelled.set()
            raise

    inner.spawn("slow", slow)
    outer.spawn("delivery", inner.run)
    run = asyncio.create_task(outer.run())
    await asyncio.sleep(0)
    stop.set()
    async with asyncio.timeout(5):
        await run
    assert slow_cancelled.is_set()
    assert all(t.done() for t in inner.tasks.values())


async def test_retire_ends_one_task_and_the_supervisor_keeps_running() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop, grace=1.0)
    scope = Scope(stop)
    supervisor.spawn("worker", scope.wait)
    supervisor.spawn("keeper", stop.wait)
    run = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    scope.set()  # the worker ends on purpose...
    await supervisor.retire(["worker"], grace=1.0)
    assert "worker" not in supervisor.tasks and not run.done()  # ...and that is no failure
    stop.set()
    await run


async def test_unless_stopped_and_wait_any() -> None:
    stop = asyncio.Event()
    assert await unless_stopped(stop, asyncio.sleep(0, result=7)) == 7
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.sleep(30)

    waiting = asyncio.create_task(unless_stopped(stop, hang()))
    await started.wait()
    stop.set()
    with pytest.raises(StoppedError):
        await waiting
    await wait_any(asyncio.Event(), stop)  # returns at once: one is set
    await sleep_or_stop(stop, 30)  # returns at once: stop is set


class _CrashingSink:
    """A sink whose background loop dies: the agent must fail, not exit 0."""

    name = "boom"
    settings = StdoutSinkSettings(name="boom")

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        return Outcome.ok()

    def background(self) -> Callable[[], Awaitable[None]] | None:
        async def loop() -> None:
            await asyncio.sleep(0.05)
            raise ValueError("background loop died")

        return loop

    async def close(self) -> None:
        return None


async def test_a_crashed_sink_loop_makes_the_agent_fail(short_tmp: Path) -> None:
    settings = Settings(
        node="n",
        state_dir=short_tmp / "state",
        http=HttpSettings(enabled=False),
        kubelet=KubeletSettings(socket=short_tmp / "absent.sock", root_dir=short_tmp),
    )
    agent = Agent(settings, sinks=[_CrashingSink()])
    with pytest.raises(ValueError, match="background loop died"):
        async with asyncio.timeout(15):
            await agent.run()
