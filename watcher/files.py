"""Files the agent writes: private (0600, directories 0700), never through a link of either kind.

The outbox holds every event's payload and the audit log every device and pod name, so they
are for the agent alone whatever the umask. A symbolic link where the agent writes would let
whoever placed it choose what the agent (often root) overwrites, truncates or appends to, so
the file itself must not be a link: it is refused, the link and its target left untouched,
with an error naming the path. (A link higher up, e.g. a state directory that is a link to
another disk, is the operator's own choice and is followed.)
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import structlog

from watcher.errors import UnsafePathError

__all__ = ["PRIVATE_FILE", "PRIVATE_DIR", "private_dir", "open_private", "check_private"]

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

log = structlog.get_logger("watcher.files")


def _link_error(path: Path, what: str) -> UnsafePathError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return UnsafePathError(
        f"refusing to write the {what} {path}: it is a symbolic link{target}, and the agent never "
        "writes through one; replace the link with a regular file (or point the setting at one)",
        path=str(path),
    )


def _not_regular(path: Path, what: str) -> UnsafePathError:
    return UnsafePathError(
        f"refusing to write the {what} {path}: it is not a regular file; move it away or point the "
        "setting elsewhere",
        path=str(path),
    )


def private_dir(path: Path, what: str, *, tighten: bool) -> None:
    """Create directory `path` (and missing parents) with mode 0700. With `tighten`, an existing
    one that group or others may enter is set to 0700, and the log says so."""
    try:
        path.mkdir(mode=PRIVATE_DIR, parents=True)
        os.chmod(path, PRIVATE_DIR)  # mkdir's mode goes through the umask; ours must not
        return
    except FileExistsError:
        pass
    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if not tighten or not mode & 0o077 or not stat.S_ISDIR(st.st_mode):
        return  # (not a directory: what is opened in it next fails, saying so)
    if mode & stat.S_ISVTX or st.st_uid != os.geteuid():
        # Sticky (/tmp) or someone else's: a shared directory, not ours to change. Our files in
        # it are private anyway.
        log.warning(
            f"the {what} is open to group or others and is shared (sticky or not ours): left as it "
            "is; give the agent a directory of its own",
            path=str(path),
            mode=f"{mode:04o}",
        )
        return
    try:
        os.chmod(path, PRIVATE_DIR)
    except OSError as err:  # a read-only filesystem: what is opened in it next says more
        log.warning(
            f"the {what} is open to group or others and could not be set to 0700",
            path=str(path),
            mode=f"{mode:04o}",
            error=err.strerror or str(err),
        )
        return
    log.warning(f"the {what} was open to group or others: set to 0700", path=str(path), was=f"{mode:04o}")


def _hard_linked(path: Path, what: str, links: int) -> UnsafePathError:
    return UnsafePathError(
        f"refusing to write the {what} {path}: it has {links} names (hard links), so writing it "
        "would change a file elsewhere too; replace it with a file of its own",
        path=str(path),
    )


def _tighten(fd: int, path: Path, what: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, what)
    if st.st_nlink > 1:
        # O_NOFOLLOW stops symbolic links only: a hard link to another file would have the
        # agent cut, chmod and append to that file just the same.
        raise _hard_linked(path, what, st.st_nlink)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except OSError as err:  # not ours, or a read-only filesystem: say so, and go on
        log.warning(
            f"the {what} is open to group or others and could not be set to 0600: chmod 600 it",
            path=str(path),
            mode=f"{mode:04o}",
            error=err.strerror or str(err),
        )
        return
    log.warning(f"the {what} was open to group or others: set to 0600", path=str(path), was=f"{mode:04o}")


def open_private(path: Path, flags: int, what: str) -> int:
    """`os.open(path, flags)` for a file the agent writes: created 0600 whatever the umask,
    never through a symbolic link (UnsafePathError), only a regular file, and an existing one
    that group or others may access set to 0600 (logged). `what` names it in messages.

    O_TRUNC is applied only once the file has passed those checks: truncating at open would
    empty a hard-linked file before it could be refused."""
    truncate = bool(flags & os.O_TRUNC)
    flags &= ~os.O_TRUNC
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, PRIVATE_FILE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _link_error(path, what) from None
        raise
    try:
        _tighten(fd, path, what)
        if truncate:
            os.ftruncate(fd, 0)
        if flags & os.O_NONBLOCK == 0:
            # Only a FIFO would block on open, and it was refused above; a regular file
            # ignores O_NONBLOCK, but the descriptor should say what the caller asked for.
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_private(path: Path, what: str, *, create: bool = False) -> None:
    """For a file another program writes for the agent (SQLite: the database, its -wal and
    -shm) or one kept from before (rotated logs): refuse a symbolic link or anything but a
    regular file, and set a loose mode to 0600. With `create`, a missing one is created 0600.

    A file that is already right is only looked at (lstat), never opened: closing a descriptor
    drops every POSIX lock this process holds on the file, SQLite's included.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:
            os.close(open_private(path, os.O_RDONLY | os.O_CREAT, what))
        return
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(path, what)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise _hard_linked(path, what, st.st_nlink)
    if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077:
        return
    try:
        os.close(open_private(path, os.O_RDONLY, what))  # says what is wrong, or fixes the mode
    except FileNotFoundError:
        return
