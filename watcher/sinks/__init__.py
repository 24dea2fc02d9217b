"""Where events go. Sinks know nothing of the kubelet: they get events, in `seq` order, and
answer with an Outcome that the one retry policy in `watcher.delivery.dispatcher` acts on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from watcher.model.events import Event
from watcher.model.routing import Route
from watcher.settings import BaseSinkSettings, SinkSettings

__all__ = ["Outcome", "Sink", "KeyValue", "build_sink", "build_sinks", "route_of"]


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery attempt.

    delivered; or retry (transient: 408, 429, 5xx, network), optionally not
    before `retry_after` seconds; or gone (410: disable the sink); or, when
    none is set, permanent (other 4xx: dead-letter the events).
    """

    delivered: bool = False
    retry: bool = False
    retry_after: float | None = None
    gone: bool = False
    status: int | None = None
    error: str = ""

    @classmethod
    def ok(cls, status: int | None = None) -> Outcome:
        return cls(delivered=True, status=status)


class KeyValue(Protocol):
    """Small durable state a sink keeps (open pages, active alerts): the outbox provides it."""

    async def kv_get(self, key: str) -> Any: ...
    async def kv_set(self, key: str, value: Any) -> None: ...


class Sink(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> BaseSinkSettings: ...

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        """Deliver the events (one message, or as the sink sees fit) and say how it went."""

    def background(self) -> Callable[[], Awaitable[None]] | None:
        """A long-lived task the sink needs (e.g. re-sending active alerts), or None."""

    async def close(self) -> None: ...


def route_of(settings: BaseSinkSettings, *, resolutions: bool = False) -> Route:
    from watcher.model.changes import Severity

    return Route(
        kinds=settings.kinds,
        min_severity=Severity(settings.min_severity),
        resources=settings.resources,
        namespaces=settings.namespaces,
        resolutions=resolutions,
    )


def build_sink(cfg: SinkSettings, *, node: str, state_dir: Path, store: KeyValue) -> Sink:
    """Instantiate one configured sink."""
    from watcher import settings as s
    from watcher.sinks.alertmanager import AlertmanagerSink
    from watcher.sinks.file import FileSink
    from watcher.sinks.pagerduty import PagerDutySink
    from watcher.sinks.slack import SlackSink
    from watcher.sinks.stdout import StdoutSink
    from watcher.sinks.webhook import WebhookSink

    if isinstance(cfg, s.FileSinkSettings):
        # A relative default path lives in the state directory.
        path = cfg.path if cfg.path.is_absolute() else state_dir / cfg.path
        return FileSink(cfg, path)
    if isinstance(cfg, s.SlackSinkSettings):
        return SlackSink(cfg, node=node)
    if isinstance(cfg, s.PagerDutySinkSettings):
        return PagerDutySink(cfg, node=node, store=store)
    if isinstance(cfg, s.WebhookSinkSettings):
        return WebhookSink(cfg, node=node)
    if isinstance(cfg, s.AlertmanagerSinkSettings):
        return AlertmanagerSink(cfg, node=node, store=store)
    return StdoutSink(cfg)


def build_sinks(
    configs: Sequence[SinkSettings], *, node: str, state_dir: Path, store: KeyValue
) -> list[Sink]:
    return [build_sink(cfg, node=node, state_dir=state_dir, store=store) for cfg in configs]
