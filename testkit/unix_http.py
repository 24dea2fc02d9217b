"""One HTTP request with a JSON body over a unix socket: how the tests drive the Go test peers'
control sockets (the peers serve Go's net/http there)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

__all__ = ["request"]


async def request(
    socket: Path, method: str, path: str, payload: object = None, *, timeout: float = 15.0
) -> tuple[int, Any]:
    """`method path` with `payload` as JSON (none when None); the status and the decoded JSON
    reply (None when empty)."""
    # HTTP/1.0: Go answers without chunking and closes, so reading to EOF is the whole reply.
    data = b"" if payload is None else json.dumps(payload).encode()
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        head = f"{method} {path} HTTP/1.0\r\nHost: peer\r\nContent-Length: {len(data)}\r\n"
        writer.write(head.encode() + b"Content-Type: application/json\r\n\r\n" + data)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
        await writer.wait_closed()
    header, _, body = reply.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    return status, json.loads(body) if body.strip() else None
