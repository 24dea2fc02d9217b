"""A webhook receiver for the delivery benchmarks: the handler that records when it first saw each
event id, served by testkit's loopback server (`receiver.server(port)`)."""

from __future__ import annotations

import time

from aiohttp import web

from testkit.changes import Changes
from testkit.http_server import HttpServer

__all__ = ["Receiver"]


class Receiver(Changes):
    """Takes single events and batches (JSON arrays) alike; answers 204. `until(predicate, timeout)`
    checks again after each request.

    Not testkit's recording receiver: that one keeps every request whole and checks it against a
    service's rules, which would be the figure here; this one only counts ids."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.receipts = 0  # every event received, a copy of one already seen included
        self.ids: dict[str, float] = {}  # event id -> time.monotonic() of its first receipt

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        now = time.monotonic()
        for item in body if isinstance(body, list) else [body]:
            self.ids.setdefault(item["id"], now)
            self.receipts += 1
        self.count = len(self.ids)
        self.notify()
        return web.Response(status=204)

    def server(self, port: int = 0) -> HttpServer:
        """This receiver at POST / on 127.0.0.1:`port` (0: any free port); start it, or `async with`."""
        return HttpServer(self.handle, port=port)
