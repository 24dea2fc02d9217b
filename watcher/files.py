"""Files the agent writes: private (0600, directories 0700), never through a link of either kind.

The outbox holds every event's payload and the audit log every device and pod name, so they
are for the agent alone whatever the umask. A symbolic link where the agent writes would let
whoever placed it choose what the agent (often root) overwrites, truncates or appends to, so
the file itself must not be a link: it is refused, the link and its target left untouched,
with an error naming the path. (A link higher up, e.g. a state directory that is a link to
another disk, is the operator's own choice and is followed.)

A directory is tightened to 0700 only when it is the agent's: created by it, empty, or holding
its own files; never a system directory, where 0700 would lock other services out.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from pathlib import Path

import structlog

from watcher.errors import UnsafePathError

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "SYSTEM_DIRS",
    "SYSTEM_TREES",
    "check_private",
    "is_system_directory",
    "open_private",
    "private_dir",
]

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

# Directories other programs keep their files in: a state_dir of /var/lib made 0700 would lock
# every non-root service out of its data. The chart's values.schema.json refuses the same list
# (a test keeps the two equal).
SYSTEM_DIRS = frozenset(
    {
        "/",
        *(f"/{d}" for d in ("bin", "boot", "etc", "home", "lib", "lib32", "lib64", "media", "mnt")),
        *(f"/{d}" for d in ("opt", "root", "run", "sbin", "srv", "tmp", "usr", "var")),
        *(f"/usr/{d}" for d in ("bin", "lib", "lib64", "local", "local/bin", "local/lib", "sbin", "share")),
        *(f"/var/{d}" for d in ("cache", "lib", "local", "lock", "log", "mail", "opt", "run", "spool")),
        "/var/tmp",
        *(f"/var/lib/{d}" for d in ("containerd", "containers", "docker", "etcd")),
        "/etc/kubernetes",
    }
)
# Whole trees that are never the agent's: pseudo-filesystems and the kubelet's own directory.
SYSTEM_TREES = ("/dev", "/proc", "/sys", "/var/lib/kubelet")

log = structlog.get_logger("watcher.files")


def is_system_directory(path: Path) -> bool:
    """Whether `path` (as written, or as links resolve it) is one of SYSTEM_DIRS or inside SYSTEM_TREES."""
    for candidate in {path, path.resolve()}:
        # normpath keeps a leading "//" (POSIX leaves its meaning open); it is "/" here.
        clean = "/" + os.path.normpath(os.path.abspath(candidate)).lstrip("/")
        if clean in SYSTEM_DIRS or any(clean == t or clean.startswith(f"{t}/") for t in SYSTEM_TREES):
            return True
    return False


def _holds_ours(path: Path, own: Collection[str]) -> bool:
    """Empty (made for the agent, e.g. by the kubelet's DirectoryOrCreate) or holding one of `own`."""
    empty = True
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name in own:
                return True
            empty = False
    return empty


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


def private_dir(path: Path, what: str, *, tighten: bool, own: Collection[str] = ()) -> None:
    """Create directory `path` (and missing parents) with mode 0700. With `tighten`, an existing
    one that group or others may enter is set to 0700, and the log says so, if it is the agent's:
    empty or holding a file named in `own`, and not a system directory."""
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
    if is_system_directory(path) or not _holds_ours(path, own):
        # Someone else's files are there: 0700 could lock them out of their own directory.
        log.warning(
            f"the {what} is open to group or others and holds files that are not the agent's (or is a "
            "system directory): left as it is; give the agent a directory of its own",
            path=str(path),
            mode=f"{mode:04o}",
        )
        return
    # Empty and writable by its owner alone: nothing was ever exposed, nor could anyone else have
    # put something there and taken it away. That is how a Kubernetes hostPath `DirectoryOrCreate`
    # (the shipped DaemonSet's state volume) hands the agent its directory on every new node: 0755.
    fresh = not mode & 0o022 and not any(path.iterdir())
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
    if fresh:
        log.info(
            f"the new, empty {what} was open to group or others: set to 0700",
            path=str(path),
            was=f"{mode:04o}",
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
