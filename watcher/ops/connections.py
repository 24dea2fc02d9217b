"""The HTTP server's connections, bounded: deadlines for slow clients and a cap on how many are open.

Every connection is in one of three states, each with its own deadline:

- `headers`: opened (the TLS handshake included), or the first byte of a next request arrived; the
  request's headers must be complete within `header_timeout`. Bytes trickling in do NOT extend it:
  that is how a slow client that sends one header byte every few seconds (slowloris) is shut out.
- `request`: the headers are in; the answer must be written to its last byte within
  `request_timeout` (a client that reads a large answer very slowly is cut off).
- `idle`: answered and kept alive; a next request must start within `idle_timeout`.

At most `max_connections` are open. The next one is always accepted, and makes room by closing the
connection that has waited longest in `headers` or `idle` (no request in flight); only if every
connection has a request in flight is the longest-running request cut off. So a fresh /healthz always
gets in, and the file descriptors the server holds stay at the cap (plus its listening socket, and
for a few milliseconds while a flood is accepted, what asyncio accepts before the guard sees it:
see BACKLOG in `watcher.ops.http`), whatever clients do, which keeps descriptors for the kubelet's
socket and the sinks.

aiohttp is left to parse HTTP. `ConnectionGuard.protocol_factory` wraps its protocol in
`GuardedProtocol`, which sees each connection from the moment it is accepted (before any TLS
handshake, which it starts itself with `loop.start_tls`, so a handshake counts against the cap and the
header deadline too); `track_request` (an aiohttp middleware) marks when headers are complete and when
the answer has been written.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import structlog
from aiohttp import web

__all__ = ["CloseReason", "ConnectionGuard", "ConnectionLimits", "GuardedProtocol"]

log = structlog.get_logger("watcher.ops.connections")

CloseReason = Literal["header_timeout", "request_timeout", "idle_timeout", "evicted", "tls_handshake"]
State = Literal["headers", "request", "idle"]
_TIMEOUT_REASON: dict[State, CloseReason] = {
    "headers": "header_timeout",
    "request": "request_timeout",
    "idle": "idle_timeout",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 100
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    request_timeout: float = 60.0

    def deadline(self, state: State) -> float:
        if state == "headers":
            return self.header_timeout
        return self.request_timeout if state == "request" else self.idle_timeout


class GuardedProtocol(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol and keeps its state and deadline."""

    def __init__(
        self,
        guard: ConnectionGuard,
        inner: asyncio.Protocol,
        tls: Callable[[], ssl.SSLContext] | None,
    ) -> None:
        self.guard = guard
        self.inner = inner
        self.tls = tls
        self.raw: asyncio.Transport | None = None
        self.state: State = "headers"
        self.since = 0.0  # loop time the current state began
        self.connected = False  # aiohttp's protocol has its transport
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        # Decrypted bytes that arrive with the end of the handshake, before start_tls returns.
        self._early: list[bytes] = []
        self._early_eof = False
        # Bytes received since the last end of a header block (CRLF CRLF), and the last three
        # bytes seen (an end may straddle two reads): non-zero after an answer means a next
        # request has begun, pipelined behind it, perhaps in the very same read.
        self._after_headers = 0
        self._tail = b""

    # -- state --

    def enter(self, state: State) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self.state = state
        self.since = loop.time()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self.since + self.guard.limits.deadline(state), self._expired)

    def _expired(self) -> None:
        self._timer = None
        self.close(_TIMEOUT_REASON[self.state])

    def close(self, reason: CloseReason) -> None:
        """Close now (abort: nothing buffered is worth keeping a descriptor for) and count why."""
        if self.closed:
            return
        self.guard.closed(self, reason)
        if self.raw is not None:
            self.raw.abort()

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        self.guard.opened(self)
        self.enter("headers")
        if self.tls is None:
            self._connect_inner(transport)
            return
        # Nothing may be read before start_tls takes the transport over: the ClientHello would be lost.
        transport.pause_reading()
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls(self.tls))

    async def _start_tls(self, tls: Callable[[], ssl.SSLContext]) -> None:
        assert self.raw is not None
        loop = asyncio.get_running_loop()
        try:
            # The handshake's own timeout is the backstop; the header deadline normally ends it first.
            app = await loop.start_tls(
                self.raw,
                self,
                tls(),
                server_side=True,
                ssl_handshake_timeout=self.guard.limits.header_timeout + 1,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, ValueError) as err:
            log.debug("TLS handshake failed", error=repr(err))
            self.close("tls_handshake")
            return
        if not self.closed and isinstance(app, asyncio.Transport):
            self._connect_inner(app)

    def _connect_inner(self, transport: asyncio.Transport) -> None:
        self.connected = True
        self.guard.attach(self)
        self.inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.inner.data_received(data)
        if self._early_eof:
            self.inner.eof_received()

    def answered(self) -> None:
        """The answer is written: wait for the next request, or for the rest of its headers if
        it has begun (else a pipelined, never-finished request would get idle_timeout instead
        of header_timeout). Our endpoints take no request body, so bytes after a header block
        are a next request; a body would only make the wait the shorter of the two."""
        self.enter("headers" if self._after_headers else "idle")

    def _scan(self, data: bytes) -> None:
        joined = self._tail + data
        end = joined.rfind(b"\r\n\r\n")
        self._after_headers = len(joined) - end - 4 if end >= 0 else self._after_headers + len(data)
        self._tail = joined[-3:]

    def data_received(self, data: bytes) -> None:
        if self.state == "idle" and data:
            self.enter("headers")  # the next request has begun: its headers have header_timeout
        self._scan(data)
        if self.connected:
            self.inner.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self.connected:
            return self.inner.eof_received()
        self._early_eof = True
        return True  # keep the transport: the handshake's end decides

    def pause_writing(self) -> None:
        if self.connected:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.connected:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._handshake is not None and not self._handshake.done():
            self._handshake.cancel()
        self.guard.closed(self, None)
        if self.connected:
            self.connected = False
            self.inner.connection_lost(exc)


class ConnectionGuard:
    """The open connections, their deadlines and the cap; figures for /metrics through `on_close`."""

    def __init__(
        self,
        limits: ConnectionLimits,
        *,
        on_close: Callable[[CloseReason], None] | None = None,
        on_count: Callable[[int], None] | None = None,
    ) -> None:
        self.limits = limits
        self.on_close = on_close
        self.on_count = on_count
        # Insertion order is acceptance order; a dict keeps removal O(1).
        self.connections: dict[GuardedProtocol, None] = {}
        self.by_inner: dict[asyncio.BaseProtocol, GuardedProtocol] = {}
        self.high_water = 0  # most connections ever open at once

    def protocol_factory(
        self, inner: Callable[[], asyncio.Protocol], tls: Callable[[], ssl.SSLContext] | None = None
    ) -> Callable[[], GuardedProtocol]:
        """What `loop.create_server` calls for each accepted connection."""
        return lambda: GuardedProtocol(self, inner(), tls)

    # -- bookkeeping --

    def opened(self, conn: GuardedProtocol) -> None:
        self.connections[conn] = None
        self.high_water = max(self.high_water, len(self.connections))
        while len(self.connections) > self.limits.max_connections:
            self._evict(spare=conn)
        self._count()

    def attach(self, conn: GuardedProtocol) -> None:
        self.by_inner[conn.inner] = conn

    def closed(self, conn: GuardedProtocol, reason: CloseReason | None) -> None:
        """`reason`: why we close it (counted), or None when it is gone (the peer, or after our abort)."""
        if not conn.closed and reason is not None:
            conn.closed = True
            if self.on_close is not None:
                self.on_close(reason)
        conn.closed = True
        if conn in self.connections:
            del self.connections[conn]
            self.by_inner.pop(conn.inner, None)
            self._count()

    def _evict(self, spare: GuardedProtocol) -> None:
        others = [c for c in self.connections if c is not spare]
        waiting = [c for c in others if c.state != "request"]
        victim = min(waiting or others, key=lambda c: c.since)
        victim.close("evicted")

    def _count(self) -> None:
        if self.on_count is not None:
            self.on_count(len(self.connections))

    def close_all(self) -> None:
        """At shutdown, after aiohttp has finished what it could: whatever is left (a TLS handshake,
        say) is cut off, and not counted as closed for a reason."""
        for conn in list(self.connections):
            self.closed(conn, None)
            if conn.raw is not None:
                conn.raw.abort()

    # -- requests --

    @web.middleware
    async def track_request(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Headers complete -> `request`; the answer written to its last byte -> `idle`.

        The answer is written here rather than by aiohttp after the middleware returns, so the
        request deadline covers the writing and a connection is never `idle` while its answer is
        still going out (aiohttp then finds it written and sends nothing more).
        """
        conn = self.by_inner.get(request.protocol)
        if conn is not None:
            conn.enter("request")
        try:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # a 404 or 405 from the router: written the same way
                await _send(request, exc)
                raise
            await _send(request, response)
            return response
        finally:
            if conn is not None:
                conn.answered()


async def _send(request: web.Request, response: web.StreamResponse) -> None:
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        # The client went away or its connection was cut off (a deadline, the cap): aiohttp sees
        # the closed transport and drops the request quietly.
        pass
