"""The device plugins the kubelet has registered, as their sockets in `device-plugins/` show.

Each registered plugin serves a unix socket there; the kubelet deletes them all when it starts
and a plugin that restarts re-creates its own. The names are only compared from one look to the
next (which plugin serves which resource is not visible here).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["plugin_sockets", "REGISTRATION_SOCKET"]

REGISTRATION_SOCKET = "kubelet.sock"  # the kubelet's own, which plugins register through


def plugin_sockets(directory: Path) -> frozenset[str] | None:
    """The plugins' socket names now; None when the directory cannot be read (not mounted)."""
    try:
        with os.scandir(directory) as entries:
            return frozenset(
                e.name for e in entries if e.name.endswith(".sock") and e.name != REGISTRATION_SOCKET
            )
    except OSError:
        return None
