"""Where events go. Each sink knows nothing of the kubelet: it gets events, in `seq` order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from watcher.events import Event
from watcher.settings import FileSinkSettings, SinkSettings

__all__ = ["Sink", "build_sinks"]


class Sink(Protocol):
    name: str

    async def send(self, events: Sequence[Event]) -> None:
        """Deliver the events (in order) or raise."""

    async def close(self) -> None: ...


def build_sinks(configs: Sequence[SinkSettings]) -> list[Sink]:
    """Instantiate the configured sinks, in configuration order."""
    from watcher.sinks.file import FileSink
    from watcher.sinks.stdout import StdoutSink

    sinks: list[Sink] = []
    for cfg in configs:
        if isinstance(cfg, FileSinkSettings):
            sinks.append(FileSink(cfg.path, name=cfg.name, fsync=cfg.fsync))
        else:
            sinks.append(StdoutSink(cfg.name, cfg.format))
    return sinks
