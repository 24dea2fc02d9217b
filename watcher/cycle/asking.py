"""Asking the kubelet for one cycle: both calls under our rate cap, given up at once when the
socket is replaced while they are in flight.

A kubelet restarting with its socket renamed in place stops its old server and starts the new one
within milliseconds. A call begun on the old one (the Pods API stream's end asks at once) is then
carried over by gRPC to whatever listens at the path, through its reconnect backoff: hundreds of
milliseconds, for an answer the cycle would drop anyway (it may be the new kubelet's warm-up with
its restart unseen). Cancelled instead, the next cycle sees the restart and asks the new kubelet
on a fresh channel straight away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from watcher import errors
from watcher.kubelet.client import PodResourcesClient
from watcher.ratelimit import RateLimiter

__all__ = ["Replaced", "query_answers", "unless_replaced"]

T = TypeVar("T")

# Calls that reached no kubelet: no socket, or nobody listening on it.
_UNANSWERED = (errors.KubeletUnavailableError, errors.SocketMissingError)


class Replaced:
    """What `unless_replaced` gives when the socket was replaced first."""


async def unless_replaced(call: Awaitable[T], replaced: Callable[[], Awaitable[None]]) -> T | Replaced:
    """`call`'s result, or Replaced (the call cancelled) if `replaced()` returns first."""
    asking = asyncio.ensure_future(call)
    watching = asyncio.ensure_future(replaced())
    try:
        await asyncio.wait((asking, watching), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the cycle itself is cancelled (the agent stops): no call left behind
        asking.cancel()
        raise
    finally:
        watching.cancel()
    if asking.done():
        return asking.result()
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    return Replaced()


async def query_answers(
    client: PodResourcesClient, limiter: RateLimiter, *, with_allocatable: bool
) -> tuple[bytes | None, bytes, str | None]:
    """(GetAllocatableResources' bytes, None if not asked or not served; List's bytes; why
    GetAllocatableResources is not served, if it answered so). A failure is raised, List's first:
    it says more about the kubelet than the other's."""
    calls = [client.list_raw]
    if with_allocatable:
        calls.append(client.allocatable_raw)
    for _ in calls:
        await limiter.acquire()
    results = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    # Calls nobody answered (the kubelet is down, its socket stale) did not reach its rate
    # limiter, so they do not spend ours: the re-query its return asks for goes at once.
    unanswered = sum(isinstance(r, _UNANSWERED) for r in results)
    limiter.refund(unanswered)
    limiter.answered(len(results) - unanswered)
    pods, alloc = results[0], results[1] if len(results) > 1 else None
    not_served = None
    if isinstance(alloc, errors.MethodDisabledError | errors.MethodNotImplementedError):
        not_served, alloc = str(alloc), None
    for result in (pods, alloc):
        if isinstance(result, BaseException):
            raise result
    assert isinstance(pods, bytes)
    assert alloc is None or isinstance(alloc, bytes)
    return alloc, pods, not_served
