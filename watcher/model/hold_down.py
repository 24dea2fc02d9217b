"""Hold-down: the end of a condition waits before a sink tells it, so a flapping device is one
episode (one page, one incident) rather than a page and a resolve per flip. Pure: the caller brings
the time (a boot-clock reading and the boot's id) and keeps the state.

A condition's start is told at once; its end is held for `hold_down` seconds; a start within that
time cancels the held end, so the incident the first start opened stays open (an update at most).
Held ends are plain data (`HeldEnds.to_json`), so a sink keeps them in its durable state and an
agent restarted during a hold-down still tells the end, once, when it is due.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Step", "decide", "HeldEnd", "HeldEnds"]


class Step(enum.StrEnum):
    OPEN = "open"  # a condition starts: tell it at once
    UPDATE = "update"  # active again while open: the same incident (an update at most)
    HOLD = "hold"  # its end, held until due
    END = "end"  # its end, told at once (no hold-down)
    PASS = "pass"  # the end of a condition never opened here: nothing to end


def decide(active: bool, *, is_open: bool, hold_down: float) -> Step:
    """What a sink does with a condition's event, given whether it opened that condition."""
    if active:
        return Step.UPDATE if is_open else Step.OPEN
    if not is_open:
        return Step.PASS
    return Step.HOLD if hold_down > 0 else Step.END


@dataclass(frozen=True)
class HeldEnd:
    """One held end: due at `due` on the boot clock of boot `boot`; `payload` is what the sink
    needs to tell it then (the event that ended the condition, as JSON)."""

    due: float
    boot: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldEnds:
    held: Mapping[str, HeldEnd] = field(default_factory=dict)

    def hold(
        self, key: str, *, now: float, boot: str, hold_down: float, payload: Mapping[str, Any]
    ) -> HeldEnds:
        """`key`'s end held for `hold_down` from `now`; one already held keeps its due time (an end
        delivered again after a crash must not push its resolve further away)."""
        if key in self.held:
            return self
        return HeldEnds({**self.held, key: HeldEnd(now + hold_down, boot, dict(payload))})

    def cancel(self, key: str) -> HeldEnds:
        """The condition started again: its end is no longer due."""
        if key not in self.held:
            return self
        return HeldEnds({k: v for k, v in self.held.items() if k != key})

    def rebased(self, *, now: float, boot: str, hold_down: float) -> HeldEnds:
        """Ends held in another boot (their boot-clock readings mean nothing now) wait one
        `hold_down` from `now`; none is lost, and none is due early."""
        if all(h.boot == boot for h in self.held.values()):
            return self
        return HeldEnds(
            {
                k: h if h.boot == boot else replace(h, due=now + hold_down, boot=boot)
                for k, h in self.held.items()
            }
        )

    def due(self, now: float) -> list[tuple[str, HeldEnd]]:
        """The held ends due at `now`, the earliest first."""
        return sorted(((k, h) for k, h in self.held.items() if h.due <= now), key=lambda kh: kh[1].due)

    def next_due(self) -> float | None:
        return min((h.due for h in self.held.values()), default=None)

    def to_json(self) -> dict[str, Any]:
        return {k: {"due": h.due, "boot": h.boot, "payload": dict(h.payload)} for k, h in self.held.items()}

    @classmethod
    def from_json(cls, data: Any) -> HeldEnds:
        if not isinstance(data, Mapping):
            return cls()
        held: dict[str, HeldEnd] = {}
        for key, value in data.items():
            if isinstance(value, Mapping) and isinstance(value.get("due"), int | float):
                payload = value.get("payload")
                held[str(key)] = HeldEnd(
                    float(value["due"]),
                    str(value.get("boot", "")),
                    dict(payload) if isinstance(payload, Mapping) else {},
                )
        return cls(held)
