"""Events on standard output: one JSON object per line, or one readable line each."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

from watcher.config import field_meta
from watcher.model.events import Event
from watcher.sinks.base import BaseSinkSettings, Outcome, SinkContext
from watcher.sinks.registry import SinkType, register

__all__ = ["StdoutSink", "StdoutSinkSettings", "format_line"]


@dataclass(frozen=True)
class StdoutSinkSettings(BaseSinkSettings):
    format: Literal["json", "text"] = field(
        default="json", metadata=field_meta("json: one event per line; text: one readable line per event.")
    )
    rate: float = field(
        default=1000.0, metadata=field_meta("Most messages per second.", min=0.001, max=100000)
    )
    type: Literal["stdout"] = "stdout"


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


def _stdout_sink(settings: StdoutSinkSettings, context: SinkContext) -> StdoutSink:
    return StdoutSink(settings)


register(SinkType(name="stdout", settings=StdoutSinkSettings, factory=_stdout_sink, order=10))
