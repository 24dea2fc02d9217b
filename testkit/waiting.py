"""Waiting on what another process changes: its files, its logs, its port.

There is nothing to await there, so this polls, briefly and with a deadline. State this process
changes has a callback or an event to await instead (`testkit.changes`): do not poll that.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

__all__ = ["wait_until"]


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "",
) -> None:
    """Until `predicate()` (a plain or an async callable) is true; AssertionError after `timeout` s."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                held = predicate()
                if inspect.isawaitable(held):
                    held = await held
                if held:
                    return
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"not true within {timeout:g} s: {what or _name(predicate)}") from None


def _name(predicate: Callable[..., object]) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))
