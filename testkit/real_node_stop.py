"""`python -m testkit.real_node_up stop` (`make real-node-stop`): the end of a `start`
(testkit/real_node_up.py), found through the pid file in its directory, and whatever of it is
still running: a `start` that was SIGKILLed leaves its peers behind, each with a path under the
directory among its arguments.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
from pathlib import Path

from testkit.peers import PEERS_BIN

__all__ = ["KEEP_FILE", "PID_FILE", "READY_FILE", "is_start", "leftovers", "read_pid", "stop_node"]

PID_FILE = "real-node.pid"
READY_FILE = "ready.json"
KEEP_FILE = "keep"  # present: a `stop` after a crashed `start` leaves the directory too
# The teardown stops each process with a grace of its own (10 s for most, 30 s the API server).
STOP_TIMEOUT_S = 120.0


def stop_node(directory: Path, timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM to the `start` whose pid file is in `directory`, and wait until it has exited;
    then whatever of ours still runs naming the directory (a `start` that was SIGKILLed leaves its
    peers) is stopped too, and the directory removed unless it was started with --keep."""
    pid = read_pid(directory / PID_FILE)
    if pid is not None and is_start(pid):
        print(f"real-node: stopping pid {pid} (its teardown prints to its own terminal)", flush=True)
        _end(pid, timeout)
    strays = leftovers(directory)
    for stray in strays:
        _end(stray, 10.0)
    if strays:
        print(f"real-node: stopped what a crashed start left: pids {strays}", flush=True)
    if directory.exists() and not (directory / KEEP_FILE).exists():
        if pid is None and not (directory / READY_FILE).exists():
            print(f"real-node: nothing ran under {directory}; left as it is", flush=True)
            return 0
        shutil.rmtree(directory)
    still = leftovers(directory)
    if still:
        print(f"real-node: still running after SIGKILL: pids {still}", file=sys.stderr)
        return 1
    print(f"real-node: stopped; nothing runs under {directory}", flush=True)
    return 0


def _end(pid: int, timeout: float) -> None:
    """SIGTERM, and SIGKILL if it is still there after `timeout` s; returns once it has exited."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        # A pidfd turns readable when its process exits: the exit itself is awaited.
        if not select.select([handle], [], [], timeout)[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            select.select([handle], [], [], 10.0)
    finally:
        os.close(handle)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def is_start(pid: int) -> bool:
    """`pid` is a `start` (not a pid the system reused for something else since)."""
    argv = _argv(pid)
    return "testkit.real_node_up" in argv and "start" in argv


def _is_peer_under(pid: int, directory: Path) -> bool:
    """`pid` runs one of the peers' binaries with a path under `directory` among its arguments
    (each is given one: its directory, socket or kubeconfig)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    within = f"{directory}/"
    return exe.startswith(f"{PEERS_BIN}/") and any(a.startswith(within) for a in _argv(pid))


def leftovers(directory: Path) -> list[int]:
    """The peers still running on `directory`, and any `start` given it as --dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        argv = _argv(pid)
        if _is_peer_under(pid, directory) or (is_start(pid) and str(directory) in argv):
            found.append(pid)
    return sorted(found)
