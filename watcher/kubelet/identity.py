"""Which socket file is at the kubelet's path: the value types and the restart decision. Pure
but for one stat().

ext4 hands a freed inode number straight to the next file, so the inode
number alone cannot tell one socket from the next; a chmod or relabel changes
the change time of the SAME socket, so ctime alone cries wolf. A replacement
is a different (device, inode), a different mtime (a new socket's is its
creation time, which nothing else changes), or a different ctime together
with directory events that say the name was deleted, created or moved to.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FileIdentity", "SocketState", "is_replacement", "probe_socket", "replaced_since"]


@dataclass(frozen=True, slots=True)
class FileIdentity:
    dev: int
    ino: int
    ctime_ns: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns)

    def to_json(self) -> list[int]:
        return [self.dev, self.ino, self.ctime_ns, self.mtime_ns]

    @classmethod
    def from_json(cls, data: Any) -> FileIdentity | None:
        if isinstance(data, list) and len(data) == 4 and all(isinstance(x, int) for x in data):
            return cls(data[0], data[1], data[2], data[3])
        return None


@dataclass(frozen=True, slots=True)
class SocketState:
    """What is at the socket path now: nothing, a socket (with its identity), or something else."""

    identity: FileIdentity | None
    is_socket: bool

    @property
    def present(self) -> bool:
        return self.identity is not None and self.is_socket


def probe_socket(path: Path) -> SocketState:
    try:
        st = os.stat(path)
    except OSError:
        return SocketState(None, False)
    return SocketState(FileIdentity.of(st), stat.S_ISSOCK(st.st_mode))


def is_replacement(old: FileIdentity, new: FileIdentity, *, name_events: bool) -> bool:
    """Is `new` another socket than `old`? `name_events`: the directory reported the name
    deleted, created or moved to since `old` was seen."""
    if (old.dev, old.ino) != (new.dev, new.ino) or old.mtime_ns != new.mtime_ns:
        return True
    return old.ctime_ns != new.ctime_ns and name_events


def replaced_since(seen: FileIdentity | None, path: Path) -> bool:
    """Is another socket at `path` now than `seen` (None: none was seen)? Only a socket counts:
    something else at the path, or the same socket's metadata touched (chmod), does not."""
    now = probe_socket(path)
    if not now.present or now.identity is None:
        return False
    return seen is None or is_replacement(seen, now.identity, name_events=False)
