"""Awaiting state that this process's callbacks change: no sleeping, no polling.

A recorder (of events, deliveries, requests, a server's figures) calls `notify()` whenever it
records something; a test awaits `until(predicate)`, which checks the predicate again after each
change and fails after `timeout` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Changes"]


class Changes:
    """The signal a recorder gives on each change, and the wait on it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self, *_: object) -> None:
        """Something changed (any arguments are ignored, so this can be a callback itself)."""
        self._event.set()

    async def until(
        self,
        predicate: Callable[[], bool],
        timeout: float = 10.0,
        *,
        check: Callable[[], None] | None = None,
        describe: Callable[[], str] | None = None,
    ) -> None:
        """Until `predicate()` holds. `check` runs before each wait and may raise (a crash is
        reported as itself, not as a timeout); `describe` turns a timeout into an AssertionError
        that says what was seen."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    if check is not None:
                        check()
                    self._event.clear()
                    await self._event.wait()
        except TimeoutError:
            if describe is None:
                raise
            raise AssertionError(describe()) from None
