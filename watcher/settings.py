"""Settings: frozen dataclasses with their defaults in one place, loaded from TOML.

Every bad input becomes one `ConfigError` line naming the key path, the bad
value and what is allowed; unknown keys are rejected, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import difflib
import os
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from watcher.errors import WatcherError
from watcher.kubelet.client import DEFAULT_MAX_RECEIVE_BYTES, DEFAULT_SOCKET, DEFAULT_TIMEOUT
from watcher.secrets import Secret, SecretError, expand_env

__all__ = [
    "ConfigError",
    "KubeletSettings",
    "WatchSettings",
    "LogSettings",
    "HttpSettings",
    "HttpSinkSettings",
    "StdoutSinkSettings",
    "FileSinkSettings",
    "SinkSettings",
    "Settings",
    "load_settings",
    "parse_settings",
]


class ConfigError(WatcherError):
    """The configuration is invalid; the message is one line naming the key."""


def _meta(
    doc: str, *, min: float | None = None, max: float | None = None, secret: bool = False
) -> dict[str, Any]:
    return {"doc": doc, "min": min, "max": max, "secret": secret}


@dataclass(frozen=True)
class KubeletSettings:
    socket: Path = field(
        default=Path(DEFAULT_SOCKET),
        metadata=_meta("The kubelet's pod-resources socket. Its DIRECTORY is watched and must be mounted."),
    )
    root_dir: Path = field(
        default=Path("/var/lib/kubelet"),
        metadata=_meta("The kubelet's root dir: device-plugins/ and the CPU/memory manager state files."),
    )
    timeout: float = field(
        default=DEFAULT_TIMEOUT, metadata=_meta("Deadline of each call, seconds.", min=0.001, max=600)
    )
    max_receive_bytes: int = field(
        default=DEFAULT_MAX_RECEIVE_BYTES, metadata=_meta("Largest response accepted, bytes.", min=1024)
    )
    unreachable_grace: float = field(
        default=30.0,
        metadata=_meta(
            "Seconds of failed queries before `kubelet.unreachable` is reported.", min=0, max=86400
        ),
    )


@dataclass(frozen=True)
class WatchSettings:
    interval: float = field(
        default=30.0, metadata=_meta("Periodic re-query, seconds: the safety net.", min=0.05, max=86400)
    )
    jitter: float = field(
        default=0.1,
        metadata=_meta(
            "Fraction of `interval` by which each period varies, so nodes spread out.", min=0, max=1
        ),
    )
    debounce: float = field(
        default=0.02,
        metadata=_meta("Seconds to gather more triggers into one re-query.", min=0, max=5),
    )
    max_rpc_rate: float = field(
        default=5.0,
        metadata=_meta(
            "Most RPCs per second we send; the kubelet allows 100/s for ALL clients.", min=0.1, max=50
        ),
    )
    state_file_triggers: bool = field(
        default=True,
        metadata=_meta("Re-query when the kubelet's checkpoint, CPU/memory state or plugin sockets change."),
    )
    force_polling: bool = field(default=False, metadata=_meta("Poll directories instead of using inotify."))
    poll_interval: float = field(
        default=0.1, metadata=_meta("Polling period when inotify is unavailable, seconds.", min=0.01, max=60)
    )
    snapshot_interval: float = field(
        default=0.0,
        metadata=_meta(
            "Emit an inventory.snapshot event this often so push consumers can reconcile; 0: never.",
            min=0,
            max=7 * 86400,
        ),
    )


@dataclass(frozen=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = field(default="info", metadata=_meta("Log level."))
    format: Literal["auto", "json", "console"] = field(
        default="auto", metadata=_meta("auto: console on a TTY, JSON otherwise.")
    )


@dataclass(frozen=True)
class HttpSettings:
    enabled: bool = field(default=True, metadata=_meta("Serve /metrics, /healthz, /readyz and /inventory."))
    listen: str = field(
        default="0.0.0.0:9108", metadata=_meta("HOST:PORT to listen on (port 0: any free port).")
    )
    ready_stale_after: float = field(
        default=120.0,
        metadata=_meta("/readyz fails when the last successful re-query is older than this, seconds.", min=1),
    )


Severity = Literal["info", "warning", "critical"]
_WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True)
class BaseSinkSettings:
    """What every sink has: routing filters, grouping, queue bounds, rate and retry cap."""

    name: str = ""
    kinds: tuple[str, ...] = field(
        default=("*",), metadata=_meta('Event kinds this sink receives (globs, e.g. "device.*").')
    )
    min_severity: Severity = field(default="info", metadata=_meta("Lowest severity this sink receives."))
    resources: tuple[str, ...] = field(
        default=("*",),
        metadata=_meta("Resource globs; with a filter set, only events naming a matching resource pass."),
    )
    namespaces: tuple[str, ...] = field(
        default=("*",),
        metadata=_meta(
            "Pod namespace globs; with a filter set, only events naming a matching namespace pass."
        ),
    )
    group: Literal["none", "cycle", "window"] = field(
        default="none",
        metadata=_meta("none: one message per event; cycle: one per re-query; window: one per group_window."),
    )
    group_window: float = field(
        default=2.0,
        metadata=_meta("Seconds to gather events into one message (group = window).", min=0.01, max=600),
    )
    max_batch: int = field(default=50, metadata=_meta("Most events in one message.", min=1, max=10000))
    max_queue: int = field(
        default=10000, metadata=_meta("Most events queued for this sink; the oldest go first.", min=1)
    )
    max_age: float = field(
        default=_WEEK, metadata=_meta("Seconds a queued event may wait before it is dropped.", min=1)
    )
    rate: float = field(default=10.0, metadata=_meta("Most messages per second.", min=0.001, max=1000))
    retry_max_delay: float = field(
        default=300.0, metadata=_meta("Cap of the retry backoff, seconds.", min=0.01, max=86400)
    )


@dataclass(frozen=True)
class HttpSinkSettings:
    timeout: float = field(default=15.0, metadata=_meta("HTTP request timeout, seconds.", min=0.1, max=300))
    ca_file: Path | None = field(default=None, metadata=_meta("CA bundle to verify the server with."))
    cert_file: Path | None = field(default=None, metadata=_meta("Client certificate (PEM) for mutual TLS."))
    key_file: Path | None = field(default=None, metadata=_meta("Client key (PEM) for mutual TLS."))
    tls_verify: bool = field(
        default=True, metadata=_meta("Verify the server's certificate. Turn off only for tests.")
    )


@dataclass(frozen=True)
class StdoutSinkSettings(BaseSinkSettings):
    format: Literal["json", "text"] = field(
        default="json", metadata=_meta("json: one event per line; text: one readable line per event.")
    )
    rate: float = field(default=1000.0, metadata=_meta("Most messages per second.", min=0.001, max=100000))
    type: Literal["stdout"] = "stdout"


@dataclass(frozen=True)
class FileSinkSettings(BaseSinkSettings):
    path: Path = field(default=Path("events.jsonl"), metadata=_meta("The JSONL audit log."))
    fsync: Literal["event", "interval"] = field(
        default="event", metadata=_meta("event: fsync every write; interval: every fsync_interval seconds.")
    )
    fsync_interval: float = field(default=1.0, metadata=_meta("Seconds between fsyncs.", min=0.01, max=3600))
    max_bytes: int = field(
        default=100 * 1024 * 1024, metadata=_meta("Rotate when the log reaches this size.", min=1024)
    )
    keep: int = field(
        default=5, metadata=_meta("Rotated files kept (events.jsonl.1 ... .N).", min=1, max=1000)
    )
    rate: float = field(default=1000.0, metadata=_meta("Most messages per second.", min=0.001, max=100000))
    type: Literal["file"] = "file"


@dataclass(frozen=True)
class SlackSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: Secret | None = field(default=None, metadata=_meta("Incoming-webhook URL (secret).", secret=True))
    group: Literal["none", "cycle", "window"] = field(
        default="cycle", metadata=_meta("Slack gets one message per re-query by default.")
    )
    rate: float = field(default=1.0, metadata=_meta("Slack allows about 1 message/s per webhook.", min=0.001))
    max_batch: int = field(
        default=1000,
        metadata=_meta("A whole re-query fits one message (cut short inside it).", min=1, max=10000),
    )
    type: Literal["slack"] = "slack"


@dataclass(frozen=True)
class PagerDutySinkSettings(BaseSinkSettings, HttpSinkSettings):
    routing_key: Secret | None = field(
        default=None, metadata=_meta("32-character integration key (secret).", secret=True)
    )
    endpoint: str = field(
        default="https://events.pagerduty.com/v2/enqueue",
        metadata=_meta("Events API v2 endpoint (EU: https://events.eu.pagerduty.com/v2/enqueue)."),
    )
    min_severity: Severity = field(default="warning", metadata=_meta("Only conditions worth a page."))
    rate: float = field(default=2.0, metadata=_meta("Most messages per second.", min=0.001))
    type: Literal["pagerduty"] = "pagerduty"


@dataclass(frozen=True)
class WebhookSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: Secret | None = field(default=None, metadata=_meta("Where events are POSTed (secret).", secret=True))
    format: Literal["json", "cloudevents", "cloudevents-binary"] = field(
        default="json",
        metadata=_meta("json: the event; cloudevents: structured CloudEvents 1.0; -binary: ce-* headers."),
    )
    batch: bool = field(
        default=False, metadata=_meta("POST up to max_batch events as one JSON array (not in binary mode).")
    )
    type_prefix: str = field(
        default="io.github.pod-resources-watcher",
        metadata=_meta("Reverse-DNS prefix of the CloudEvents type: PREFIX.device.removed."),
    )
    signing_secret: Secret | None = field(
        default=None, metadata=_meta("Standard Webhooks secret, whsec_... (secret).", secret=True)
    )
    bearer_token: Secret | None = field(
        default=None, metadata=_meta("Sent as Authorization: Bearer (secret).", secret=True)
    )
    headers: Mapping[str, str] = field(
        default_factory=dict, metadata=_meta("Extra headers; values may use ${ENV}.")
    )
    type: Literal["webhook"] = "webhook"


@dataclass(frozen=True)
class AlertmanagerSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: str = field(default="http://alertmanager:9093", metadata=_meta("Alertmanager base URL."))
    resend_interval: float = field(
        default=60.0,
        metadata=_meta(
            "Re-post active alerts this often; keep well inside resolve_timeout.", min=1, max=3600
        ),
    )
    bearer_token: Secret | None = field(
        default=None, metadata=_meta("Sent as Authorization: Bearer (secret).", secret=True)
    )
    type: Literal["alertmanager"] = "alertmanager"


SinkSettings = (
    StdoutSinkSettings
    | FileSinkSettings
    | SlackSinkSettings
    | PagerDutySinkSettings
    | WebhookSinkSettings
    | AlertmanagerSinkSettings
)
SINK_TYPES: dict[str, type[Any]] = {
    "stdout": StdoutSinkSettings,
    "file": FileSinkSettings,
    "slack": SlackSinkSettings,
    "pagerduty": PagerDutySinkSettings,
    "webhook": WebhookSinkSettings,
    "alertmanager": AlertmanagerSinkSettings,
}
# Secrets each sink type cannot do without.
REQUIRED_SECRETS = {"slack": ("url",), "pagerduty": ("routing_key",), "webhook": ("url",)}


def _default_node() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def _default_sinks() -> tuple[SinkSettings, ...]:
    return (StdoutSinkSettings(name="stdout"),)


@dataclass(frozen=True)
class Settings:
    node: str = field(
        default_factory=_default_node, metadata=_meta("Node name; default $NODE_NAME, else hostname.")
    )
    state_dir: Path = field(
        default=Path("/var/lib/pod-resources-watcher"),
        metadata=_meta("Where the state (and the outbox) live; hostPath in a DaemonSet."),
    )
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    log: LogSettings = field(default_factory=LogSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    sinks: tuple[SinkSettings, ...] = field(default_factory=_default_sinks)


# --- loading ---


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(path: str, value: Any, annotation: Any, meta: Mapping[str, Any], base: Path | None) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        # `X | None`: TOML has no null, so a present key always means X.
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _convert(path, value, inner, meta, base)
    if origin is tuple:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
            raise ConfigError(
                f"{path}: {_describe(value)} is not allowed; expected a list of non-empty strings"
            )
        return tuple(items)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{path}: {_describe(value)} is not allowed; expected a table of strings")
        try:
            for v in value.values():
                expand_env(v)  # an unset variable is a config error now, not a failed send later
        except SecretError as err:
            raise ConfigError(f"{path}: {err}") from err
        # Kept as written: ${ENV} values are expanded on each send, never stored or printed.
        return {str(k): v for k, v in value.items()}
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ConfigError(
                f"{path}: {_describe(value)} is not allowed; expected one of {', '.join(map(repr, allowed))}"
            )
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {_describe(value)} is not allowed; expected true or false")
        return value
    if annotation in (int, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if annotation is int:
            ok = ok and float(value).is_integer()
        if not ok:
            kind = "a whole number" if annotation is int else "a number"
            raise ConfigError(f"{path}: {_describe(value)} is not allowed; expected {kind}")
        number = annotation(value)
        low, high = meta.get("min"), meta.get("max")
        if (low is not None and number < low) or (high is not None and number > high):
            bounds = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            raise ConfigError(f"{path}: {_describe(value)} is out of range; expected {bounds}")
        return number
    if annotation is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {_describe(value)} is not allowed; expected a non-empty string")
        return value
    if annotation is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {_describe(value)} is not allowed; expected a path")
        return Path(value) if base is None or Path(value).is_absolute() else base / value
    raise AssertionError(f"unsupported settings type {annotation!r} at {path}")


def _secret(key: str, value: Any, *, is_file: bool, base: Path | None) -> Secret:
    if not isinstance(value, str) or not value:
        expected = "a path" if is_file else "a non-empty string (a value or ${ENV_VAR})"
        raise ConfigError(
            f"{key}: {'<redacted>' if not is_file else _describe(value)} is not allowed; expected {expected}"
        )
    try:
        if is_file:
            path = Path(value) if base is None or Path(value).is_absolute() else base / value
            secret = Secret(file=path)
            secret.get()  # unreadable now is a config error, not a 3 a.m. surprise
            return secret
        return Secret(value=value)
    except SecretError as err:
        raise ConfigError(f"{key}: {err}") from err


def _build(
    cls: type[Any], data: Any, path: str, *, skip: frozenset[str] = frozenset(), base: Path | None = None
) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    secret_files = {f"{name}_file": name for name, f in fields.items() if f.metadata.get("secret")}
    allowed = set(fields) | set(secret_files)
    unknown = sorted(set(data) - allowed)
    where = f"{path}." if path else ""
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{where}{unknown[0]}: unknown key{hint}; allowed here: {', '.join(sorted(allowed))}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{where}{name}"
        if name in secret_files:
            target = secret_files[name]
            if target in data:
                raise ConfigError(f"{key}: set either {target} or {name}, not both")
            kwargs[target] = _secret(key, value, is_file=True, base=base)
            continue
        f = fields[name]
        if f.metadata.get("secret"):
            kwargs[name] = _secret(key, value, is_file=False, base=base)
            continue
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            kwargs[name] = _build(hint, value, key, base=base)
        else:
            kwargs[name] = _convert(key, value, hint, f.metadata, base)
    return cls(**kwargs)


def _build_sinks(data: Any, base: Path | None) -> tuple[SinkSettings, ...]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"sinks: expected a table of named sinks ([sinks.NAME]), got {_describe(data)}")
    out: list[SinkSettings] = []
    for name, table in data.items():
        path = f"sinks.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{path}: expected a table, got {_describe(table)}")
        kind = table.get("type")
        if kind not in SINK_TYPES:
            raise ConfigError(
                f"{path}.type: {_describe(kind)} is not allowed; expected one of "
                + ", ".join(repr(k) for k in SINK_TYPES)
            )
        rest = {k: v for k, v in table.items() if k != "type"}
        sink = _build(SINK_TYPES[kind], rest, path, skip=frozenset({"type", "name"}), base=base)
        for required in REQUIRED_SECRETS.get(kind, ()):
            if getattr(sink, required) is None:
                raise ConfigError(f"{path}.{required}: required for a {kind} sink (or {required}_file)")
        _check_sink(path, sink)
        out.append(dataclasses.replace(sink, name=name))
    return tuple(out)


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT) -> (host, port); ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def _check_sink(path: str, sink: Any) -> None:
    """Checks that need more than one key's type."""
    if isinstance(sink, WebhookSinkSettings) and sink.signing_secret is not None:
        try:
            check_signing_secret(sink.signing_secret.get())
        except ValueError as err:
            raise ConfigError(f"{path}.signing_secret: {err}") from err
    if isinstance(sink, WebhookSinkSettings) and sink.batch and sink.format == "cloudevents-binary":
        raise ConfigError(
            f"{path}.batch: true is not allowed with format 'cloudevents-binary' (one event per request)"
        )
    if isinstance(sink, HttpSinkSettings) and (sink.cert_file is None) != (sink.key_file is None):
        raise ConfigError(f"{path}.cert_file: cert_file and key_file go together")
    urls = {"endpoint": getattr(sink, "endpoint", None), "url": getattr(sink, "url", None)}
    for key, url in urls.items():
        if isinstance(url, str) and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.{key}: {_describe(url)} is not allowed; expected an http(s) URL")
        if isinstance(url, Secret):
            value = url.get()
            if not value.startswith(("http://", "https://")):
                raise ConfigError(f"{path}.{key}: the value from {url.describe()} is not an http(s) URL")


def check_signing_secret(value: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret `whsec_<base64 of 24..64 bytes>`."""
    if not value.startswith("whsec_"):
        raise ValueError("expected a Standard Webhooks secret starting with whsec_")
    try:
        key = base64.b64decode(value.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the part after whsec_ is not valid base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"the key must be 24 to 64 bytes, got {len(key)}")
    return key


def parse_settings(data: Mapping[str, Any], *, base_dir: Path | None = None) -> Settings:
    """Settings from an already-parsed TOML document; relative paths resolve against `base_dir`."""
    data = dict(data)
    sinks = _build_sinks(data.pop("sinks"), base_dir) if "sinks" in data else None
    settings: Settings = _build(Settings, data, "", skip=frozenset({"sinks"}), base=base_dir)
    try:
        parse_listen(settings.http.listen)
    except ValueError:
        listen = _describe(settings.http.listen)
        raise ConfigError(
            f"http.listen: {listen} is not allowed; expected HOST:PORT, e.g. 0.0.0.0:9108"
        ) from None
    if sinks is not None:
        settings = dataclasses.replace(settings, sinks=sinks)
    return settings


def load_settings(path: Path) -> Settings:
    """Load a TOML config file; every problem is a ConfigError naming the key."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from err
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err
    return parse_settings(data, base_dir=path.resolve().parent)
