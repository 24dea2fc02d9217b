"""Logging with structlog: JSON when not on a TTY, readable console output on one.

Standard-library loggers (watchfiles, asyncio, aiohttp) go through the same
renderer, so every line has one shape. gRPC's C-core is kept to its errors in
`watcher/__init__.py`, before grpc is imported.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from watcher.secrets import redact

__all__ = ["configure_logging"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Last line of defence: no known secret value leaves in a log line."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = redact(value)
    return event_dict


def _component(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Every line says which part of the agent wrote it (watcher.app -> agent)."""
    name = event_dict.pop("logger", None)
    if name and "component" not in event_dict:
        event_dict["component"] = str(name).removeprefix("watcher.")
    return event_dict


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    stream = stream if stream is not None else sys.stderr
    numeric = _LEVELS[level]
    use_console = fmt == "console" or (fmt == "auto" and stream.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _component,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=stream.isatty())
        if use_console
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            # Tracebacks become a string here so that they are redacted too.
            structlog.processors.format_exc_info,
            _redact_secrets,
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.processors.format_exc_info, _redact_secrets],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Chatty at INFO for our purposes; their warnings still come through.
    for noisy in ("watchfiles", "asyncio"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
