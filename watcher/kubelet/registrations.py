"""Who registered with the kubelet, as the sockets show: the DRA drivers' registration sockets in
`plugins_registry/`, and the device plugins' own sockets in `device-plugins/`.

A DRA driver serves its registration socket there, named `<driver>-reg.sock` by upstream's
kubeletplugin helper, and a driver that restarts removes and re-creates it: a socket whose identity
(inode and change time) differs from the last look's is its driver registering again. A device
plugin that restarts re-creates its socket the same way (which resource it serves is not visible
here: watcher.kubelet.plugins).
"""

from __future__ import annotations

import os
from pathlib import Path

from watcher.kubelet.plugins import REGISTRATION_SOCKET

__all__ = ["driver_registrations", "plugin_socket_identities"]

_SUFFIX = "-reg.sock"


def driver_registrations(directory: Path) -> dict[str, str] | None:
    """Each driver's registration socket now, driver name -> identity; None when the directory
    cannot be read (not mounted, or no driver ever registered on this node)."""
    found = _identities(directory, _SUFFIX)
    return None if found is None else {name[: -len(_SUFFIX)]: i for name, i in found.items()}


def plugin_socket_identities(directory: Path) -> dict[str, str] | None:
    """Each device plugin's socket in `device-plugins/` now, name -> identity (the kubelet's own
    registration socket left out); None when the directory cannot be read."""
    found = _identities(directory, ".sock")
    if found is not None:
        found.pop(REGISTRATION_SOCKET, None)
    return found


def _identities(directory: Path, suffix: str) -> dict[str, str] | None:
    found: dict[str, str] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(suffix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone between the listing and the look: not registered now
                found[entry.name] = f"{st.st_ino}:{st.st_ctime_ns}"
    except OSError:
        return None
    return found
