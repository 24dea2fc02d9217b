"""Held ends, kept: a sink's held resolves in its durable state, and the timer that tells each one
when it is due (the sink's background loop, which the dispatcher supervises).

The held ends live in the outbox's key-value table, written before the event that ended the
condition is acknowledged, and their due times are boot-clock readings: an agent restarted during
a hold-down tells the end when it was due, once (it is dropped from the table only after the sink
told it, or the receiver refused it for good). The sink's `deliver` and the timer both change the
sink's state, so both hold `lock` while they do.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import structlog

from watcher.backoff import Backoff
from watcher.bootclock import boot_clock
from watcher.model.hold_down import HeldEnd, HeldEnds
from watcher.sinks.base import KeyValue, Outcome
from watcher.supervision import wait_any

__all__ = ["HeldStore", "Tell", "HOLD_DOWN_DOC"]

log = structlog.get_logger("watcher.sinks.hold_down")

# What telling one held end does: the sink sends it and updates its own state (its open keys).
Tell = Callable[[str, HeldEnd], Awaitable[Outcome]]

HOLD_DOWN_DOC = (
    "Seconds the end of a condition waits before it is sent; failing again within it keeps the "
    "same incident open (a flapping device is one page). 60 s, the usual flap-suppression / "
    "resolve-timeout default of on-call tools: longer than a device's flaps, short against a "
    "responder's reaction time. 0: resolve at once."
)


class HeldStore:
    """One sink's held ends, under `key` in its durable state."""

    def __init__(
        self,
        store: KeyValue,
        key: str,
        hold_down: float,
        *,
        sink: str,
        clock: Callable[[], tuple[str, float]] = boot_clock,
        retry_cap: float = 300.0,
    ) -> None:
        self.store = store
        self.key = key
        self.hold_down = hold_down
        self.sink = sink
        self.clock = clock
        self.lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._backoff = Backoff(base=0.5, cap=retry_cap, rng=random.Random())

    async def load(self) -> HeldEnds:
        return HeldEnds.from_json(await self.store.kv_get(self.key))

    async def save(self, held: HeldEnds) -> None:
        await self.store.kv_set(self.key, held.to_json())
        self._wake.set()  # the timer looks again: a new end may be due first

    async def run(self, tell: Tell) -> None:
        """Tell each held end when it is due, forever; a failed one is tried again after a backoff
        (a failing disk or receiver never stops the agent)."""
        failures = 0
        while True:
            self._wake.clear()
            try:
                wait = await self._tell_due(tell)
                if wait is not None and wait < 0:  # one failed: retry after the backoff
                    wait = self._backoff.delay(failures)
                    failures += 1
                else:
                    failures = 0
            except Exception as err:  # the outbox is being reopened, or its disk failed
                log.error("could not send the held resolves; will retry", sink=self.sink, error=repr(err))
                wait = self._backoff.delay(failures)
                failures += 1
            await wait_any(self._wake, within=wait)

    async def _tell_due(self, tell: Tell) -> float | None:
        """Tell what is due; seconds until the next one (None: nothing held; -1: one failed)."""
        async with self.lock:
            boot, now = self.clock()
            stored = await self.load()
            held = stored.rebased(now=now, boot=boot, hold_down=self.hold_down)
            if held != stored:
                await self.store.kv_set(self.key, held.to_json())
            for key, end in held.due(now):
                outcome = await tell(key, end)
                if not outcome.delivered and (outcome.retry or outcome.gone):
                    log.warning(
                        "a held resolve failed; will retry",
                        sink=self.sink,
                        status=outcome.status,
                        error=outcome.error,
                    )
                    return -1.0
                held = held.cancel(key)  # told, or refused for good (the sink logged it)
                await self.store.kv_set(self.key, held.to_json())
            due = held.next_due()
            return None if due is None else max(0.0, due - now)
