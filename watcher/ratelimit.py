"""Token buckets: the kubelet's limiter (in the fake) and our own cap on RPCs to it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["TokenBucket", "RateLimiter"]


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`. Pure: the clock is injected."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"need rate > 0 and burst >= 1, got rate={rate} burst={burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self) -> bool:
        """Take a token if one is there."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def wait_time(self) -> float:
        """Seconds until a token will be there (0 if one is now)."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.rate)


class RateLimiter:
    """Awaitable token bucket: callers queue in arrival order until a token is free."""

    def __init__(self, rate: float, burst: int = 1) -> None:
        self.bucket = TokenBucket(rate, burst)
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while not self.bucket.take():  # noqa: ASYNC110 - waiting on time, not on an event
                await asyncio.sleep(self.bucket.wait_time())
