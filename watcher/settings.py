"""The agent's settings: frozen dataclasses with their defaults in one place, loaded from TOML.

Every bad input becomes one `ConfigError` line naming the key path, the kind of
value given (never the value) and what is allowed (see `watcher.config`); each sink's table is read by
its sink type (see `watcher.sinks.registry`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from watcher.config import ConfigError, build, describe, field_meta
from watcher.kubelet.client import DEFAULT_MAX_RECEIVE_BYTES, DEFAULT_SOCKET, DEFAULT_TIMEOUT
from watcher.secrets import ENV_REF, REDACTED, Secret, SecretError, file_exposure, redact
from watcher.sinks.base import BaseSinkSettings
from watcher.sinks.registry import check_audit_heads, parse_sink
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.tls import ServerTls, TlsError

__all__ = [
    "KubeletSettings",
    "WatchSettings",
    "LogSettings",
    "HttpSettings",
    "Settings",
    "load_settings",
    "parse_settings",
    "parse_listen",
    "printable",
    "config_warnings",
    "default_node_name",
    "expand_listen",
]


@dataclass(frozen=True)
class KubeletSettings:
    socket: Path = field(
        default=Path(DEFAULT_SOCKET),
        metadata=field_meta(
            "The kubelet's pod-resources socket. Its DIRECTORY is watched and must be mounted."
        ),
    )
    root_dir: Path = field(
        default=Path("/var/lib/kubelet"),
        metadata=field_meta(
            "The kubelet's root dir: device-plugins/ and the CPU/memory/DRA manager state files."
        ),
    )
    timeout: float = field(
        default=DEFAULT_TIMEOUT, metadata=field_meta("Deadline of each call, seconds.", min=0.001, max=600)
    )
    max_receive_bytes: int = field(
        default=DEFAULT_MAX_RECEIVE_BYTES,
        metadata=field_meta(
            "Largest response accepted, bytes; it bounds the agent's memory too (about 16x).", min=1024
        ),
    )
    unreachable_grace: float = field(
        default=30.0,
        metadata=field_meta(
            "Seconds of failed queries before `kubelet.unreachable` is reported.", min=0, max=86400
        ),
    )
    warmup_grace: float = field(
        default=60.0,
        metadata=field_meta(
            "Seconds to wait, after a kubelet or device plugin restart, for the plugins to register "
            "again and List to fill in before what is still missing is reported.",
            min=0,
            max=3600,
        ),
    )


@dataclass(frozen=True)
class WatchSettings:
    interval: float = field(
        default=30.0, metadata=field_meta("Periodic re-query, seconds: the safety net.", min=0.05, max=86400)
    )
    jitter: float = field(
        default=0.1,
        metadata=field_meta(
            "Fraction of `interval` by which each period varies, so nodes spread out.", min=0, max=1
        ),
    )
    debounce: float = field(
        default=0.02,
        metadata=field_meta("Seconds to gather more triggers into one re-query.", min=0, max=5),
    )
    max_rpc_rate: float = field(
        default=5.0,
        metadata=field_meta(
            "Most RPCs per second we send; the kubelet allows 100/s for ALL clients.", min=0.1, max=50
        ),
    )
    state_file_triggers: bool = field(
        default=True,
        metadata=field_meta(
            "Re-query when the kubelet's checkpoint, CPU/memory/DRA state or plugin sockets change."
        ),
    )
    force_polling: bool = field(
        default=False, metadata=field_meta("Poll directories instead of using inotify.")
    )
    poll_interval: float = field(
        default=0.1,
        metadata=field_meta("Polling period when inotify is unavailable, seconds.", min=0.01, max=60),
    )
    snapshot_interval: float = field(
        default=0.0,
        metadata=field_meta(
            "Emit an inventory.snapshot event this often so push consumers can reconcile; 0: never.",
            min=0,
            max=7 * 86400,
        ),
    )
    incident_threshold: int = field(
        default=8,
        metadata=field_meta(
            "This many devices of one resource leaving allocatable in one re-query are one "
            "device.incident for paging sinks instead of a page each; 0: never.",
            min=0,
            max=100000,
        ),
    )
    flap_limit: int = field(
        default=4,
        metadata=field_meta(
            "A device with more health changes than this within flap_window is flapping: "
            "notification sinks get one device.flapping instead of each change; 0: never.",
            min=0,
            max=1000,
        ),
    )
    flap_window: float = field(
        default=600.0, metadata=field_meta("The window flap_limit counts in, seconds.", min=1, max=86400)
    )
    flap_quiet: float = field(
        default=300.0,
        metadata=field_meta(
            "A flapping device stable this long gets device.flap_ended, seconds.", min=1, max=86400
        ),
    )


@dataclass(frozen=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata=field_meta("Log level.")
    )
    format: Literal["auto", "json", "console"] = field(
        default="auto", metadata=field_meta("auto: console on a TTY, JSON otherwise.")
    )


@dataclass(frozen=True)
class HttpSettings:
    enabled: bool = field(
        default=True, metadata=field_meta("Serve /metrics, /healthz, /readyz (and /inventory if enabled).")
    )
    listen: str = field(
        default="127.0.0.1:9108",
        metadata=field_meta(
            "HOST:PORT to listen on; loopback by default. ${NAME} is replaced by that environment "
            "variable (an address with ':' gets its [brackets]), e.g. ${POD_IP}:9108; port 0: any free port."
        ),
    )
    ready_stale_after: float = field(
        default=120.0,
        metadata=field_meta(
            "/readyz fails when the last successful re-query is older than this, seconds.", min=1
        ),
    )
    inventory: bool = field(
        default=False,
        metadata=field_meta(
            "Serve /inventory (every pod's devices): needs inventory_token(_file) or tls_client_ca_file."
        ),
    )
    inventory_token: Secret | None = field(
        default=None,
        metadata=field_meta(
            "Bearer token /inventory requires (Authorization: Bearer ...); the file is re-read when it "
            "changes.",
            secret=True,
        ),
    )
    tls_cert_file: Path | None = field(
        default=None,
        metadata=field_meta("Server certificate (PEM): with tls_key_file, the server speaks HTTPS only."),
    )
    tls_key_file: Path | None = field(
        default=None, metadata=field_meta("The server certificate's private key (PEM).", private=True)
    )
    tls_client_ca_file: Path | None = field(
        default=None,
        metadata=field_meta(
            "CA (PEM) client certificates must chain to; a verified client certificate admits to /inventory."
        ),
    )
    header_timeout: float = field(
        default=10.0,
        metadata=field_meta(
            "A connection whose request headers (TLS handshake included) are not complete this long "
            "after it opened, or after their first byte, is closed, seconds.",
            min=0.1,
            max=300,
        ),
    )
    idle_timeout: float = field(
        default=60.0,
        metadata=field_meta(
            "A kept-alive connection with no new request this long after its last answer is closed, seconds.",
            min=0.1,
            max=3600,
        ),
    )
    request_timeout: float = field(
        default=60.0,
        metadata=field_meta(
            "A request not answered to its last byte this long after its headers (a client that reads "
            "slowly) is cut off, seconds.",
            min=0.1,
            max=3600,
        ),
    )
    max_connections: int = field(
        default=100,
        metadata=field_meta(
            "Most HTTP connections open at once; the next one closes the connection that has waited "
            "longest without a request in flight. Each costs a file descriptor.",
            min=2,
            max=10000,
        ),
    )
    max_device_series: int = field(
        default=1024,
        metadata=field_meta(
            "Most device_healthy series /metrics exports (failed devices first); beyond it devices are "
            "left out, counted in device_series_omitted and logged. 0: no device_healthy at all.",
            min=0,
            max=100000,
        ),
    )


def default_node_name() -> str:
    """The node this runs on: $NODE_NAME, else the hostname; ConfigError if that is no UTF-8 text,
    as no event naming it could ever be stored (Python keeps the bad bytes as lone surrogates)."""
    node = os.environ.get("NODE_NAME") or socket.gethostname()
    try:
        node.encode()
    except UnicodeEncodeError:
        source = "$NODE_NAME" if os.environ.get("NODE_NAME") else "the hostname"
        raise ConfigError(f"node: {source} is not valid UTF-8; set node in the config file") from None
    return node


def _default_sinks() -> tuple[BaseSinkSettings, ...]:
    return (StdoutSinkSettings(name="stdout"),)


@dataclass(frozen=True)
class Settings:
    node: str = field(
        default_factory=default_node_name,
        metadata=field_meta("Node name; default $NODE_NAME, else hostname."),
    )
    state_dir: Path = field(
        default=Path("/var/lib/pod-resources-watcher"),
        metadata=field_meta("Where the state (and the outbox) live; hostPath in a DaemonSet."),
    )
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    log: LogSettings = field(default_factory=LogSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    sinks: tuple[BaseSinkSettings, ...] = field(
        default_factory=_default_sinks,
        metadata=field_meta(
            "Where events go: a table per sink, [sinks.NAME], named by you; its `type` says which kind. "
            "Without any [sinks.*] table, events go to stdout as JSON lines."
        ),
    )


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


def _shown(obj: Any) -> Any:
    """`obj` (a settings dataclass, or a value in one) as `printable` shows it."""
    if isinstance(obj, Secret):
        return str(obj)  # where it comes from, never what it is
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
    key: secret files that group or others may read or write, and an /inventory token sent in
    clear text over the network. Warnings, not errors: the agent works either way."""
    warnings = _secret_files(settings, "")
    for sink in settings.sinks:
        warnings += _secret_files(sink, f"sinks.{sink.name}.")
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
