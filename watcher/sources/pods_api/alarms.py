"""Warnings about pods that misbehave on the Pods API, each bounded so that a hostile pod costs a
log line now and then, never a log flood: a pod that does not decode (one warning per uid per
minute, with how many were skipped), and one pod changing too often (one warning per window).

Both keep a small dict keyed by uid, emptied as its window passes: memory stays bounded by the
pods seen in one window, whatever a stream sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

__all__ = ["DecodeWarnings", "FloodWarnings"]

log = structlog.get_logger("watcher.sources.pods_api.watch")

UNKNOWN_UID = "?"  # the key for pods whose uid could not be read


class DecodeWarnings:
    """At most one warning per uid per `every` seconds for pods that fail to decode; the next
    one says how many were skipped in between."""

    def __init__(self, *, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.skipped = 0  # in all, for tests and metrics
        self._last: dict[str, tuple[float, int]] = {}  # uid -> (when warned, skipped since)

    def skipped_pod(self, uid: str | None, error: str, *, socket: str) -> None:
        self.skipped += 1
        key, now = uid or UNKNOWN_UID, self.clock()
        if len(self._last) > 1000:  # forget uids whose minute has passed
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.every}
        warned = self._last.get(key)
        if warned is not None and now - warned[0] < self.every:
            self._last[key] = (warned[0], warned[1] + 1)
            return
        self._last[key] = (now, 0)
        log.warning(
            "a pod from the Pods API did not decode; skipped, the watch goes on",
            uid=key,
            skipped=1 + (warned[1] if warned is not None else 0),
            error=error,
            socket=socket,
        )


class FloodWarnings:
    """One warning when a pod sends more than `limit` MODIFIED events within `window` seconds.
    Each event still costs its decode and compare (nothing is dropped): this only says so."""

    def __init__(
        self, *, limit: int = 50, window: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.warned = 0  # in all, for tests and metrics
        self._started = clock()
        self._counts: dict[str, int] = {}

    def modified(self, uid: str, key: str) -> None:
        now = self.clock()
        if now - self._started >= self.window:
            self._started, self._counts = now, {}
        count = self._counts.get(uid, 0) + 1
        self._counts[uid] = count
        if count == self.limit + 1:
            self.warned += 1
            log.warning(
                "one pod changes too often on the Pods API; each change is still compared, the "
                "kubelet or the pod's controller is misbehaving",
                uid=uid,
                pod=key,
                changes=count,
                within_s=self.window,
            )
