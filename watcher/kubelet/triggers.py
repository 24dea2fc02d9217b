"""Re-query triggers: many reasons in, one debounced, coalesced wake-up out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

__all__ = ["GATHER_MOST", "Trigger"]

# A gathering reason waits for a quiet moment at most this many of its quiet periods.
GATHER_MOST = 5


class Trigger:
    """Collects reasons to re-query until the query loop takes them all at once.

    Ordinary reasons are debounced (more arriving within `debounce` seconds
    join the same re-query); urgent ones (the socket was replaced) are not. A
    reason in `gather` (seconds) comes in bursts that belong together (a DRA
    driver's verdict reaching many pods' statuses one after another): the
    re-query waits until nothing more has come for that long, at most
    GATHER_MOST times that, unless an urgent reason that does not gather came too.
    """

    def __init__(self, gather: Mapping[str, float] | None = None) -> None:
        self.gather = dict(gather or {})
        self._reasons: set[str] = set()
        self._urgent = False
        self._immediate = False  # an urgent reason that does not gather
        self._fired = 0  # fires so far: a gathering wait ends when none came during its quiet
        self._event = asyncio.Event()
        self._now = asyncio.Event()  # set by an urgent reason that does not gather: ends a gather

    def fire(self, reason: str, *, urgent: bool = False) -> None:
        self._reasons.add(reason)
        self._urgent = self._urgent or urgent
        self._immediate = self._immediate or (urgent and self.gather.get(reason, 0.0) <= 0)
        self._fired += 1
        self._event.set()
        if self._immediate:
            self._now.set()

    async def _gathered(self, quiet: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + quiet * GATHER_MOST
        while not self._immediate:
            seen = self._fired
            left = end - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._now.wait(), min(quiet, left))
            if self._fired == seen:
                return

    @staticmethod
    def _loop_time(monotonic_deadline: float) -> float:
        # asyncio's clock is time.monotonic on every platform we run on; convert anyway.
        return asyncio.get_running_loop().time() + (monotonic_deadline - time.monotonic())

    async def wait(self, until: float | None, debounce: float) -> frozenset[str]:
        """The reasons gathered, or an empty set when the monotonic time `until` passes first."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(None if until is None else self._loop_time(until)):
                    await self._event.wait()
        if not self._event.is_set():
            return frozenset()
        quiet = max((self.gather.get(r, 0.0) for r in self._reasons), default=0.0)
        if quiet > 0 and not self._immediate:
            await self._gathered(quiet)
        elif not self._urgent and debounce > 0:
            await asyncio.sleep(debounce)
        reasons = frozenset(self._reasons)
        self._reasons.clear()
        self._urgent = self._immediate = False
        self._event.clear()
        self._now.clear()
        return reasons
