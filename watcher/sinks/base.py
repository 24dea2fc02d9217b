"""What every sink shares: the Sink protocol and its Outcome, the settings all sinks (and all HTTP
sinks) have with their generic checks, what a sink type can do, and its route."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from watcher.config import ConfigError, field_meta
from watcher.model.changes import Kind, Severity
from watcher.model.events import Event
from watcher.model.gaps import Gap
from watcher.model.routing import Route
from watcher.secrets import Secret, remember_url_credentials

__all__ = [
    "Outcome",
    "KeyValue",
    "Sink",
    "GapRecorder",
    "SinkContext",
    "Capabilities",
    "SeverityName",
    "BaseSinkSettings",
    "HttpSinkSettings",
    "check_http_sink",
    "check_client_files",
    "check_kinds",
    "route_of",
]


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery attempt.

    delivered; or retry (transient: 408, 429, 5xx, network), optionally not
    before `retry_after` seconds; or gone (410: disable the sink); or, when
    none is set, permanent (other 4xx: dead-letter the events).

    `done`: a sink that delivers a batch's events one after another may say, with a failure, how
    many of them went through first: those are acknowledged, and the failure concerns the event
    after them alone (a permanent one dead-letters just that event; the rest stay queued). None:
    the failure concerns the whole batch.
    """

    delivered: bool = False
    retry: bool = False
    retry_after: float | None = None
    gone: bool = False
    status: int | None = None
    error: str = ""
    done: int | None = None

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


@runtime_checkable
class GapRecorder(Protocol):
    """A sink that keeps a stream of its own (the audit log) and records in it, where they would
    have been, the events its queue's caps dropped. Other sinks only count and log a drop."""

    async def record_gap(self, gap: Gap) -> Outcome:
        """Record `gap` in the stream and say how it went (retried like a delivery)."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink is built with besides its settings: the node, the state directory, durable state,
    and where the other configured sinks keep audit logs (by sink name), for a sink that reports
    one's head (`audit_head`)."""

    node: str
    state_dir: Path
    store: KeyValue
    audit_logs: Mapping[str, Path] = field(default_factory=dict)
    # The agent's one KubeApi (watcher.kubeapi.api), when it talks to the API server: the kubernetes
    # sink shares its client and limiter with the sources that read the API. Typed loosely so that
    # this module does not import the client library's side.
    kube_api: object | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a sink type does beyond delivering what its route lets through.

    `pages`: it opens something (a page, an alert) when a condition starts and
    must see the end of every condition it started, whatever its minimum severity.
    `notifies`: a person reads it: a flapping device's individual changes are left
    out (its device.flapping and device.flap_ended say it once).
    `each_device`: a paging sink that still takes each device of a mass failure (the Kubernetes
    sink: every pod hit gets its own Event), besides the incident's one event.
    `resolves`: it tells the end of every condition it told the start of, whatever its minimum
    severity, as a paging sink does (Slack: "recovered" after "failed"), without being one.
    `batches`: it takes up to `max_batch` events in one delivery whatever its `group`
    (the audit log: one write, one fsync and one outbox transaction for them all).
    """

    pages: bool = False
    notifies: bool = False
    batches: bool = False
    each_device: bool = False
    resolves: bool = False


SeverityName = Literal["info", "warning", "critical"]
_WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True)
class BaseSinkSettings:
    """What every sink has: routing filters, grouping, queue bounds, rate and retry cap."""

    name: str = ""
    kinds: tuple[str, ...] = field(
        default=("*",), metadata=field_meta('Event kinds this sink receives (globs, e.g. "device.*").')
    )
    min_severity: SeverityName = field(
        default="info", metadata=field_meta("Lowest severity this sink receives.")
    )
    resources: tuple[str, ...] = field(
        default=("*",),
        metadata=field_meta(
            "Resource globs; with a filter set, only events naming a matching resource pass."
        ),
    )
    namespaces: tuple[str, ...] = field(
        default=("*",),
        metadata=field_meta(
            "Pod namespace globs; with a filter set, only events naming a matching namespace pass."
        ),
    )
    group: Literal["none", "cycle", "window"] = field(
        default="none",
        metadata=field_meta(
            "none: one message per event; cycle: one per re-query; window: one per group_window."
        ),
    )
    group_window: float = field(
        default=2.0,
        metadata=field_meta("Seconds to gather events into one message (group = window).", min=0.01, max=600),
    )
    max_batch: int = field(default=50, metadata=field_meta("Most events in one message.", min=1, max=10000))
    max_queue: int = field(
        default=10000, metadata=field_meta("Most events queued for this sink; the oldest go first.", min=1)
    )
    max_age: float = field(
        default=_WEEK,
        metadata=field_meta(
            "Seconds a queued event may wait before it is dropped (the oldest first, counted, logged); "
            "measured on the boot clock, so a wall-clock step never ages events.",
            min=1,
        ),
    )
    max_dead_letters: int = field(
        default=10000,
        metadata=field_meta(
            "Most dead letters kept for this sink; beyond it the oldest are dropped (counted, logged).",
            min=1,
        ),
    )
    max_dead_letter_age: float = field(
        default=_WEEK,
        metadata=field_meta(
            "Seconds a dead letter is kept before it is dropped (counted, logged); measured like max_age.",
            min=1,
        ),
    )
    rate: float = field(default=10.0, metadata=field_meta("Most messages per second.", min=0.001, max=1000))
    retry_max_delay: float = field(
        default=300.0, metadata=field_meta("Cap of the retry backoff, seconds.", min=0.01, max=86400)
    )
    retry_after_max: float = field(
        default=300.0,
        metadata=field_meta(
            "Longest wait a receiver's Retry-After may impose, seconds; a longer one is cut to this "
            "and logged.",
            min=0,
            max=86400,
        ),
    )


@dataclass(frozen=True)
class HttpSinkSettings:
    """What every HTTP sink has besides the base: timeout and TLS (mixed in after BaseSinkSettings)."""

    timeout: float = field(
        default=15.0, metadata=field_meta("HTTP request timeout, seconds.", min=0.1, max=300)
    )
    ca_file: Path | None = field(default=None, metadata=field_meta("CA bundle to verify the server with."))
    cert_file: Path | None = field(
        default=None, metadata=field_meta("Client certificate (PEM) for mutual TLS.")
    )
    key_file: Path | None = field(
        default=None, metadata=field_meta("Client key (PEM) for mutual TLS.", private=True)
    )
    tls_verify: bool = field(
        default=True, metadata=field_meta("Verify the server's certificate. Turn off only for tests.")
    )


def check_http_sink(path: str, settings: HttpSinkSettings) -> None:
    """The checks every HTTP sink needs: a whole client key pair, and http(s) URLs (`url`, `endpoint`).

    A URL that is not a secret field may still carry credentials (`https://user:pass@host`, a
    token in its query): those parts are registered as secrets, so no log line or error shows them.
    """
    check_client_files(path, settings)
    urls = {"endpoint": getattr(settings, "endpoint", None), "url": getattr(settings, "url", None)}
    for key, url in urls.items():
        if isinstance(url, str):
            remember_url_credentials(url)
            if not url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"{path}.{key}: not an http(s) URL; expected http://HOST[:PORT]/... or https://..."
                )
        if isinstance(url, Secret):
            value = url.get()
            if not value.startswith(("http://", "https://")):
                raise ConfigError(f"{path}.{key}: the value from {url.describe()} is not an http(s) URL")


def check_client_files(path: str, settings: object, extra: Sequence[str] = ()) -> None:
    """A client's TLS files (`ca_file`, `cert_file`, `key_file`, and the `extra` keys) can be read
    now, and a client certificate comes with its key; ConfigError naming the key otherwise."""
    if (getattr(settings, "cert_file", None) is None) != (getattr(settings, "key_file", None) is None):
        raise ConfigError(f"{path}.cert_file: cert_file and key_file go together")
    for key in ("ca_file", "cert_file", "key_file", *extra):
        file: Path | None = getattr(settings, key, None)
        if file is None:
            continue
        # Read now: the sink only opens them at its first delivery, and a missing CA bundle
        # would then fail every delivery, retried forever, instead of failing check-config.
        try:
            with open(file, "rb"):
                pass
        except OSError as err:
            raise ConfigError(f"{path}.{key}: cannot read {file}: {err.strerror or err}") from None


def check_kinds(path: str, settings: BaseSinkSettings) -> None:
    """Each `kinds` glob matches at least one event kind: a typo ("devcie.*") would otherwise
    route nothing to the sink, silently. ConfigError naming the entry and the closest pattern."""
    known = [str(k) for k in Kind]
    families = sorted({k.split(".")[0] + ".*" for k in known})
    for i, pattern in enumerate(settings.kinds):
        if any(fnmatchcase(k, pattern) for k in known):
            continue
        close = difflib.get_close_matches(pattern, [*families, *known], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{path}.kinds[{i}]: matches no event kind{hint} (the kinds are {', '.join(families)}: "
            "docs/events.md lists each)"
        )


def route_of(
    settings: BaseSinkSettings,
    *,
    resolutions: bool = False,
    skip_flapping: bool = False,
    skip_incident_devices: bool = False,
) -> Route:
    return Route(
        kinds=settings.kinds,
        min_severity=Severity(settings.min_severity),
        resources=settings.resources,
        namespaces=settings.namespaces,
        resolutions=resolutions,
        skip_flapping=skip_flapping,
        skip_incident_devices=skip_incident_devices,
    )
