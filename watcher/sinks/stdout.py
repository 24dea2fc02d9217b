"""Events on standard output: one JSON object per line, or one readable line each."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Literal, TextIO

from watcher.events import Event

__all__ = ["StdoutSink", "format_line"]


def format_line(event: Event) -> str:
    return f"{event.time} #{event.seq} {event.severity:<8} {event.kind:<24} {event.summary}"


class StdoutSink:
    def __init__(
        self, name: str = "stdout", fmt: Literal["json", "text"] = "json", stream: TextIO | None = None
    ):
        self.name = name
        self.fmt = fmt
        self._stream = stream

    async def send(self, events: Sequence[Event]) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        for event in events:
            stream.write((event.to_json() if self.fmt == "json" else format_line(event)) + "\n")
        stream.flush()

    async def close(self) -> None:
        return None
