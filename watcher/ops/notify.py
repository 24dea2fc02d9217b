"""systemd's readiness protocol: tell the service manager when the agent is ready, reloading, stopping.

With `Type=notify` systemd holds `systemctl reload` (our SIGHUP) until READY=1
has arrived, so a reload can never reach a process that is still importing,
and `systemctl status` shows what the agent is doing. The protocol is one
datagram on the unix socket named by $NOTIFY_SOCKET (an abstract socket when
it starts with '@'); outside systemd the variable is unset and this does
nothing. A failure to notify is logged, never raised: readiness reporting must
not be what stops the agent.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

__all__ = ["notify", "ready", "reloading", "stopping"]

log = structlog.get_logger("watcher.ops.notify")


def notify(*lines: str) -> bool:
    """Send `lines` (KEY=VALUE) to $NOTIFY_SOCKET; False when there is none or it refused."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return False
    address = "\0" + where[1:] if where.startswith("@") else where
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(lines).encode(), address)
    except OSError as err:
        log.warning("could not notify the service manager", socket=where, error=str(err))
        return False
    return True


def ready(status: str) -> bool:
    return notify("READY=1", f"STATUS={status}")


def reloading() -> bool:
    # MONOTONIC_USEC lets systemd match this reload to the READY=1 that ends it.
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading the configuration")


def stopping() -> bool:
    return notify("STOPPING=1", "STATUS=stopping: handing over queued events")
