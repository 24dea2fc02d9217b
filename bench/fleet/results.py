"""What the fleet section returns: its parts, each a list of rows or a row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FleetResult", "Row"]

# One row of figures: a phase (steady or burst), a fleet's start, a capacity row, the leader kill.
Row = dict[str, Any]


@dataclass(frozen=True)
class FleetResult:
    quick: bool
    plan: Row  # what of the plan the report says
    script: Row  # the scripted events' kinds: steady (per step), burst, mean_events
    fleets: list[Row]  # per fleet size: {"steady": phase, "burst": phase}
    connect: list[Row]  # per fleet size: how its nodes started
    capacity: list[Row]  # the sustained-capacity rows, the webhook's last
    failover: Row
    webhook: Row  # {"steady": phase, "burst": phase}
    profiles: dict[str, list[str]]  # of the goals not met, by label
