"""The agent's HTTP endpoints: /metrics, /healthz, /readyz and, when enabled, /inventory (aiohttp).

Safe by default: the listen address is loopback unless configured; /inventory (every pod's
devices) is off, and on only behind a bearer token or a verified client certificate. Slow and
hostile clients are bounded by `watcher.ops.connections` (deadlines and a connection cap).
/inventory's answer is serialised once per inventory version, in a thread, one serialisation at a
time however many clients ask, and written in chunks so a client never holds more than a socket
buffer's worth of it in our memory.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import resource
import socket
import ssl
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from aiohttp import web

from watcher.ops.connections import CloseReason, ConnectionGuard, ConnectionLimits
from watcher.ops.metrics import CONTENT_TYPE
from watcher.secrets import Secret, SecretError
from watcher.tls import ServerTls

__all__ = ["Document", "Health", "HttpOptions", "HttpServer", "InventoryCache", "Status"]

log = structlog.get_logger("watcher.ops.http")

# /inventory is written in pieces of this size, each after the last has drained into the socket.
WRITE_CHUNK = 64 * 1024
# Pending connections the kernel queues before we accept them (they hold no descriptor of ours),
# and the most asyncio accepts in one turn of the loop. The guard sees a connection two turns after
# it was accepted and the descriptor of one it closed is released a turn later, so while a flood
# is being accepted up to 3 x BACKLOG descriptors come on top of max_connections, for a few
# milliseconds (docs/endpoints-and-metrics.md, File descriptors).
BACKLOG = 64
# Descriptors the agent needs for itself besides HTTP connections and sinks: about 30 measured
# (outbox, inotify, the kubelet's channel, logs), with a little room (the fd budget in
# docs/endpoints-and-metrics.md).
FD_OWN = 32
# How long shutting down waits for a request in flight before cutting it off, seconds.
SHUTDOWN_S = 2.0
REALM = 'Bearer realm="pod-resources-watcher"'


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str
    details: dict[str, Any]


class Document(Protocol):
    """A version of /inventory's answer: `key` names the version, `render()` serialises it (in a thread)."""

    @property
    def key(self) -> Hashable: ...
    def render(self) -> bytes: ...


class Status(Protocol):
    """What the endpoints ask of the agent."""

    def liveness(self) -> Health: ...
    def readiness(self) -> Health: ...
    def inventory_document(self) -> Document | None: ...
    async def metrics_text(self) -> bytes: ...


@dataclass(frozen=True)
class HttpOptions:
    host: str = "127.0.0.1"
    port: int = 9108
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    inventory: bool = False
    inventory_token: Secret | None = None
    tls: ServerTls | None = None
    # What the rest of the agent needs: FD_OWN plus its sinks' (see `Agent`).
    other_descriptors: int = FD_OWN

    @property
    def client_certificates(self) -> bool:
        return self.tls is not None and self.tls.client_ca is not None


class HttpFigures(Protocol):
    """Where the server's own figures go (`watcher.ops.metrics.Metrics` is one)."""

    def http_connection_closed(self, reason: CloseReason) -> None: ...
    def http_connections_open(self, count: int) -> None: ...
    def inventory_rendered(self) -> None: ...


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, indent=2, sort_keys=True),
        content_type="application/json",
        headers=headers,
    )


class InventoryCache:
    """/inventory's bytes for the current inventory version: rendered once per version, off the event
    loop, and never twice at once (concurrent requests wait for the same rendering)."""

    def __init__(self, on_render: Callable[[], None] | None = None) -> None:
        self.key: Hashable | None = None
        self.body = b""
        self.renders = 0
        self.on_render = on_render
        self._task: asyncio.Task[tuple[Hashable, bytes]] | None = None

    async def get(self, current: Callable[[], Document | None]) -> bytes | None:
        """The current version's bytes (None: no inventory yet). A request that arrives while an
        older version is being rendered waits for it, then for at most one more rendering."""
        for attempt in range(2):
            doc = current()
            if doc is None:
                return None
            if self.key == doc.key:
                return self.body
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._render(doc))
            # Shielded: a client that gives up does not cancel what the others wait for.
            key, body = await asyncio.shield(self._task)
            if key == doc.key or attempt == 1:
                return body
        raise AssertionError("unreachable")

    async def _render(self, doc: Document) -> tuple[Hashable, bytes]:
        try:
            body = await asyncio.to_thread(doc.render)
            self.key, self.body = doc.key, body
            self.renders += 1
            if self.on_render is not None:
                self.on_render()
            return doc.key, body
        finally:
            self._task = None

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class HttpServer:
    def __init__(self, status: Status, options: HttpOptions, figures: HttpFigures | None = None) -> None:
        self.status = status
        self.options = options
        self.figures = figures
        self.bound_port: int | None = None
        self.guard = ConnectionGuard(
            options.limits,
            on_close=figures.http_connection_closed if figures is not None else None,
            on_count=figures.http_connections_open if figures is not None else None,
        )
        self.inventory = InventoryCache(figures.inventory_rendered if figures is not None else None)
        self._tls_said: str | None = None
        app = web.Application(middlewares=[self.guard.track_request])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/inventory", self._inventory)
        self.app = app

    @property
    def scheme(self) -> str:
        return "https" if self.options.tls is not None else "http"

    async def _metrics(self, _: web.Request) -> web.Response:
        body = await self.status.metrics_text()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def _health(self, health: Health) -> web.Response:
        return _json(200 if health.ok else 503, {"ok": health.ok, "reason": health.reason, **health.details})

    async def _healthz(self, _: web.Request) -> web.Response:
        # Answering at all proves the event loop is responsive.
        return self._health(self.status.liveness())

    async def _readyz(self, _: web.Request) -> web.Response:
        return self._health(self.status.readiness())

    # -- /inventory --

    def _refused(self, request: web.Request) -> web.Response | None:
        """None if the request may read /inventory, else the answer that says why not."""
        transport = request.transport
        # The handshake already refused any certificate that does not chain to the CA.
        if (
            self.options.client_certificates
            and transport is not None
            and transport.get_extra_info("peercert")
        ):
            return None
        token = self.options.inventory_token
        if token is None:
            return _json(
                403,
                {
                    "ok": False,
                    "reason": "/inventory needs a client certificate signed by the CA in "
                    "http.tls_client_ca_file",
                },
            )
        try:
            expected = token.get()
        except SecretError as err:
            log.warning("/inventory refused: its token cannot be read", error=str(err))
            return _json(
                503, {"ok": False, "reason": "the inventory token cannot be read; see the agent's log"}
            )
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected.encode()):
            return None
        challenge = REALM if not presented else f'{REALM}, error="invalid_token"'
        return _json(
            401,
            {"ok": False, "reason": "/inventory needs Authorization: Bearer with the configured token"},
            headers={"WWW-Authenticate": challenge},
        )

    async def _inventory(self, request: web.Request) -> web.StreamResponse:
        if not self.options.inventory:
            return _json(
                404,
                {
                    "ok": False,
                    "reason": "/inventory is off. It shows every pod's devices, so it needs "
                    "[http] inventory = true and either inventory_token_file (clients send "
                    "Authorization: Bearer TOKEN) or tls_client_ca_file (clients present a certificate "
                    "signed by that CA)",
                },
            )
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = await self.inventory.get(self.status.inventory_document)
        if body is None:
            return _json(503, {"ok": False, "reason": "no inventory yet: the kubelet has not answered"})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        view = memoryview(body)
        try:
            await response.prepare(request)
            # In pieces: aiohttp waits for each to drain, so a slow reader holds at most a socket
            # buffer's worth of the answer here, not a copy of all of it. A fast reader's socket
            # never makes it wait, so it also yields after each piece: sixty answers woken by one
            # rendering would otherwise be written whole, one after the other, before the loop
            # looked at anything else (a /healthz probe among them).
            for start in range(0, len(view), WRITE_CHUNK):
                await response.write(view[start : start + WRITE_CHUNK])
                await asyncio.sleep(0)
            await response.write_eof()
        except ConnectionError:
            pass  # the client left or was cut off; nothing to answer
        return response

    # -- serving --

    def _tls_context(self) -> ssl.SSLContext:
        assert self.options.tls is not None
        ctx = self.options.tls.context()
        problem = self.options.tls.last_error
        if problem != self._tls_said:
            self._tls_said = problem
            if problem is not None:
                log.warning("TLS files changed but cannot be used", error=problem)
        return ctx

    def _check_descriptors(self) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = self.options.limits.max_connections + 3 * BACKLOG + self.options.other_descriptors
        if soft != resource.RLIM_INFINITY and needed > soft:
            log.warning(
                "http.max_connections leaves too few file descriptors for the kubelet and the sinks",
                max_connections=self.options.limits.max_connections,
                open_files_limit=soft,
                needed=needed,
            )

    def serve(
        self, stop: asyncio.Event, on_bound: Callable[[int], None] | None = None
    ) -> Callable[[], Awaitable[None]]:
        async def serve_http() -> None:
            limits = self.options.limits
            runner = web.AppRunner(
                self.app,
                access_log=None,
                handle_signals=False,
                shutdown_timeout=SHUTDOWN_S,
                # aiohttp's own keep-alive timer, a backstop behind the guard's deadlines.
                keepalive_timeout=limits.idle_timeout + limits.header_timeout,
            )
            await runner.setup()
            assert runner.server is not None
            server: asyncio.Server | None = None
            try:
                self._check_descriptors()
                tls = self._tls_context if self.options.tls is not None else None
                if tls is not None:
                    tls()  # unusable files fail the start, not the first client
                # Bind ourselves so an ephemeral port (0) can be reported.
                family = socket.AF_INET6 if ":" in self.options.host else socket.AF_INET
                sock = socket.create_server(
                    (self.options.host, self.options.port), family=family, backlog=BACKLOG
                )
                self.bound_port = sock.getsockname()[1]
                server = await asyncio.get_running_loop().create_server(
                    self.guard.protocol_factory(runner.server, tls), sock=sock, backlog=BACKLOG
                )
                log.info(
                    "serving HTTP",
                    host=self.options.host,
                    port=self.bound_port,
                    scheme=self.scheme,
                    inventory=self.options.inventory,
                    max_connections=limits.max_connections,
                )
                if on_bound is not None and self.bound_port is not None:
                    on_bound(self.bound_port)
                await stop.wait()
            finally:
                if server is not None:
                    server.close()
                await runner.cleanup()
                self.guard.close_all()
                await self.inventory.close()

        return serve_http
