"""The kernel's boot clock and this boot's id: what a time that must survive the agent's restarts
(a queued event's age, a held resolve's due time) is measured on, since no wall-clock step moves it.

CLOCK_BOOTTIME counts seconds since boot, runs on while the agent is stopped and through suspend,
and starts again from zero after a reboot: a reading means something only with its boot's id.
"""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path

__all__ = ["boot_clock", "boot_id"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def boot_id() -> str:
    """This boot's id (the kernel's), read once."""
    try:
        return _BOOT_ID.read_text().strip() or str(uuid.uuid4())
    except OSError:
        # No boot id (not Linux): every start of the agent counts as a boot, which only ever
        # leaves out the time it was stopped, never adds to an age.
        return f"process-{uuid.uuid4()}"


def boot_clock() -> tuple[str, float]:
    """(this boot's id, seconds since boot) from the kernel."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    seconds = time.clock_gettime(clock) if clock is not None else time.monotonic()
    return boot_id(), seconds
