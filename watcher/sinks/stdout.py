"""Events on standard output: one JSON object per line, or one readable line each."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TextIO

from watcher.model.events import Event
from watcher.settings import StdoutSinkSettings
from watcher.sinks import Outcome

__all__ = ["StdoutSink", "format_line"]


def format_line(event: Event) -> str:
    return f"{event.time} #{event.seq} {event.severity:<8} {event.kind:<24} {event.summary}"


class StdoutSink:
    def __init__(self, settings: StdoutSinkSettings, stream: TextIO | None = None) -> None:
        self.name = settings.name
        self.settings = settings
        self._stream = stream

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        stream = self._stream if self._stream is not None else sys.stdout
        try:
            for event in events:
                stream.write(
                    (event.to_json() if self.settings.format == "json" else format_line(event)) + "\n"
                )
            stream.flush()
        except OSError as err:
            return Outcome(retry=True, error=f"cannot write to stdout: {err.strerror or err}")
        return Outcome.ok()

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        return None
