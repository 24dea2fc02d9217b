"""Re-query triggers: a burst of a gathering reason is one wake-up; an urgent reason never waits."""

from __future__ import annotations

import asyncio

from watcher.kubelet.triggers import GATHER_MOST, Trigger

QUIET = 0.05


async def test_a_burst_of_a_gathering_reason_is_one_wake_up_after_it_goes_quiet() -> None:
    trigger = Trigger({"pod-status": QUIET})
    loop = asyncio.get_running_loop()

    async def burst() -> None:
        for _ in range(5):
            trigger.fire("pod-status", urgent=True)
            await asyncio.sleep(QUIET / 3)  # each within the quiet period of the one before

    started = loop.time()
    task = asyncio.create_task(burst())
    reasons = await trigger.wait(None, debounce=0.0)
    waited = loop.time() - started
    await task
    assert reasons == {"pod-status"}
    # It waited for the last one and a quiet period after it: none of the burst is left over.
    assert waited >= 4 * QUIET / 3 + QUIET * 0.9
    assert await _nothing_pending(trigger)


async def test_a_gathering_wait_is_bounded_however_long_the_burst() -> None:
    trigger = Trigger({"pod-status": QUIET})
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def endless() -> None:
        while not stop.is_set():
            trigger.fire("pod-status", urgent=True)
            await asyncio.sleep(QUIET / 5)

    task = asyncio.create_task(endless())
    started = loop.time()
    await trigger.wait(None, debounce=0.0)
    waited = loop.time() - started
    stop.set()
    await task
    assert waited < QUIET * GATHER_MOST + 0.1


async def test_an_urgent_reason_that_does_not_gather_is_not_held_by_one_that_does() -> None:
    trigger = Trigger({"pod-status": 10.0})
    trigger.fire("pod-status", urgent=True)
    trigger.fire("socket", urgent=True)
    reasons = await asyncio.wait_for(trigger.wait(None, debounce=0.0), timeout=1.0)
    assert reasons == {"pod-status", "socket"}


async def _nothing_pending(trigger: Trigger) -> bool:
    """Whether a wait now finds nothing (it returns empty at once with a deadline in the past)."""
    return await trigger.wait(0.0, debounce=0.0) == frozenset()


async def test_an_urgent_reason_during_a_gather_ends_it_at_once() -> None:
    trigger = Trigger({"pod-status": 2.0})
    loop = asyncio.get_running_loop()
    trigger.fire("pod-status", urgent=True)
    started = loop.time()
    loop.call_later(0.05, lambda: trigger.fire("socket", urgent=True))
    reasons = await trigger.wait(None, debounce=0.0)
    assert reasons == {"pod-status", "socket"} and loop.time() - started < 0.5
