"""What the snapshot's parts share: asking a busy kubelet patiently, and a table and a size for
people to read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from watcher import errors
from watcher.backoff import Backoff, retry
from watcher.model.wording import printable

__all__ = ["format_bytes", "patiently", "table"]

T = TypeVar("T")


# The kubelet's bucket is shared by every client on the node: a one-shot
# snapshot rides out a busy moment instead of failing on it.
RATE_LIMIT_ATTEMPTS = 6
RATE_LIMIT_BACKOFF = Backoff(base=0.05, cap=1.0)


async def patiently(call: Callable[[], Awaitable[T]]) -> T:
    return await retry(
        call, retry_on=(errors.RateLimitedError,), attempts=RATE_LIMIT_ATTEMPTS, backoff=RATE_LIMIT_BACKOFF
    )


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    # Columns measured as shown: an escaped character is several columns wide, a combining mark
    # took none. (`printable` of the whole line later leaves these cells as they are.)
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(headers), *(line(r) for r in rows)]
