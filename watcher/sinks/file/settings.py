"""The file sink's settings, their checks, and where its log lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from watcher.config import ConfigError, field_meta
from watcher.secrets import Secret
from watcher.sinks.base import BaseSinkSettings

__all__ = ["FileSinkSettings", "MIN_KEY_CHARS", "check_settings", "log_path"]


@dataclass(frozen=True)
class FileSinkSettings(BaseSinkSettings):
    path: Path = field(
        default=Path("events.jsonl"),
        metadata=field_meta("The JSONL audit log; a relative path is inside state_dir.", in_state_dir=True),
    )
    fsync: Literal["event", "interval"] = field(
        default="event",
        metadata=field_meta(
            "event: fsync every batch before it is acknowledged; interval: every fsync_interval seconds."
        ),
    )
    fsync_interval: float = field(
        default=1.0, metadata=field_meta("Seconds between fsyncs.", min=0.01, max=3600)
    )
    max_bytes: int = field(
        default=100 * 1024 * 1024, metadata=field_meta("Rotate when the log reaches this size.", min=1024)
    )
    keep: int = field(
        default=5, metadata=field_meta("Rotated files kept (events.jsonl.1 ... .N).", min=1, max=1000)
    )
    rate: float = field(
        default=1000.0, metadata=field_meta("Most batches written per second.", min=0.001, max=100000)
    )
    max_batch: int = field(
        default=500,
        metadata=field_meta(
            "Most events written at once: one write, one fsync, one head file and one outbox "
            "transaction for them all.",
            min=1,
            max=10000,
        ),
    )
    key: Secret | None = field(
        default=None,
        metadata=field_meta(
            "Key of a keyed chain: each record's hash is an HMAC-SHA256 with it, so the log cannot be "
            "re-chained without it (secret, at least 16 characters; keep it from whoever can write "
            "the log; `audit verify --key-file`).",
            secret=True,
        ),
    )
    type: Literal["file"] = "file"


MIN_KEY_CHARS = 16


def check_settings(path: str, settings: FileSinkSettings) -> None:
    """ConfigError for a key too short to resist guessing."""
    if settings.key is not None and len(settings.key.get()) < MIN_KEY_CHARS:
        raise ConfigError(
            f"{path}.key: the key from {settings.key.describe()} is shorter than {MIN_KEY_CHARS} "
            "characters (e.g. `openssl rand -base64 32`)"
        )


def log_path(settings: FileSinkSettings, state_dir: Path) -> Path:
    """Where the log is: a relative path (the default's, or one written so: the loader keeps it
    relative) lives in the state directory."""
    return settings.path if settings.path.is_absolute() else state_dir / settings.path
