"""The agent's HTTP endpoints: /metrics, /healthz, /readyz and /inventory (aiohttp)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web

from watcher.ops.metrics import CONTENT_TYPE

__all__ = ["Health", "HttpServer", "Status"]

log = structlog.get_logger("watcher.ops.http")


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str
    details: dict[str, Any]


class Status(Protocol):
    """What the endpoints ask of the agent."""

    def liveness(self) -> Health: ...
    def readiness(self) -> Health: ...
    def inventory_document(self) -> dict[str, Any] | None: ...
    async def metrics_text(self) -> bytes: ...


def _json(status: int, body: Any) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body, indent=2, sort_keys=True), content_type="application/json"
    )


class HttpServer:
    def __init__(self, status: Status, host: str, port: int) -> None:
        self.status = status
        self.host = host
        self.port = port
        self.bound_port: int | None = None
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/inventory", self._inventory)
        self.app = app

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

    async def _inventory(self, _: web.Request) -> web.Response:
        doc = self.status.inventory_document()
        if doc is None:
            return _json(503, {"ok": False, "reason": "no inventory yet: the kubelet has not answered"})
        return _json(200, doc)

    def serve(
        self, stop: asyncio.Event, on_bound: Callable[[int], None] | None = None
    ) -> Callable[[], Awaitable[None]]:
        async def serve_http() -> None:
            runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
            await runner.setup()
            try:
                # Bind ourselves so an ephemeral port (0) can be reported.
                family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
                sock = socket.create_server((self.host, self.port), family=family)
                self.bound_port = sock.getsockname()[1]
                await web.SockSite(runner, sock).start()
                log.info("serving HTTP", host=self.host, port=self.bound_port)
                if on_bound is not None and self.bound_port is not None:
                    on_bound(self.bound_port)
                await stop.wait()
            finally:
                await runner.cleanup()

        return serve_http
