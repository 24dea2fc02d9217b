"""File modes as the private-files tests read them: a path's permission bits, and a umask set for
the length of a test."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["mode", "umask"]


def mode(path: Path) -> int:
    """The permission bits of `path` itself (a symbolic link is not followed)."""
    return stat.S_IMODE(os.lstat(path).st_mode)


@contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)
