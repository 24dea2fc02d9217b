"""Retry-After, read: the seconds an HTTP answer asks a client to wait, from either of its forms.
Every HTTP client of the agent (the sinks, the Kubernetes API client) reads it the same way."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["parse_retry_after"]

_DELTA_SECONDS = re.compile(r"[0-9]+")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; never raises.

    None when the value is neither (`1e20`, `-5`, `²`, a date past year 9999): the caller's own
    backoff applies. A huge but valid value comes back as it is (possibly inf); capping it is
    the delivery worker's job, with the sink's `retry_after_max`.
    """
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)  # thousands of digits give inf, not an error
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
