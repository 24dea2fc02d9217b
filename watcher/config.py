"""Settings from TOML: frozen dataclasses whose fields carry their doc and bounds, built from tables.

Every bad input becomes one `ConfigError` line naming the key path, what KIND of
value was given (never the value: it may be a secret pasted into the wrong key)
and what is allowed; unknown keys are rejected, so a typo never silently falls
back to a default. Any layer can declare its settings here without
knowing the rest of the configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from watcher.errors import WatcherError
from watcher.secrets import Secret, SecretError, expand_env, remember_header

__all__ = ["ConfigError", "field_meta", "describe", "convert", "build"]


class ConfigError(WatcherError):
    """The configuration is invalid; the message is one line naming the key."""


def field_meta(
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    secret: bool = False,
    private: bool = False,
    in_state_dir: bool = False,
) -> dict[str, Any]:
    """A settings field's metadata: its doc line, numeric bounds, and whether it is a secret.

    A secret field `x` is also settable as `x_file`, and never prints its value. A `private`
    field is the path of a file that is a secret in itself (a TLS private key): it is warned
    about, like a secret file, when group or others may read it. An `in_state_dir` path is
    kept relative when written so (not resolved against the config file's directory): its
    user places it inside `state_dir`, which the config file may set after it or not at all.
    """
    return {
        "doc": doc,
        "min": min,
        "max": max,
        "secret": secret,
        "private": private,
        "in_state_dir": in_state_dir,
    }


def describe(value: Any) -> str:
    """A bad value as an error message shows it: what kind of value it is, never the value itself
    (a token pasted into the wrong key must not end up in a log or a terminal)."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string" if value else "an empty string"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return "a date or time" if hasattr(value, "isoformat") else f"a {type(value).__name__}"


def convert(path: str, value: Any, annotation: Any, meta: Mapping[str, Any], base: Path | None) -> Any:
    """One TOML value as the field's type, or a ConfigError naming `path`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        # `X | None`: TOML has no null, so a present key always means X.
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return convert(path, value, inner, meta, base)
    if origin is tuple:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
            raise ConfigError(f"{path}: got {describe(value)}; expected a list of non-empty strings")
        return tuple(items)
    if origin in (Mapping, dict):
        if typing.get_args(annotation)[1:] == (int,):
            return _count_table(path, value, meta)
        return _string_table(path, value)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            # The choices are ours to show; what was given is not.
            given = "not one of the choices" if isinstance(value, str) else f"got {describe(value)}"
            raise ConfigError(f"{path}: {given}; expected one of {', '.join(map(repr, allowed))}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: got {describe(value)}; expected true or false")
        return value
    if annotation in (int, float):
        return _number(path, value, annotation, meta)
    if annotation is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: got {describe(value)}; expected a non-empty string")
        return value
    if annotation is Path:
        return _path(path, value, meta, base)
    raise AssertionError(f"unsupported settings type {annotation!r} at {path}")


def _count_table(path: str, value: Any, meta: Mapping[str, Any]) -> dict[str, int]:
    """A table of whole numbers (a count per resource), each within the field's bounds."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: got {describe(value)}; expected a table of whole numbers")
    out: dict[str, int] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{path}.{k}: got {describe(v)}; expected a whole number")
        low, high = meta.get("min"), meta.get("max")
        if (low is not None and v < low) or (high is not None and v > high):
            raise ConfigError(f"{path}.{k}: out of range; expected {low:g} to {high:g}")
        out[str(k)] = v
    return out


def _string_table(path: str, value: Any) -> dict[str, str]:
    """A table of strings (HTTP headers), its ${ENV} references checked."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: got {describe(value)}; expected a table of strings")
    for k, v in value.items():
        if not isinstance(v, str):
            raise ConfigError(f"{path}.{k}: got {describe(v)}; expected a string")
    try:
        for v in value.values():
            expand_env(v)  # an unset variable is a config error now, not a failed send later
    except SecretError as err:
        raise ConfigError(f"{path}: {err}") from err
    # Kept as written: ${ENV} values are expanded on each send, never stored or printed.
    # Credential headers' values written in the file are secrets from now on too.
    return {str(k): remember_header(str(k), v) for k, v in value.items()}


def _path(path: str, value: Any, meta: Mapping[str, Any], base: Path | None) -> Path:
    """A path, relative to `base` (the config file's directory) unless it is absolute or kept
    relative to the state directory."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: got {describe(value)}; expected a path")
    if base is None or Path(value).is_absolute() or meta.get("in_state_dir"):
        return Path(value)
    return base / value


def _bounds(low: float | None, high: float | None) -> str:
    """A number key's bounds as its error says them; empty when it has none."""
    if low is not None and high is not None:
        return f"between {low:g} and {high:g}"
    if low is not None:
        return f"at least {low:g}"
    return f"at most {high:g}" if high is not None else ""


def _number(path: str, value: Any, annotation: type[float] | type[int], meta: Mapping[str, Any]) -> float:
    """A TOML number as the field's int or float, finite and within the field's bounds."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and annotation is int:
        # Not float(value).is_integer(): an integer past a float's range raises OverflowError.
        ok = isinstance(value, int) or value.is_integer()
    if not ok:
        kind = "a whole number" if annotation is int else "a number"
        raise ConfigError(f"{path}: got {describe(value)}; expected {kind}")
    low, high = meta.get("min"), meta.get("max")
    bounds = _bounds(low, high)
    # TOML has nan, inf and -inf literals (and reads 1e400 as inf). nan passes every comparison
    # with a bound (warmup_grace = nan held a lost plugin for ever), inf passes a missing maximum,
    # and no setting means "no limit" by inf: all three are refused here, where every number of
    # every settings table (the agent's and each sink's) passes. They are no secret to show.
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: got {value!r}; expected {f'a finite number {bounds}'.rstrip()}")
    try:
        number = annotation(value)
    except OverflowError:  # an integer past a float's range, out of any range
        raise ConfigError(f"{path}: out of range; expected {bounds or 'a finite number'}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        raise ConfigError(f"{path}: out of range; expected {bounds}")
    return number


def _secret(key: str, value: Any, *, is_file: bool, base: Path | None) -> Secret:
    if not isinstance(value, str) or not value:
        expected = "a path" if is_file else "a non-empty string (a value or ${ENV_VAR})"
        raise ConfigError(f"{key}: got {describe(value)}; expected {expected}")
    try:
        if is_file:
            path = Path(value) if base is None or Path(value).is_absolute() else base / value
            secret = Secret(file=path)
            secret.get()  # unreadable now is a config error, not a 3 a.m. surprise
            return secret
        return Secret(value=value)
    except SecretError as err:
        raise ConfigError(f"{key}: {err}") from err


# Keys that moved, and where to: a config written for an earlier version is told where, not refused
# as a typo.
MOVED = {
    "pods.resource_slices": "[resource_slices] enabled",
    "pods.resource_slices_interval": "[resource_slices] interval",
}


def build(
    cls: type[Any], data: Any, path: str, *, skip: frozenset[str] = frozenset(), base: Path | None = None
) -> Any:
    """An instance of the settings dataclass `cls` from the table `data` found at `path`.

    Fields in `skip` are not settable here; nested dataclasses are built from
    sub-tables; relative paths resolve against `base`.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: got {describe(data)}; expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    secret_files = {f"{name}_file": name for name, f in fields.items() if f.metadata.get("secret")}
    allowed = set(fields) | set(secret_files)
    unknown = sorted(set(data) - allowed)
    where = f"{path}." if path else ""
    if unknown and f"{where}{unknown[0]}" in MOVED:
        raise ConfigError(f"{where}{unknown[0]}: moved; set {MOVED[f'{where}{unknown[0]}']} instead")
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
            kwargs[name] = build(hint, value, key, base=base)
        else:
            kwargs[name] = convert(key, value, hint, f.metadata, base)
    return cls(**kwargs)
