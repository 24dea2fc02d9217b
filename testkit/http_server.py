"""A real aiohttp server on loopback answering with the test's own handler.

For the receivers whose logic is the test's (a receiver that hangs, trickles, goes down and comes
back); the receivers that enforce a service's rules are in `testkit.receivers`.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Self

from aiohttp import web

__all__ = ["Handler", "HttpServer", "serve_post", "start_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def start_app(
    app: web.Application,
    *,
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 60.0,
    host: str = "127.0.0.1",
) -> tuple[web.AppRunner, int]:
    """Serve `app` on `host`:`port` (0: any free port); the runner and the port it got. `host` is
    loopback unless a test made another address (a veth to a node's network namespace).

    No access log: its lines would carry the URL, and a webhook URL carries the secret token.
    """
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True if port else None)
    await site.start()
    return runner, int(runner.addresses[0][1])


class HttpServer:
    """One handler for POST `path`, on 127.0.0.1; `await HttpServer(h).start()` or `async with`."""

    def __init__(
        self,
        handler: Handler,
        *,
        path: str = "/",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        shutdown_timeout: float = 60.0,
    ) -> None:
        self.handler = handler
        self.path = path
        self.port = port
        self.ssl_context = ssl_context
        self.shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_post(self.path, self.handler)
        self._runner, self.port = await start_app(
            app, port=self.port, ssl_context=self.ssl_context, shutdown_timeout=self.shutdown_timeout
        )
        return self

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def url(self, path: str | None = None) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.path if path is None else path}"


async def serve_post(
    handler: Handler, *, path: str = "/", ssl_context: ssl.SSLContext | None = None
) -> HttpServer:
    """A started `HttpServer` on any free port; the caller closes it."""
    return await HttpServer(handler, path=path, ssl_context=ssl_context).start()
