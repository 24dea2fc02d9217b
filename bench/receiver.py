"""A webhook receiver on loopback for the delivery benchmarks: a real aiohttp server that
records when it first saw each event id."""

from __future__ import annotations

import asyncio
import socket
import time

from aiohttp import web

__all__ = ["Receiver", "serve"]


class Receiver:
    """Takes single events and batches (JSON arrays) alike; answers 204."""

    def __init__(self) -> None:
        self.count = 0
        self.receipts = 0  # every event received, a copy of one already seen included
        self.ids: dict[str, float] = {}  # event id -> time.monotonic() of its first receipt
        self.done = asyncio.Event()
        self.want = 0  # set `done` once this many distinct events arrived (0: never)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        now = time.monotonic()
        for item in body if isinstance(body, list) else [body]:
            self.ids.setdefault(item["id"], now)
            self.receipts += 1
        self.count = len(self.ids)
        if self.want and self.count >= self.want:
            self.done.set()
        return web.Response(status=204)


async def serve(receiver: Receiver, port: int = 0) -> tuple[web.AppRunner, int]:
    """Serve `receiver` at POST / on 127.0.0.1:`port` (0: any free port); returns the port."""
    app = web.Application()
    app.router.add_post("/", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", port))
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]
