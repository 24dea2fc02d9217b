"""The allocator setting the agent makes at start (watcher.allocator), in fresh interpreters."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Three cycles' worth of an answer-sized buffer, each freed, with a little kept after each (as a
# cycle keeps its model): what RSS is left above where it started, in MiB.
_PROBE = """
import sys
from watcher import allocator

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

set_ = allocator.return_large_blocks() if sys.argv[1] == "set" else None
start = rss()
kept = []
for _ in range(3):
    answer = bytes(16 << 20)
    del answer
    kept.append([bytes(200) for _ in range(10)])
print(set_, round(rss() - start, 1))
"""


def _probe(mode: str, **malloc: str) -> tuple[str, float]:
    """Run the probe with glibc's own settings (MALLOC_*) from `malloc` only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), **malloc},
        timeout=60,
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_answer_sized_buffers_go_back_to_the_system_when_freed() -> None:
    assert _probe("set") == ("True", pytest.approx(0.0, abs=4.0))
    # What the setting is for: left alone, glibc keeps such blocks once it has freed one.
    assert _probe("plain")[1] >= 15.0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_an_operators_own_malloc_setting_is_kept() -> None:
    assert _probe("set", MALLOC_MMAP_THRESHOLD_="1048576")[0] == "False"
