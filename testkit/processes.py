"""The fake kubelet as a real child process, for tests that run the agent as a process too."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fake_kubelet_process"]


@contextmanager
def fake_kubelet_process(root: Path) -> Iterator[subprocess.Popen[str]]:
    """`python -m watcher fake-kubelet --root ROOT`, serving (its socket in place) when this yields;
    stopped with SIGTERM when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "fake-kubelet", "--root", str(root)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "serving" in proc.stderr.readline()  # printed once the socket is in place
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        if proc.stderr is not None:
            proc.stderr.close()
