"""Re-query triggers: many reasons in, one debounced, coalesced wake-up out."""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["Trigger"]


class Trigger:
    """Collects reasons to re-query until the query loop takes them all at once.

    Ordinary reasons are debounced (more arriving within `debounce` seconds
    join the same re-query); urgent ones (the socket was replaced) are not.
    """

    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._urgent = False
        self._event = asyncio.Event()

    def fire(self, reason: str, *, urgent: bool = False) -> None:
        self._reasons.add(reason)
        self._urgent = self._urgent or urgent
        self._event.set()

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
        if not self._urgent and debounce > 0:
            await asyncio.sleep(debounce)
        reasons = frozenset(self._reasons)
        self._reasons.clear()
        self._urgent = False
        self._event.clear()
        return reasons
