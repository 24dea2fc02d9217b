"""The settings file: TOML read into `Settings`, the rules that span keys checked, and what
`check-config` shows of the result and warns about.

Every bad input becomes one `ConfigError` line naming the key path, the kind of value given
(never the value) and what is allowed (see `watcher.config`); each sink's table is read by its
sink type (see `watcher.sinks.registry`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from watcher.config import ConfigError, build, describe
from watcher.files import is_system_directory
from watcher.kubeapi.kubeconfig import check_client_config, clear_text_warning
from watcher.kubeapi.settings import ConnectionSettings
from watcher.secrets import ENV_REF, REDACTED, Secret, SecretError, file_exposure, redact
from watcher.settings import HttpSettings, Settings
from watcher.sinks.base import BaseSinkSettings
from watcher.sinks.registry import check_audit_heads, parse_sink, sink_warnings
from watcher.sources.expected_settings import ExpectedSettings, check_expected
from watcher.tls import ServerTls, TlsError

__all__ = [
    "load_settings",
    "parse_settings",
    "parse_listen",
    "expand_listen",
    "printable",
    "config_warnings",
]


def _build_sinks(data: Any, base: Path | None) -> tuple[BaseSinkSettings, ...]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"sinks: got {describe(data)}; expected a table of named sinks ([sinks.NAME])")
    out: list[BaseSinkSettings] = []
    for name, table in data.items():
        path = f"sinks.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{path}: got {describe(table)}; expected a table")
        out.append(dataclasses.replace(parse_sink(path, table, base=base), name=name))
    check_audit_heads(out)
    return tuple(out)


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT) -> (host, port); ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        # fd00::1:9108 could be an address without a port: only [fd00::1]:9108 says which.
        raise ValueError(f"{value!r} is not HOST:PORT: write an IPv6 address in brackets, [ADDRESS]:PORT")
    if not host.strip("[]"):
        # No host is no default: an empty ${POD_IP} must not quietly mean every interface.
        raise ValueError(f"{value!r} is not HOST:PORT: the host is missing (0.0.0.0 for every interface)")
    return host.strip("[]"), int(port)


def expand_listen(value: str) -> str:
    """`value` with each ${NAME} replaced by the environment variable; an address with a ':' (IPv6)
    is bracketed unless the reference already is, so ${POD_IP}:9108 serves either family.
    SecretError if a variable is not set."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if found is None:
            raise SecretError(f"environment variable {name} is not set")
        found = found.strip()
        if not found:
            raise SecretError(f"environment variable {name} is empty")
        bracketed = value[: match.start()].endswith("[") and value[match.end() :].startswith("]")
        return f"[{found}]" if ":" in found and not bracketed else found

    return ENV_REF.sub(sub, value)


# As for the audit log's key: long enough that trying tokens over the network is hopeless.
MIN_TOKEN_CHARS = 16


def _check_http(http: HttpSettings) -> HttpSettings:
    """The [http] rules that span keys; returns it with `listen` expanded."""
    try:
        listen = expand_listen(http.listen)
    except SecretError as err:
        raise ConfigError(f"http.listen: {err}") from None
    try:
        parse_listen(listen)
    except ValueError as err:
        # The value itself is not shown (no config error shows one); what went wrong is.
        expanded = " once its ${VAR}s are expanded" if listen != http.listen else ""
        brackets = "; write an IPv6 address in brackets" if "brackets" in str(err) else ""
        brackets += "; the host is missing (0.0.0.0 for every interface)" if "missing" in str(err) else ""
        raise ConfigError(
            f"http.listen: not HOST:PORT{expanded}; expected e.g. 127.0.0.1:9108, [::1]:9108 or "
            f"${{POD_IP}}:9108{brackets}"
        ) from None
    if (http.tls_cert_file is None) != (http.tls_key_file is None):
        raise ConfigError("http.tls_cert_file: set both tls_cert_file and tls_key_file, or neither")
    if http.tls_client_ca_file is not None and http.tls_cert_file is None:
        raise ConfigError(
            "http.tls_client_ca_file: client certificates need HTTPS: set tls_cert_file and tls_key_file too"
        )
    if http.tls_cert_file is not None and http.tls_key_file is not None:
        try:
            ServerTls(http.tls_cert_file, http.tls_key_file, http.tls_client_ca_file).context()
        except TlsError as err:
            raise ConfigError(f"http.tls_cert_file: {err}") from None
    if http.inventory_token is not None and len(http.inventory_token.get()) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"http.inventory_token: shorter than {MIN_TOKEN_CHARS} characters, which can be guessed; "
            "make one with e.g. `openssl rand -base64 32`"
        )
    if http.inventory and http.inventory_token is None and http.tls_client_ca_file is None:
        raise ConfigError(
            "http.inventory: /inventory shows every pod's devices, so it needs inventory_token_file "
            "(a bearer token) or tls_client_ca_file (client certificates); set one, or leave it off"
        )
    return dataclasses.replace(http, listen=listen)


def parse_settings(data: Mapping[str, Any], *, base_dir: Path | None = None) -> Settings:
    """Settings from an already-parsed TOML document; relative paths resolve against `base_dir`."""
    data = dict(data)
    sinks = _build_sinks(data.pop("sinks"), base_dir) if "sinks" in data else None
    settings: Settings = build(Settings, data, "", skip=frozenset({"sinks"}), base=base_dir)
    settings = dataclasses.replace(settings, http=_check_http(settings.http))
    if is_system_directory(settings.state_dir):  # named by its key, as every config error
        raise ConfigError("state_dir: a system directory, which the agent would make 0700: give it its own")
    if sinks is not None:
        settings = dataclasses.replace(settings, sinks=sinks)
    api = settings.kubernetes.api == "on" or (
        settings.kubernetes.api == "auto" and any(isinstance(s, ConnectionSettings) for s in settings.sinks)
    )
    check_expected(settings.expected, api=api)
    return _one_connection(settings)


def _one_connection(settings: Settings) -> Settings:
    """The connection [kubernetes] sets, checked as a sink's is, and given to every kubernetes sink
    (so the agent, `send-test` and `kubernetes cleanup` all reach the API server alike). A sink that
    sets a connection key of its own as well is refused: one of the two would be ignored."""
    k = settings.kubernetes
    if k.connection_is_default():
        return settings
    keys = [f.name for f in dataclasses.fields(ConnectionSettings)]
    default = ConnectionSettings()
    for sink in settings.sinks:
        if isinstance(sink, ConnectionSettings):
            named = [key for key in keys if getattr(sink, key) != getattr(default, key)]
            if named:
                raise ConfigError(
                    f"sinks.{sink.name}.{named[0]}: [kubernetes] sets the agent's connection to the "
                    "API server; set the connection there or in the sink, not in both"
                )
    if k.kubeconfig is not None and k.server is not None:
        raise ConfigError("kubernetes.server: only for in-cluster use; the kubeconfig names its server")
    check_client_config("kubernetes", k)
    given = {key: getattr(k, key) for key in keys}
    sinks = tuple(
        dataclasses.replace(s, **given) if isinstance(s, ConnectionSettings) else s for s in settings.sinks
    )
    return dataclasses.replace(settings, sinks=sinks)


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


def _shown(obj: Any) -> Any:
    """`obj` (a settings dataclass, or a value in one) as `printable` shows it."""
    if isinstance(obj, Secret):
        return str(obj)  # where it comes from, never what it is
    if isinstance(obj, ExpectedSettings):  # resource names, counts and label keys: no secret in them
        return {"devices": dict(obj.devices), "labels": dict(obj.labels), "interval": obj.interval}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _shown(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):  # headers: credentials more often than not, whatever their source
        return {str(k): REDACTED for k in obj}
    if isinstance(obj, tuple | list):
        return [_shown(v) for v in obj]
    if isinstance(obj, str):
        return redact(obj)  # a URL's credentials and query too, known or not
    if isinstance(obj, Path):
        return str(obj)
    return obj


def printable(settings: Settings) -> dict[str, Any]:
    """The settings as `check-config` prints them (JSON-ready): secrets as where they come from,
    header values as ***, URLs without credentials or query, any known secret scrubbed."""
    out: dict[str, Any] = _shown(settings)
    return out


def _secret_files(obj: Any, path: str) -> list[str]:
    """`KEY: problem` for each secret file (a secret's `_file`, a private key's path) under `obj`
    that group or others may read or write."""
    found: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Secret):
            problem = value.exposure()
            if problem is not None:
                found.append(f"{path}{f.name}_file: {problem}")
        elif isinstance(value, Path) and f.metadata.get("private"):
            problem = file_exposure(value)
            if problem is not None:
                found.append(f"{path}{f.name}: {problem}")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += _secret_files(value, f"{path}{f.name}.")
    return found


def config_warnings(settings: Settings) -> list[str]:
    """One line per thing in the settings that works but is less safe than meant, naming its
    key: secret files that group or others may read or write, an /inventory token sent in clear
    text over the network, and what a sink's type warns of (the kubernetes sink: its token sent
    in clear text to a loopback http:// server). Warnings, not errors: the agent works either way."""
    warnings = _secret_files(settings, "")
    for sink in settings.sinks:
        warnings += _secret_files(sink, f"sinks.{sink.name}.")
    warnings += sink_warnings(settings.sinks)
    if not any(isinstance(s, ConnectionSettings) for s in settings.sinks):  # else a sink said it
        said = clear_text_warning(settings.kubernetes)
        key = "kubeconfig" if settings.kubernetes.kubeconfig is not None else "server"
        warnings += [] if said is None else [f"kubernetes.{key}: {said}"]
    http = settings.http
    if http.inventory and http.inventory_token is not None and http.tls_cert_file is None:
        host = parse_listen(http.listen)[0]
        if not _is_loopback(host):
            warnings.append(
                f"http.inventory_token: the token travels in clear text to {host}: anyone who can "
                "watch that network can read it; set tls_cert_file and tls_key_file for HTTPS"
            )
    return warnings


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
