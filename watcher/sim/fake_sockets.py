"""How the fake kubelet puts a gRPC server's unix socket in place, as upstream's CreateListener
does for each of the kubelet's sockets: unlink the old one, listen on a temporary name in the same
directory, rename it over the path. Every start is a new file at the same path."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from grpc import aio

__all__ = ["serve_at", "temporary_name"]


def temporary_name(directory: Path) -> Path:
    """A name os.CreateTemp(dir, "") would make (digits only, created exclusively so that it is
    nobody else's), removed again for the socket to take it."""
    while True:
        tmp = directory / str(secrets.randbelow(2**32))
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            continue
        tmp.unlink()
        return tmp


def _make_room(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return temporary_name(path.parent)


async def serve_at(server: aio.Server, path: Path) -> None:
    """Start `server` on a fresh unix socket renamed into place at `path`."""
    tmp = _make_room(path)
    if server.add_insecure_port(f"unix:{tmp}") == 0:
        raise RuntimeError(f"fake kubelet could not listen on {tmp}")
    await server.start()
    os.rename(tmp, path)
