"""The Python heap's long-lived part, kept out of the cyclic garbage collector's full passes.

A large node's view is hundreds of thousands of objects that live for hours: the inventory's
records and the Pods API watch's index of every pod. CPython's full collection walks every
object it tracks, so on a 10,000-pod node each one held the event loop for 35-70 ms, and it
landed on whichever change was being handled at the time (`bench/pods_path.py` with gc
callbacks: a one-pod change's p50 is about 10 ms).

`settle()` collects once and moves what survives into the permanent generation (`gc.freeze`),
which later passes skip. Frozen objects are still freed by reference counting as usual, which
is how the model's records go (they make no reference cycles). A frozen object that becomes
part of an unreachable cycle waits for the next `settle()`, which first returns the frozen
objects to the collector (`gc.unfreeze`), so its one full pass finds such cycles too. It runs
when the view was just rebuilt whole (the first cycle after start, each Pods API snapshot): a
few times per kubelet restart, each a full pass of the kind it saves.
"""

from __future__ import annotations

import gc
import time

import structlog

__all__ = ["settle"]

log = structlog.get_logger("heap")


def settle(reason: str) -> None:
    """Collect everything now, frozen objects too, then leave what is alive out of later
    full collections."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug(
        "heap settled",
        reason=reason,
        frozen=gc.get_freeze_count(),
        seconds=round(time.perf_counter() - started, 4),
    )
