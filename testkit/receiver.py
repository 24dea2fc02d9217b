"""The machinery of the sink tests' receivers (`testkit.receivers`): a real aiohttp server on
127.0.0.1 with an ephemeral port that records every request (raw body, headers, monotonic and wall
arrival time), what it answered and every rule the request broke, and can be scripted with forced
responses that it returns, in order, before its normal behaviour. `wait_for(n)` awaits "n requests
received" without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from testkit.changes import Changes
from testkit.http_server import start_app

__all__ = ["MAX_REQUEST_BYTES", "Forced", "Received", "Receiver", "json_body"]

MAX_REQUEST_BYTES = 8 * 1024 * 1024  # above PagerDuty's 512 KB, so we answer 400, not aiohttp's 413


@dataclass(frozen=True)
class Forced:
    """A scripted answer. `hang` holds the request until the receiver closes (a dead peer)."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str = ""
    hang: bool = False


@dataclass
class Received:
    """One request, what we answered, and every rule it broke."""

    index: int
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # time.monotonic() on arrival
    wall: float  # time.time() on arrival
    status: int = 0
    reason: str = ""  # why the answer was not a success: forced, a violation, rate limited
    forced: bool = False
    violations: list[str] = field(default_factory=list)
    parsed: Any = None  # the JSON body, when it is JSON
    cloudevents: list[Any] = field(default_factory=list)  # CloudEventSeen, from the webhook receiver

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300 and not self.violations

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """The shared machinery; subclasses implement `inspect` (stateless checks) and `answer`."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._forced: deque[Forced] = deque()
        self._changes = Changes()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        # Set before start() to serve HTTPS, or on another address than loopback (one a test made).
        self.ssl_context: ssl.SSLContext | None = None
        self.host = "127.0.0.1"

    # -- lifecycle --

    async def start(self) -> Self:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, self.port = await start_app(app, ssl_context=self.ssl_context, host=self.host)
        return self

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def url(self, path: str = "/") -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}{path}"

    # -- scripting --

    def force(
        self,
        status: int,
        headers: Mapping[str, str] | None = None,
        body: str = "",
        *,
        times: int = 1,
        hang: bool = False,
    ) -> None:
        """Answer the next `times` requests with this, before the normal behaviour."""
        for _ in range(times):
            self._forced.append(Forced(status, dict(headers or {}), body, hang))

    def clear_forced(self) -> None:
        self._forced.clear()

    # -- what was received --

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.requests if r.accepted]

    @property
    def rejected(self) -> list[Received]:
        return [r for r in self.requests if not r.accepted]

    @property
    def violations(self) -> list[str]:
        return [f"#{r.index} {v}" for r in self.requests for v in r.violations]

    async def wait_for(
        self, what: int | Callable[[list[Received]], bool], timeout: float = 10.0
    ) -> list[Received]:
        """Until `what` requests have arrived (or the predicate holds over all requests)."""
        predicate = (lambda rs: len(rs) >= what) if isinstance(what, int) else what

        def seen() -> str:
            got = [(r.status, r.reason, r.violations) for r in self.requests]
            return f"{type(self).__name__}: condition not met within {timeout:g} s; received {got}"

        await self._changes.until(lambda: predicate(self.requests), timeout, describe=seen)
        return list(self.requests)

    async def wait_accepted(self, n: int, timeout: float = 10.0) -> list[Received]:
        await self.wait_for(lambda rs: sum(r.accepted for r in rs) >= n, timeout)
        return self.accepted

    # -- the handler --

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        rec = Received(
            index=len(self.requests),
            method=request.method,
            path=request.path_qs,
            headers=headers,
            body=body,
            at=time.monotonic(),
            wall=time.time(),
        )
        if request.method != "POST":
            rec.violations.append(f"method {request.method}: only POST is accepted")
        self.inspect(rec)
        if self._forced:
            forced = self._forced.popleft()
            rec.forced = True
            status, out_headers, text = forced.status, dict(forced.headers), forced.body
            rec.reason = f"forced {status}"
        else:
            forced = None
            status, out_headers, text = self.answer(rec)
            if not 200 <= status < 300 and not rec.reason:
                rec.reason = "; ".join(rec.violations) or f"answered {status}"
        rec.status = status
        self.requests.append(rec)
        self._changes.notify()
        if forced is not None and forced.hang:
            await self._release.wait()
        return web.Response(status=status, headers=out_headers, text=text)

    def inspect(self, rec: Received) -> None:
        """Parse and check `rec` (no state changes): fill rec.parsed and rec.violations."""

    def answer(self, rec: Received) -> tuple[int, dict[str, str], str]:
        """The normal answer to an inspected request (may change the receiver's state)."""
        if rec.violations:
            return 400, {}, rec.violations[0]
        return 200, {}, ""


def json_body(rec: Received, *, bad: str) -> Any:
    if not rec.headers.get("content-type", "").startswith("application/json"):
        rec.violations.append(f"{bad}: Content-Type {rec.headers.get('content-type')!r} is not JSON")
    try:
        rec.parsed = json.loads(rec.body)
    except (UnicodeDecodeError, ValueError) as err:
        rec.violations.append(f"{bad}: body is not JSON ({err})")
        return None
    return rec.parsed
