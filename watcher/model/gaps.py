"""A gap in one sink's stream: queued events its caps dropped before the sink had them.

A sink's queue is bounded (`max_queue`, `max_age`); when a cap drops events, the drop is never
silent. Every sink counts and logs it; a sink that keeps a stream of its own (the audit log)
also records the gap in that stream, where the events would have been, so that whoever reads
it (`audit verify`) learns that events are missing and which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Gap", "GAP_REASONS"]

# Why events were dropped: the cap that dropped them, named as its setting is.
GAP_REASONS = ("max_queue", "max_age")


@dataclass(frozen=True)
class Gap:
    """`count` of a sink's events, with seqs from `first` to `last`, were dropped from its queue
    (other events in that range may not have been the sink's at all: routing), because of
    `reasons`; `time` is when (RFC 3339, UTC) the last of them was dropped."""

    first: int
    last: int
    count: int
    reasons: tuple[str, ...]
    time: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "last": self.last,
            "dropped": self.count,
            "reasons": list(self.reasons),
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gap:
        """Read a gap back (the audit log); ValueError on any other shape."""
        try:
            first, last, count = data["first"], data["last"], data["dropped"]
            reasons, time = data["reasons"], data["time"]
            valid = (
                set(data) == {"first", "last", "dropped", "reasons", "time"}
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (first, last, count))
                and 1 <= first <= last
                and 1 <= count <= last - first + 1
                and isinstance(reasons, list)
                and all(isinstance(r, str) for r in reasons)
                and isinstance(time, str)
            )
        except (KeyError, TypeError):
            valid = False
        if not valid:
            raise ValueError("not a gap (expected {first, last, dropped, reasons, time})")
        return cls(first, last, count, tuple(reasons), time)

    def describe(self) -> str:
        events = "1 event" if self.count == 1 else f"{self.count} events"
        span = f"seq {self.first}" if self.first == self.last else f"seq {self.first}..{self.last}"
        return f"{span}: {events} dropped by the queue's caps ({', '.join(self.reasons)})"
