"""Free loopback ports for the servers the tests and benchmarks start."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _worker_share(start: int, end: int) -> tuple[int, int]:
    """This pytest-xdist worker's own slice of [start, end) (the whole of it outside xdist): a port
    one worker picked and released before its server bound it is never another worker's pick."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count < 2:
        return start, end
    size = (end - start) // count
    index = int(worker[2:]) % count
    return start + index * size, start + (index + 1) * size


def free_port() -> int:
    """A loopback TCP port free right now, below the kernel's ephemeral range.

    Not a port the kernel hands out (binding port 0): while a server is down, the others keep
    dialling its ports, and a dial to a local port in the ephemeral range can connect to itself
    (TCP self-connect), so the port is taken when the server comes back.
    """
    start, end = _worker_share(10000, max(10001, _ephemeral_range()[0]))
    for _ in range(1000):
        port = random.randrange(start, end)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")
