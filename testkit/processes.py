"""The fake kubelet as a real child process, for tests and benchmarks that run the agent as a
process too."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fake_kubelet_process"]


@contextmanager
def fake_kubelet_process(
    root: Path,
    *,
    node: str = "default",
    shuffle: bool = True,
    rate: float | None = None,
    burst: int | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """`python -m watcher fake-kubelet --root ROOT`, serving (its socket in place) when this yields;
    stopped with SIGTERM when the block ends. `node`, `shuffle`, `rate` and `burst` are the
    command's `--node`, `--no-shuffle`, `--rate` and `--burst` (None: the command's default)."""
    options = [] if node == "default" else ["--node", node]
    options += [] if shuffle else ["--no-shuffle"]
    options += [] if rate is None else ["--rate", str(rate)]
    options += [] if burst is None else ["--burst", str(burst)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "fake-kubelet", "--root", str(root), *options],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving" in line, line  # printed once the socket is in place
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        if proc.stderr is not None:
            proc.stderr.close()
