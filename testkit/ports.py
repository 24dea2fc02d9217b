"""Free loopback ports for the servers the tests and benchmarks start."""

from __future__ import annotations

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


def free_port() -> int:
    """A loopback TCP port free right now, below the kernel's ephemeral range.

    Not a port the kernel hands out (binding port 0): while a server is down, the others keep
    dialling its ports, and a dial to a local port in the ephemeral range can connect to itself
    (TCP self-connect), so the port is taken when the server comes back.
    """
    low, _ = _ephemeral_range()
    for _ in range(1000):
        port = random.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")
