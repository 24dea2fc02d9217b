"""The sink types: each sink module registers its own, and everything else asks here.

A `SinkType` is all there is to know about one kind of sink: its settings
class, what it needs from the config beyond the types of single keys, how to
build it, and what it can do. A new sink type is one new module, or package, of
`watcher.sinks` named as its type, calling `register` once. The registry imports
a type's module when that type is first asked for, and every module only when all
of them are (a listing, an unknown type): an agent imports the sinks it is
configured with, not the others (about 2.5 MiB of RSS for all of them).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from watcher.config import ConfigError, build, describe
from watcher.sinks.base import (
    BaseSinkSettings,
    Capabilities,
    HttpSinkSettings,
    KeyValue,
    Sink,
    SinkContext,
    check_http_sink,
    check_kinds,
)

__all__ = [
    "SinkType",
    "SINK_SETTINGS",
    "register",
    "unregister",
    "find",
    "sink_type_of",
    "capabilities_of",
    "sink_types",
    "parse_sink",
    "build_sink",
    "build_sinks",
    "check_audit_heads",
    "audit_logs_of",
    "sink_warnings",
]

S = TypeVar("S", bound=BaseSinkSettings)


def _no_checks(path: str, settings: Any) -> None:
    return None


@dataclass(frozen=True)
class SinkType(Generic[S]):
    """One kind of sink, as its module registers it.

    `name` is the config's `type` (and the settings class's `type` default);
    `required_secrets` name secret fields that must be set; `validate(path,
    settings)` raises ConfigError for what needs more than one key; `order`
    places the type in listings such as the unknown-type error; `for_send_test`
    turns the settings into ones that `send-test` may deliver to without touching
    the real stream (e.g. another file), where the type keeps one; `audit_log(settings,
    state_dir)` says where a sink of the type keeps a hash-chained audit log, so that
    other sinks can report its head (`audit_head`); `warnings(path, settings)` names what
    works but is less safe than meant, one line per thing, each naming its key
    (`check-config` prints them, the agent logs them at start and on reload).
    """

    name: str
    settings: type[S]
    factory: Callable[[S, SinkContext], Sink]
    required_secrets: tuple[str, ...] = ()
    validate: Callable[[str, S], None] = _no_checks
    capabilities: Capabilities = field(default_factory=Capabilities)
    order: int = 1000
    for_send_test: Callable[[S], S] | None = None
    audit_log: Callable[[S, Path], Path] | None = None
    warnings: Callable[[str, S], list[str]] | None = None


_types: dict[str, SinkType[Any]] = {}
_discovered = False
_PACKAGE = __name__.rpartition(".")[0]


@functools.cache
def _module_names() -> tuple[str, ...]:
    package = importlib.import_module(_PACKAGE)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(package.__path__)))


def _load(name: str) -> None:
    """Import the module of the sink type `name` (a module of the package by that name), if there
    is one; a module already being imported is left to finish on its own."""
    if name in _types or f"{_PACKAGE}.{name}" in sys.modules or name not in _module_names():
        return
    importlib.import_module(f"{_PACKAGE}.{name}")


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True  # first: a module that asks the registry while it is imported must not recurse
    for name in _module_names():
        importlib.import_module(f"{_PACKAGE}.{name}")


def _refusal(sink_type: SinkType[Any]) -> str | None:
    cls = sink_type.settings
    if not (isinstance(cls, type) and issubclass(cls, BaseSinkSettings) and dataclasses.is_dataclass(cls)):
        return "its settings are not a BaseSinkSettings dataclass"
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return "its settings class is not frozen"
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if "type" not in fields or fields["type"].default != sink_type.name:
        return f"its settings class needs a field `type` defaulting to {sink_type.name!r}"
    for name in sink_type.required_secrets:
        if name not in fields or not fields[name].metadata.get("secret"):
            return f"required secret {name!r} is not a secret field of its settings"
    if sink_type.name in _types:
        # Its settings' `type` names it too, so no settings class can belong to two types.
        return "a sink type of that name is already registered"
    return None


def register(sink_type: SinkType[S]) -> SinkType[S]:
    """Add a sink type; ValueError if its name is taken or it is malformed.

    A sink module (a sink package's `sink` module, imported last by the package)
    calls this once, as its last statement: the module named as the type is
    imported first (so a taken name is refused here, whoever came first), and
    it may import from this one, which by then is complete.
    """
    _load(sink_type.name)
    problem = _refusal(sink_type)
    if problem is not None:
        raise ValueError(f"cannot register sink type {sink_type.name!r}: {problem}")
    _types[sink_type.name] = sink_type
    return sink_type


def unregister(name: str) -> None:
    """Remove a sink type (tests register their own and take them away again)."""
    del _types[name]


def sink_types() -> tuple[SinkType[Any], ...]:
    """Every registered sink type, in listing order."""
    _discover()
    return tuple(sorted(_types.values(), key=lambda t: (t.order, t.name)))


def find(name: object) -> SinkType[Any] | None:
    """The sink type a config's `type` value names, or None."""
    if not isinstance(name, str):
        return None
    _load(name)
    return _types.get(name)


def sink_type_of(settings: BaseSinkSettings) -> SinkType[Any]:
    """The sink type whose settings these are; LookupError for an unregistered settings class."""
    # Settings are made by their type's module, so it is registered: the others stay unimported.
    for discover in (False, True):
        if discover:
            _discover()
        for cls in type(settings).__mro__:
            for sink_type in _types.values():
                if sink_type.settings is cls:
                    return sink_type
    raise LookupError(f"{type(settings).__name__} belongs to no registered sink type")


def capabilities_of(settings: BaseSinkSettings) -> Capabilities:
    """What a sink with these settings can do; a sink built outside the registry (a test's, an
    embedder's) has the defaults: it does not page."""
    try:
        return sink_type_of(settings).capabilities
    except LookupError:
        return Capabilities()


class _SettingsClasses(Mapping[str, type[BaseSinkSettings]]):
    """Type name -> settings class of every registered sink type, in listing order; always current."""

    def __getitem__(self, name: str) -> type[BaseSinkSettings]:
        sink_type = find(name)
        if sink_type is None:
            raise KeyError(name)
        return sink_type.settings

    def __iter__(self) -> Iterator[str]:
        return iter([t.name for t in sink_types()])

    def __len__(self) -> int:
        return len(sink_types())


SINK_SETTINGS: Mapping[str, type[BaseSinkSettings]] = _SettingsClasses()


def parse_sink(path: str, table: Mapping[str, Any], *, base: Path | None) -> BaseSinkSettings:
    """One sink's settings from its TOML table at `path`, checked; its name is the caller's."""
    kind = table.get("type")
    sink_type = find(kind)
    if sink_type is None:
        given = "not a known sink type" if isinstance(kind, str) else f"got {describe(kind)}"
        raise ConfigError(
            f"{path}.type: {given}; expected one of " + ", ".join(repr(t.name) for t in sink_types())
        )
    rest = {k: v for k, v in table.items() if k != "type"}
    settings: BaseSinkSettings = build(
        sink_type.settings, rest, path, skip=frozenset({"type", "name"}), base=base
    )
    for required in sink_type.required_secrets:
        if getattr(settings, required) is None:
            raise ConfigError(f"{path}.{required}: required for a {sink_type.name} sink (or {required}_file)")
    check_kinds(path, settings)
    sink_type.validate(path, settings)
    if isinstance(settings, HttpSinkSettings):
        check_http_sink(path, settings)
    return settings


# A sink's name goes into the X-Audit-Head header of the sinks reporting its head.
_HEADER_SAFE = re.compile(r"[A-Za-z0-9_.-]+")


def check_audit_heads(configs: Sequence[BaseSinkSettings]) -> None:
    """Each sink's `audit_head` (where its settings have one) names a configured sink that keeps an
    audit log, by a name that can travel in a header; ConfigError naming the key otherwise."""
    logs = {cfg.name for cfg in configs if sink_type_of(cfg).audit_log is not None}
    for cfg in configs:
        wanted = getattr(cfg, "audit_head", None)
        if wanted is None:
            continue
        key = f"sinks.{cfg.name}.audit_head"
        if wanted not in logs:
            kept = ", ".join(repr(n) for n in sorted(logs)) or "none configured"
            raise ConfigError(f"{key}: names no file sink; expected the name of a file sink ({kept})")
        if not _HEADER_SAFE.fullmatch(wanted):
            raise ConfigError(
                f"{key}: that sink name cannot travel in a header; name the file sink with "
                "letters, digits, '_', '.' and '-' only"
            )


def sink_warnings(configs: Sequence[BaseSinkSettings]) -> list[str]:
    """Each sink type's warnings about its configured sinks; a sink built outside the registry (a
    test's, an embedder's) has none."""
    out: list[str] = []
    for cfg in configs:
        try:
            warn = sink_type_of(cfg).warnings
        except LookupError:
            continue
        if warn is not None:
            out += warn(f"sinks.{cfg.name}", cfg)
    return out


def audit_logs_of(configs: Sequence[BaseSinkSettings], state_dir: Path) -> dict[str, Path]:
    """Sink name -> the audit log it keeps, for every sink among `configs` that keeps one."""
    out = {}
    for cfg in configs:
        where = sink_type_of(cfg).audit_log
        if where is not None:
            out[cfg.name] = where(cfg, state_dir)
    return out


def build_sink(
    cfg: BaseSinkSettings,
    *,
    node: str,
    state_dir: Path,
    store: KeyValue,
    peers: Sequence[BaseSinkSettings] = (),
    kube_api: object | None = None,
) -> Sink:
    """Instantiate one configured sink; `peers` are the other configured sinks (whose audit logs
    it may report)."""
    context = SinkContext(
        node=node,
        state_dir=state_dir,
        store=store,
        audit_logs=audit_logs_of(peers, state_dir),
        kube_api=kube_api,
    )
    return sink_type_of(cfg).factory(cfg, context)


def build_sinks(
    configs: Sequence[BaseSinkSettings],
    *,
    node: str,
    state_dir: Path,
    store: KeyValue,
    kube_api: object | None = None,
) -> list[Sink]:
    return [
        build_sink(cfg, node=node, state_dir=state_dir, store=store, peers=configs, kube_api=kube_api)
        for cfg in configs
    ]
