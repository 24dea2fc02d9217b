"""How old a queued event is: the outbox's age clock, which no wall-clock step can move.

`max_age` (and the dead letters' `max_dead_letter_age`) must never empty a queue because the wall
clock was stepped (by hand, by NTP after a boot with a wrong RTC, by a VM restored from a
snapshot). So ages are measured on the kernel's boot clock (CLOCK_BOOTTIME: seconds since boot;
it runs on while the agent is stopped and through suspend, and setting the time does not move
it). The outbox stamps every queued row and dead letter with the age clock's reading, and saves
the clock itself (boot id, boot clock, age clock) in every transaction that stamps rows, so:

- while the machine stays up, an age is exact, the agent's restarts and downtime included;
- across a reboot the boot clock starts again from zero: the age clock carries on from the
  reading saved last, so the time the node was down (and since that save) is not counted. An
  event may then wait longer than max_age by the wall clock, never less (`max_queue` bounds
  the queue meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from watcher.bootclock import boot_clock

__all__ = ["AgeClock", "BootClock", "Clocks", "Reading", "boot_clock"]

BootClock = Callable[[], tuple[str, float]]
# (boot id, boot clock, age clock): what the outbox saves.
Reading = tuple[str, float, float]


@dataclass(frozen=True)
class Clocks:
    """The clocks the outbox reads: `wall` for the times it shows people (never for an age),
    `boot` for ages. The seam tests step them through."""

    wall: Callable[[], float] = time.time
    boot: BootClock = boot_clock


class AgeClock:
    """Seconds on a clock that only moves forward, across agent restarts (see the module doc).

    `boot` is the seam: a test gives it a fake boot clock to age events, or a new boot id to
    reboot the machine under the outbox."""

    def __init__(self, boot: BootClock = boot_clock) -> None:
        self._boot = boot
        self._anchor: Reading | None = None
        self._last = 0.0

    def start(self, saved: Reading | None) -> None:
        """Carry on from the reading the outbox saved (None: a new outbox, ages from 0)."""
        boot, now = self._boot()
        if saved is None:
            self._anchor = (boot, now, 0.0)
        elif saved[0] == boot and now >= saved[1]:
            self._anchor = saved  # the same boot: the time the agent was stopped counts
        else:
            self._anchor = (boot, now, saved[2])  # rebooted: carry on from the last reading
        self._last = self._anchor[2]

    def now(self) -> float:
        boot, now = self._boot()
        if self._anchor is None:
            self.start(None)
            assert self._anchor is not None
        anchor_boot, anchor_at, anchor_age = self._anchor
        if boot != anchor_boot or now < anchor_at:
            # The boot clock is not the one anchored to: carry on from the last reading.
            self._anchor = (boot, now, self._last)
            return self._last
        self._last = max(self._last, anchor_age + (now - anchor_at))
        return self._last

    def reading(self) -> Reading:
        """What to save: the clock now, to carry on from after a restart."""
        age = self.now()
        assert self._anchor is not None
        boot, at, anchor_age = self._anchor
        return boot, at + (age - anchor_age), age
