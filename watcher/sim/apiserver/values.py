"""The values the fake API server handles: JSON objects, a path into one, and the API's two time
formats (Time, to the second, and MicroTime)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

__all__ = ["Json", "dig", "micro_time", "now", "timestamp"]

Json = dict[str, Any]


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def timestamp(t: dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: dt.datetime | None = None) -> str:
    """A MicroTime as the real server writes one: six fractional digits, UTC."""
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dig(obj: Any, path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj
