"""The nats sink's settings, and the checks a config must pass before it is used."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from watcher.config import ConfigError, field_meta
from watcher.secrets import Secret, remember_url_credentials
from watcher.sinks.base import BaseSinkSettings, check_client_files

__all__ = ["NatsSinkSettings", "check_settings"]

_DAY = 86400.0


@dataclass(frozen=True)
class NatsSinkSettings(BaseSinkSettings):
    servers: tuple[str, ...] = field(
        default=("nats://127.0.0.1:4222",),
        metadata=field_meta(
            "NATS server URLs (nats:// or tls://); the client tries them in turn and reconnects on "
            "its own. Credentials in a URL are never printed, but prefer the auth keys below."
        ),
    )
    subject_prefix: str = field(
        default="pod-resources",
        metadata=field_meta("Subjects are PREFIX.NODE.KIND (the node's dots become _)."),
    )
    stream: str = field(
        default="POD_RESOURCES",
        metadata=field_meta(
            "The JetStream stream the events must land in (each publish says so: one that another "
            "stream captures fails instead)."
        ),
    )
    create_stream: bool = field(
        default=False,
        metadata=field_meta(
            "Create the stream when it is missing (subjects PREFIX.>, file storage, stream_replicas, "
            "duplicate_window, stream_max_age); off: expect it provisioned, and retry until it is."
        ),
    )
    stream_replicas: int = field(
        default=3, metadata=field_meta("Replicas of a stream this sink creates.", min=1, max=5)
    )
    duplicate_window: float = field(
        default=_DAY,
        metadata=field_meta(
            "Duplicate window of a stream this sink creates, seconds: at least max_age, so a "
            "re-publish of anything the outbox still holds is dropped by the server.",
            min=1,
            max=30 * _DAY,
        ),
    )
    stream_max_age: float = field(
        default=14 * _DAY,
        metadata=field_meta(
            "How long a stream this sink creates keeps events, seconds (0: until its limits).",
            min=0,
        ),
    )
    max_in_flight: int = field(
        default=1,
        metadata=field_meta(
            "Publishes awaiting their acknowledgement at once. 1 keeps a node's events in seq order "
            "in the stream even across a failover; more is faster, and a retried event may then land "
            "after later ones (consumers order by the Prw-Seq header).",
            min=1,
            max=4000,
        ),
    )
    timeout: float = field(
        default=5.0,
        metadata=field_meta(
            "Seconds to wait for a connection, for the client to take a publish, or for its "
            "acknowledgement, before retrying.",
            min=0.1,
            max=300,
        ),
    )
    token: Secret | None = field(default=None, metadata=field_meta("Auth token (secret).", secret=True))
    user: str | None = field(default=None, metadata=field_meta("User name; goes with password."))
    password: Secret | None = field(
        default=None, metadata=field_meta("Password of `user` (secret).", secret=True)
    )
    nkey_seed: Secret | None = field(
        default=None,
        metadata=field_meta("NKey user seed, SU... (secret): the server knows its public key.", secret=True),
    )
    creds_file: Path | None = field(
        default=None,
        metadata=field_meta(
            "A .creds file (user JWT and NKey seed), for servers in operator mode.", private=True
        ),
    )
    ca_file: Path | None = field(
        default=None, metadata=field_meta("CA bundle to verify the servers with (TLS is then required).")
    )
    cert_file: Path | None = field(
        default=None, metadata=field_meta("Client certificate (PEM) for mutual TLS.")
    )
    key_file: Path | None = field(
        default=None, metadata=field_meta("Client key (PEM) for mutual TLS.", private=True)
    )
    # Batches: the worker hands up to max_batch events to one delivery, published back to back.
    max_batch: int = field(
        default=256, metadata=field_meta("Most events handed to one delivery.", min=1, max=10000)
    )
    rate: float = field(
        default=100.0, metadata=field_meta("Most deliveries per second.", min=0.001, max=10000)
    )
    max_age: float = field(
        default=_DAY,
        metadata=field_meta(
            "Seconds a queued event may wait before it is dropped (counted, logged); keep the "
            "stream's duplicate window at least this long.",
            min=1,
        ),
    )
    type: Literal["nats"] = "nats"


_SCHEMES = ("nats://", "tls://")
_BAD_TOKEN = re.compile(r"[\s*>]")
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


def check_settings(path: str, s: NatsSinkSettings) -> None:
    if not s.servers:
        raise ConfigError(f"{path}.servers: name at least one server, e.g. nats://nats.example:4222")
    for i, url in enumerate(s.servers):
        remember_url_credentials(url)
        if not url.startswith(_SCHEMES):
            raise ConfigError(f"{path}.servers[{i}]: not a nats:// or tls:// URL")
    tokens = s.subject_prefix.split(".")
    if any(not t or _BAD_TOKEN.search(t) for t in tokens):
        raise ConfigError(
            f"{path}.subject_prefix: dot-separated tokens without spaces or wildcards (* >), e.g. "
            "pod-resources or fleet.eu-1"
        )
    if not _STREAM_NAME.fullmatch(s.stream):
        raise ConfigError(f"{path}.stream: letters, digits, _ and - only (a JetStream stream name)")
    methods = [
        name
        for name, on in (
            ("token", s.token is not None),
            ("user/password", s.user is not None or s.password is not None),
            ("nkey_seed", s.nkey_seed is not None),
            ("creds_file", s.creds_file is not None),
        )
        if on
    ]
    if len(methods) > 1:
        raise ConfigError(f"{path}: one way to authenticate, not {' and '.join(methods)}")
    if (s.user is None) != (s.password is None):
        raise ConfigError(f"{path}.user: user and password go together")
    if s.nkey_seed is not None and not _is_user_seed(s.nkey_seed.get().strip()):
        raise ConfigError(f"{path}.nkey_seed: not an NKey user seed (those start with SU)")
    check_client_files(path, s, extra=("creds_file",))
    if s.create_stream and s.duplicate_window < s.max_age:
        raise ConfigError(
            f"{path}.duplicate_window: {s.duplicate_window:g} s is shorter than max_age "
            f"({s.max_age:g} s): an event re-published after that long would be stored twice; "
            "raise duplicate_window or lower max_age"
        )


def _is_user_seed(seed: str) -> bool:
    """Whether `seed` decodes as an NKey user seed: one that is not (a typo, a truncated paste)
    would make every connect raise instead of failing here, naming the key."""
    import nkeys  # type: ignore[import-untyped]  # nats-py's own dependency for NKeys, untyped

    try:
        prefix, key = nkeys.decode_seed(bytearray(seed.encode()))
    except (nkeys.NkeysError, ValueError):
        return False
    return bool(prefix == nkeys.PREFIX_BYTE_USER and len(key) == 32)
