"""Per-method faults of the fake kubelet, as a real one shows them: a method disabled by its
feature gate (UNKNOWN "... disabled"), one the kubelet is too old for (UNIMPLEMENTED), a hung
method (a delay), and bytes that are not protobuf (a broken or foreign server)."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio

__all__ = ["METHODS", "SERVICE", "MethodFaults"]

METHODS = ("List", "GetAllocatableResources", "Get")
SERVICE = "v1.PodResourcesLister"
# What a real kubelet answers for a disabled method (List cannot be disabled on a real one).
DISABLED_TEXTS = {
    "GetAllocatableResources": "Pod Resources API GetAllocatableResources disabled",
    "Get": "PodResources API Get method disabled",
    "List": "PodResources API List disabled",
}
GARBAGE = b"\xff\xff\xff\xff garbage, not a protobuf message"


def _method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return method


class MethodFaults:
    """What is wrong with each method, set from tests and applied to every call."""

    def __init__(self) -> None:
        self.disabled: set[str] = set()
        self.absent: set[str] = set()
        self.delays: dict[str, float] = {}
        self.garbage: set[str] = set()
        self.substitutions: list[tuple[bytes, bytes]] = []  # applied to every answer's bytes
        self.held = 0  # calls a delay is holding now

    def disable(self, method: str) -> None:
        """Feature gate off: the method answers UNKNOWN "... disabled"."""
        self.disabled.add(_method(method))

    def make_absent(self, method: str) -> None:
        """A kubelet older than the method: UNIMPLEMENTED."""
        self.absent.add(_method(method))

    def enable(self, method: str) -> None:
        self.disabled.discard(method)
        self.absent.discard(method)
        self.garbage.discard(method)

    def answer_garbage(self, method: str) -> None:
        """Answer the method with bytes that do not parse."""
        self.garbage.add(_method(method))

    def set_delay(self, method: str, seconds: float) -> None:
        """Make the method take `seconds` before answering (a hung kubelet)."""
        self.delays[_method(method)] = seconds

    async def before_limiter(self, method: str, context: aio.ServicerContext[bytes, bytes]) -> None:
        """A method the kubelet predates: gRPC answers UNIMPLEMENTED before the rate limiter runs,
        so the call spends no token."""
        if method in self.absent:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method} for service {SERVICE}"
            )

    async def before_answer(self, method: str, context: aio.ServicerContext[bytes, bytes]) -> None:
        """Past the limiter: a disabled method answers UNKNOWN; a hung one holds the call."""
        if method in self.disabled:
            await context.abort(grpc.StatusCode.UNKNOWN, DISABLED_TEXTS[method])
        delay = self.delays.get(method, 0.0)
        if delay > 0:
            self.held += 1
            try:
                await asyncio.sleep(delay)
            finally:
                self.held -= 1

    def substitute(self, old: bytes, new: bytes) -> None:
        """Put `new` where `old` stands in every answer, e.g. bytes that are not UTF-8 into a
        device id (keep the length, so the message stays well-formed)."""
        if len(old) != len(new):
            raise ValueError("a substitution must keep the length")
        self.substitutions.append((old, new))

    def answer(self, method: str, data: bytes) -> bytes:
        """The bytes that go on the wire for `data`."""
        if method in self.garbage:
            return GARBAGE
        for old, new in self.substitutions:
            data = data.replace(old, new)
        return data
