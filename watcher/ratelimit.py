"""Token buckets: the kubelet's limiter (in the fake) and our own cap on RPCs to it."""

from __future__ import annotations

import asyncio
import collections
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
    """At most `rate` calls in any window of one second (for rate < 1: one call per 1/rate s).

    A sliding window rather than a token bucket: a bucket lets a burst ride on top of
    the rate, and "never above the configured rate" must hold in every window.
    Callers queue in arrival order.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.capacity = max(1, int(rate))
        self.window = self.capacity / rate
        self._clock = clock
        self._recent: collections.deque[float] = collections.deque()
        self._lock = asyncio.Lock()

    def delay(self) -> float:
        """Seconds until a call may go (0: now)."""
        now = self._clock()
        while self._recent and now - self._recent[0] >= self.window:
            self._recent.popleft()
        if len(self._recent) < self.capacity:
            return 0.0
        return self.window - (now - self._recent[0])

    def refund(self, calls: int) -> None:
        """Give back the last `calls` slots: those calls never reached the server (nobody was
        listening), so they did not count against the rate this limiter protects."""
        for _ in range(min(calls, len(self._recent))):
            self._recent.pop()

    def forget(self) -> None:
        """A new server behind the socket (its kubelet restarted): the calls the old one saw do not
        count against the new one's limit, which starts full. Its first re-query goes at once
        instead of waiting out the slots the dying kubelet's last answers took."""
        self._recent.clear()

    def answered(self, calls: int) -> None:
        """The last `calls` calls were answered just now. Their slots count from now rather than
        from when they were taken: the server saw them somewhere in between (later, when the loop
        was busy), and only the later time keeps every window of one second at the server, not
        just ours, within the rate. Callers take, call and report one batch at a time."""
        now = self._clock()
        count = min(calls, len(self._recent))
        for _ in range(count):
            self._recent.pop()
        self._recent.extend([now] * count)

    def answered_slot(self, slot: float) -> None:
        """The call that took `slot` (what `acquire` returned) was answered just now: that slot, and
        no other, counts from now. For callers with calls in flight together, where `answered`
        would move the newest slot, not the answered call's, and leave a slow call's slot at its
        send time (22e5d77 made slots count from answers; this keeps that true under concurrency).
        A slot already gone (its window passed, refunded, forgotten) moves nothing."""
        try:
            self._recent.remove(slot)
        except ValueError:
            return
        self._recent.append(self._clock())  # no slot is later than now: the deque stays in order

    async def acquire(self) -> float:
        """Wait for a slot and take it; the slot's time, for `answered_slot`."""
        async with self._lock:
            while (wait := self.delay()) > 0:  # noqa: ASYNC110 - waiting on time, not on an event
                await asyncio.sleep(wait)
            slot = self._clock()
            self._recent.append(slot)
            return slot
