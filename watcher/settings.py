"""Settings: frozen dataclasses with their defaults in one place, loaded from TOML.

Every bad input becomes one `ConfigError` line naming the key path, the bad
value and what is allowed; unknown keys are rejected, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from watcher.client import DEFAULT_MAX_RECEIVE_BYTES, DEFAULT_SOCKET, DEFAULT_TIMEOUT
from watcher.errors import WatcherError

__all__ = [
    "ConfigError",
    "KubeletSettings",
    "WatchSettings",
    "LogSettings",
    "StdoutSinkSettings",
    "FileSinkSettings",
    "SinkSettings",
    "Settings",
    "load_settings",
    "parse_settings",
]


class ConfigError(WatcherError):
    """The configuration is invalid; the message is one line naming the key."""


def _meta(doc: str, *, min: float | None = None, max: float | None = None) -> dict[str, Any]:
    return {"doc": doc, "min": min, "max": max}


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


@dataclass(frozen=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = field(default="info", metadata=_meta("Log level."))
    format: Literal["auto", "json", "console"] = field(
        default="auto", metadata=_meta("auto: console on a TTY, JSON otherwise.")
    )


@dataclass(frozen=True)
class StdoutSinkSettings:
    format: Literal["json", "text"] = field(
        default="json", metadata=_meta("json: one event per line; text: one readable line per event.")
    )
    type: Literal["stdout"] = "stdout"
    name: str = "stdout"


@dataclass(frozen=True)
class FileSinkSettings:
    path: Path = field(default=Path("events.jsonl"), metadata=_meta("JSONL file events are appended to."))
    fsync: bool = field(default=True, metadata=_meta("fsync after every batch of events."))
    type: Literal["file"] = "file"
    name: str = "file"


SinkSettings = StdoutSinkSettings | FileSinkSettings
SINK_TYPES: dict[str, type[StdoutSinkSettings] | type[FileSinkSettings]] = {
    "stdout": StdoutSinkSettings,
    "file": FileSinkSettings,
}


def _default_node() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def _default_sinks() -> tuple[SinkSettings, ...]:
    return (StdoutSinkSettings(),)


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
    sinks: tuple[SinkSettings, ...] = field(default_factory=_default_sinks)


# --- loading ---


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(path: str, value: Any, annotation: Any, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(annotation)
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
        return Path(value)
    raise AssertionError(f"unsupported settings type {annotation!r} at {path}")


def _build(cls: type[Any], data: Any, path: str, *, skip: frozenset[str] = frozenset()) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key; allowed here: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        key = f"{path}.{name}" if path else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            kwargs[name] = _build(hint, value, key)
        else:
            kwargs[name] = _convert(key, value, hint, f.metadata)
    return cls(**kwargs)


def _build_sinks(data: Any) -> tuple[SinkSettings, ...]:
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
        sink = _build(SINK_TYPES[kind], rest, path, skip=frozenset({"type", "name"}))
        out.append(dataclasses.replace(sink, name=name))
    return tuple(out)


def parse_settings(data: Mapping[str, Any], *, base_dir: Path | None = None) -> Settings:
    """Settings from an already-parsed TOML document; relative paths resolve against `base_dir`."""
    data = dict(data)
    sinks = _build_sinks(data.pop("sinks")) if "sinks" in data else None
    settings: Settings = _build(Settings, data, "", skip=frozenset({"sinks"}))
    if sinks is not None:
        settings = dataclasses.replace(settings, sinks=sinks)
    if base_dir is not None:
        settings = _resolve_paths(settings, base_dir)
    return settings


def _resolve_paths(settings: Settings, base: Path) -> Settings:
    def fix(p: Path) -> Path:
        return p if p.is_absolute() else base / p

    sinks = tuple(
        dataclasses.replace(s, path=fix(s.path)) if isinstance(s, FileSinkSettings) else s
        for s in settings.sinks
    )
    kubelet = dataclasses.replace(
        settings.kubelet, socket=fix(settings.kubelet.socket), root_dir=fix(settings.kubelet.root_dir)
    )
    return dataclasses.replace(settings, state_dir=fix(settings.state_dir), kubelet=kubelet, sinks=sinks)


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
