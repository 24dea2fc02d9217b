"""Our cap on RPCs to the kubelet: at most `rate` calls in any second, as the kubelet sees them."""

from __future__ import annotations

from watcher.ratelimit import RateLimiter


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_full_window_waits_a_second_from_the_first_call() -> None:
    clock = _Clock()
    limiter = RateLimiter(5, clock=clock)
    for _ in range(5):
        await limiter.acquire()
    assert limiter.delay() == 1.0
    clock.now += 0.4
    assert abs(limiter.delay() - 0.6) < 1e-9


async def test_answered_calls_count_from_their_answer_so_the_servers_window_holds_too() -> None:
    # Taken at 100.0, answered at 100.3: the server may have seen them as late as 100.3, so the
    # next call must not go before 101.3, or a second at the server would hold six.
    clock = _Clock()
    limiter = RateLimiter(5, clock=clock)
    for _ in range(5):
        await limiter.acquire()
    clock.now += 0.3
    limiter.answered(5)
    clock.now += 0.7  # 100.0 + 1.0: the window since they were taken is over, not since answered
    assert abs(limiter.delay() - 0.3) < 1e-9
    clock.now += 0.3
    assert limiter.delay() == 0.0


async def test_a_slow_call_among_others_in_flight_counts_from_its_own_answer() -> None:
    # Two calls in flight together: the first (taken at 100.0) is answered last, at 100.5. Its slot
    # must move to 100.5, not the second's: the server may have seen it then, so the window that
    # lets a third call go ends at 101.5 for it. `answered(1)` would have moved the newest slot.
    clock = _Clock()
    limiter = RateLimiter(2, clock=clock)
    slow = await limiter.acquire()
    clock.now += 0.1
    fast = await limiter.acquire()
    clock.now += 0.1
    limiter.answered_slot(fast)  # 100.2
    clock.now += 0.3
    limiter.answered_slot(slow)  # 100.5
    clock.now = 101.25  # the fast one's window is over, the slow one's is not
    assert limiter.delay() == 0.0
    await limiter.acquire()
    assert abs(limiter.delay() - 0.25) < 1e-9  # until 101.5, the slow call's answer plus 1 s
    limiter.answered_slot(slow)  # answered again (or already gone): moves nothing
    assert abs(limiter.delay() - 0.25) < 1e-9


async def test_refunded_calls_free_their_slots_and_answered_counts_only_what_is_held() -> None:
    clock = _Clock()
    limiter = RateLimiter(2, clock=clock)
    await limiter.acquire()
    await limiter.acquire()
    limiter.refund(1)  # nobody was listening: it never reached the server
    assert limiter.delay() == 0.0
    limiter.answered(5)  # more than it holds: the one it holds
    await limiter.acquire()
    assert limiter.delay() == 1.0


async def test_a_new_kubelet_starts_with_a_full_budget() -> None:
    # The calls the old kubelet answered count against its limiter, which died with it.
    clock = _Clock()
    limiter = RateLimiter(5, clock=clock)
    for _ in range(5):
        await limiter.acquire()
    limiter.answered(5)
    assert limiter.delay() == 1.0
    limiter.forget()
    assert limiter.delay() == 0.0
    for _ in range(5):
        await limiter.acquire()
    assert limiter.delay() == 1.0  # and the new one's window holds as before
