"""The one retry policy: exponential backoff with full jitter and a cap.

Full jitter (a uniform draw between 0 and the exponential ceiling) spreads
retries from many agents hitting one kubelet or one webhook, instead of
synchronising them into waves.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays for attempt 0, 1, 2, ...: uniform(0, min(cap, base * factor**attempt))."""

    base: float = 0.05
    factor: float = 2.0
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def ceiling(self, attempt: int) -> float:
        # min() before the power would overflow on very large attempt numbers.
        return min(self.cap, self.base * self.factor ** min(attempt, 64))

    def delay(self, attempt: int) -> float:
        return self.rng.uniform(0.0, self.ceiling(attempt))


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    attempts: int,
    backoff: Backoff,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Await `call()`, retrying up to `attempts` times in all on the given exceptions."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(attempts):
        try:
            return await call()
        except retry_on as err:
            if attempt == attempts - 1:
                raise
            wait = backoff.delay(attempt)
            if on_retry is not None:
                on_retry(attempt + 1, err, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")
