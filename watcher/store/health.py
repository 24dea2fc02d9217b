"""Storage health: the one place that knows whether events and state can be stored.

Whoever uses the outbox reports here how it went, and reads the condition back:

- `ready` (asyncio.Event): set once the outbox is open and its saved state was read
  back. Before that nothing can be committed, and the sinks have no queues to read.
- `error`: "TypeName: message" of the last failure to store events and state (a
  commit, an open, a sink's read or write), None since the last success.
- `open_error`: the error of the last failed open, kept apart from `error` (a later
  failure overwrites that one): until `ready` is set it says why a commit was not even
  tried. `require_ready()` raises it as "the outbox could not be opened: ...".
- `failed(err)`: a failure; `open_failed(err)`: a failed open (both `error` and
  `open_error`); `ok()`: a success, which clears `error` and the failure count.
- `count_failure()`: counts one more failed commit in a row and returns how many came
  before it, the attempt number for the retry backoff (0 the first time). Only commits
  count: an open or a sink's failure does not lengthen the commits' backoff.
- `writable`: ready and no error, i.e. a failure met now is news worth saying.
- `subscribe(listener)`: `listener(writable)` is called on every `failed()` (False) and
  `ok()` (True), repeats included, so a gauge set from it (`state_writable`) always
  matches the last report.

It decides nothing by itself: no retry, no reopen, no log line; those stay with the agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from watcher.store.outbox import OutboxUnavailableError

__all__ = ["StorageHealth"]


class StorageHealth:
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.error: str | None = None
        self.open_error: str | None = None
        self._failures = 0
        self._listeners: list[Callable[[bool], None]] = []

    @property
    def writable(self) -> bool:
        return self.ready.is_set() and self.error is None

    @property
    def failures(self) -> int:
        """Failed commits in a row, as counted by `count_failure()`."""
        return self._failures

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        self._listeners.append(listener)

    def failed(self, err: BaseException) -> None:
        self.error = f"{type(err).__name__}: {err}"
        self._tell(False)

    def open_failed(self, err: BaseException) -> None:
        self.failed(err)
        self.open_error = self.error

    def ok(self) -> None:
        self.error = None
        self._failures = 0
        self._tell(True)

    def count_failure(self) -> int:
        before, self._failures = self._failures, self._failures + 1
        return before

    def require_ready(self) -> None:
        """Raise OutboxUnavailableError, with the open error, unless the outbox is ready."""
        if not self.ready.is_set():
            raise OutboxUnavailableError(f"the outbox could not be opened: {self.open_error}")

    def _tell(self, writable: bool) -> None:
        for listener in self._listeners:
            listener(writable)
