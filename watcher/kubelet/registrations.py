"""The DRA drivers registered through the kubelet's plugin registration, as their sockets in
`plugins_registry/` show.

A DRA driver serves its registration socket there, named `<driver>-reg.sock` by upstream's
kubeletplugin helper, and a driver that restarts removes and re-creates it: a socket whose identity
(inode and change time) differs from the last look's is its driver registering again. Device
plugins register through the kubelet's own socket instead (watcher.kubelet.plugins).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["driver_registrations"]

_SUFFIX = "-reg.sock"


def driver_registrations(directory: Path) -> dict[str, str] | None:
    """Each driver's registration socket now, driver name -> identity; None when the directory
    cannot be read (not mounted, or no driver ever registered on this node)."""
    found: dict[str, str] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(_SUFFIX):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone between the listing and the look: not registered now
                found[entry.name[: -len(_SUFFIX)]] = f"{st.st_ino}:{st.st_ctime_ns}"
    except OSError:
        return None
    return found
