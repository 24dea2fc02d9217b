"""Whether events and state can be stored: the one place that knows (interim; see store/)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["StorageHealth"]


class StorageHealth:
    def __init__(self) -> None:
        self.ready = asyncio.Event()  # the outbox is open and its saved state was read
        self.error: str | None = None  # the last failure to store events and state
        self.open_error: str | None = None  # why the outbox could not be opened, until it is
        self.failures = 0  # failed commits in a row, for the retry backoff
        self.listeners: list[Callable[[bool], None]] = []  # told "writable?" on every change

    def failed(self, err: BaseException, *, commit: bool = False) -> None:
        self.error = f"{type(err).__name__}: {err}"
        if commit:
            self.failures += 1
        self._tell(False)

    def open_failed(self, err: BaseException) -> None:
        self.failed(err)
        self.open_error = self.error

    def opened(self) -> None:
        self.ready.set()

    def ok(self) -> None:
        self.error = None
        self.failures = 0
        self._tell(True)

    def _tell(self, writable: bool) -> None:
        for listener in self.listeners:
            listener(writable)
