"""Flap damping: a device that keeps changing health is one story for a person, not twenty pages.

A device whose health changes (`device.removed` / `device.added`, or for a DRA device
`device.unhealthy` / `device.healthy`) more than `limit` times within `window` seconds is flapping:
one `device.flapping` event says so, with the count; its further health changes are marked
`flapping` (the audit log and webhooks still get every one; notification sinks do not), and so is
a cycle's `capacity.changed` of a resource whose health changes in that cycle were all a flapping
device's (it says nothing the flap does not); and once it has not changed for `quiet` seconds one
`device.flap_ended` says how it ended (present or missing). Pure: the caller brings the time.
Flapping devices are plain data (`to_json`), kept in the saved state: an episode that ends while
the agent restarts still gets its `device.flap_ended`, its quiet period counted from the restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity

__all__ = ["Flaps", "FlapRule"]

_HEALTH = (Kind.DEVICE_REMOVED, Kind.DEVICE_ADDED, Kind.DEVICE_UNHEALTHY, Kind.DEVICE_HEALTHY)
_UP = (Kind.DEVICE_ADDED, Kind.DEVICE_HEALTHY)
DeviceKey = tuple[str, str]  # (resource, device)


@dataclass(frozen=True)
class FlapRule:
    limit: int  # more changes than this within `window` is flapping; 0: never damp
    window: float
    quiet: float


@dataclass(frozen=True)
class _Device:
    times: tuple[float, ...] = ()  # recent health changes (monotonic), within the window
    flapping_since: float | None = None
    changes: int = 0  # health changes since the flapping began
    present: bool = True
    allocated_to: tuple[str, ...] = ()
    source: str | None = None  # "pod-status" for a DRA device: its reports say where they came from


@dataclass(frozen=True)
class Flaps:
    devices: tuple[tuple[DeviceKey, _Device], ...] = ()

    def next_look(self, rule: FlapRule) -> float | None:
        """When a flapping device may have been quiet long enough."""
        if rule.limit <= 0:
            return None
        ends = [d.times[-1] + rule.quiet for _, d in self.devices if d.flapping_since is not None and d.times]
        return min(ends, default=None)

    def flapping(self) -> frozenset[DeviceKey]:
        return frozenset(k for k, d in self.devices if d.flapping_since is not None)

    def damp(self, now: float, changes: Sequence[Change], rule: FlapRule) -> tuple[Flaps, list[Change]]:
        """The cycle's changes with flapping devices' health changes marked, plus the
        `device.flapping` / `device.flap_ended` changes this cycle calls for."""
        if rule.limit <= 0:
            # Damping is off: an episode still open (saved before it was turned off) ends now.
            ends = [_flap_ended(k, d, rule) for k, d in self.devices if d.flapping_since is not None]
            return Flaps(), [*changes, *ends]
        devices = dict(self.devices)
        out: list[Change] = []
        for change in changes:
            if change.kind is Kind.DEVICE_HEALTH_UNOBSERVED:
                # A DRA device's story ended with nobody holding it: so does any episode of it (its
                # end, unmarked, closes what the episode held open; no flap_ended may reopen it).
                devices.pop(_key(change), None)
                out.append(change)
                continue
            if change.kind not in _HEALTH:
                out.append(change)
                continue
            key = _key(change)
            d = devices.get(key, _Device())
            times = tuple(t for t in (*d.times, now) if now - t <= rule.window)
            held = change.details.get("allocated_to") or d.allocated_to
            d = dataclasses.replace(
                d,
                times=times,
                present=change.kind in _UP,
                allocated_to=tuple(held) if isinstance(held, list | tuple) else d.allocated_to,
                changes=d.changes + 1 if d.flapping_since is not None else d.changes,
                source=_source(change),
            )
            if d.flapping_since is not None:
                out.append(_marked(change))
            elif len(times) > rule.limit:
                d = dataclasses.replace(d, flapping_since=now, changes=len(times))
                out.append(_marked(change))
                out.append(_flapping(key, d, rule))
            else:
                out.append(change)
            devices[key] = d
        out = _capacity_marked(out)
        for key, d in list(devices.items()):
            if d.flapping_since is not None and d.times and now - d.times[-1] >= rule.quiet:
                out.append(_flap_ended(key, d, rule))
                devices[key] = _Device(present=d.present, allocated_to=d.allocated_to, source=d.source)
            elif d.flapping_since is None and (not d.times or now - d.times[-1] > rule.window):
                del devices[key]  # forgotten: nothing recent
        return Flaps(tuple(sorted(devices.items()))), out

    def to_json(self) -> list[dict[str, Any]]:
        """The devices flapping now, for the saved state (recent changes of the others are not
        kept: a restart forgets them, which at most delays a damping by a few changes)."""
        return [
            {
                "resource": k[0],
                "device": k[1],
                "changes": d.changes,
                "present": d.present,
                "allocated_to": list(d.allocated_to),
                "source": d.source,
            }
            for k, d in self.devices
            if d.flapping_since is not None
        ]

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> Flaps:
        """What `to_json` saved, read at monotonic time `now` (the saved times meant nothing to
        this process: each episode's quiet period counts again from `now`). Unreadable entries are
        left out, never an error."""
        if not isinstance(data, list):
            return cls()
        devices: dict[DeviceKey, _Device] = {}
        for e in data:
            if not isinstance(e, Mapping):
                continue
            resource, device, changes, present = (
                e.get(k) for k in ("resource", "device", "changes", "present")
            )
            held, source = e.get("allocated_to"), e.get("source")
            if not (isinstance(resource, str) and isinstance(device, str) and isinstance(changes, int)):
                continue
            if not isinstance(present, bool) or not isinstance(held, list):
                continue
            devices[(resource, device)] = _Device(
                times=(now,),
                flapping_since=now,
                changes=changes,
                present=present,
                allocated_to=tuple(str(h) for h in held),
                source=source if isinstance(source, str) else None,
            )
        return cls(tuple(sorted(devices.items())))


def _key(change: Change) -> DeviceKey:
    return (str(change.details.get("resource", "")), str(change.details.get("device", "")))


def _capacity_marked(changes: list[Change]) -> list[Change]:
    """`changes` with each capacity change marked whose resource's health changes were all marked."""
    marked: dict[str, bool] = {}
    for c in changes:
        if c.kind in _HEALTH:
            resource = str(c.details.get("resource", ""))
            marked[resource] = marked.get(resource, True) and c.details.get("flapping") is True
    return [
        _marked(c)
        if c.kind is Kind.CAPACITY_CHANGED and marked.get(str(c.details.get("resource", "")))
        else c
        for c in changes
    ]


def _source(change: Change) -> str | None:
    source = change.details.get("source")
    return source if isinstance(source, str) else None


def _with_source(details: dict[str, Any], d: _Device) -> dict[str, Any]:
    return details if d.source is None else {**details, "source": d.source}


def _marked(change: Change) -> Change:
    return Change(
        change.kind,
        change.severity,
        change.summary + " (flapping)",
        {**change.details, "flapping": True},
    )


def _flapping(key: DeviceKey, d: _Device, rule: FlapRule) -> Change:
    resource, device = key
    pods = list(d.allocated_to)
    severity = Severity.CRITICAL if pods and not d.present else Severity.WARNING
    return Change(
        Kind.DEVICE_FLAPPING,
        severity,
        f"{resource} {device} is flapping: {len(d.times)} health changes in {rule.window:g} s; further "
        f"changes go to the audit log only until it is stable for {rule.quiet:g} s"
        + (f" (allocated to {', '.join(pods)})" if pods else ""),
        _with_source(
            {
                "resource": resource,
                "device": device,
                "changes": len(d.times),
                "window_s": rule.window,
                "present": d.present,
                "allocated_to": pods,
                "namespaces": sorted({p.split("/")[0] for p in pods}),
            },
            d,
        ),
    )


def _flap_ended(key: DeviceKey, d: _Device, rule: FlapRule) -> Change:
    resource, device = key
    pods = list(d.allocated_to)
    if d.source is None:
        state = "present" if d.present else "missing"
    else:  # a DRA device never leaves allocatable: its health is what flapped
        state = "healthy" if d.present else "unhealthy"
    severity = Severity.INFO if d.present else (Severity.CRITICAL if pods else Severity.WARNING)
    return Change(
        Kind.DEVICE_FLAP_ENDED,
        severity,
        f"{resource} {device} stopped flapping after {d.changes} health changes; "
        f"stable for {rule.quiet:g} s, now {state}"
        + (f" (allocated to {', '.join(pods)})" if pods and not d.present else ""),
        _with_source(
            {
                "resource": resource,
                "device": device,
                "changes": d.changes,
                "present": d.present,
                "allocated_to": pods,
                "namespaces": sorted({p.split("/")[0] for p in pods}),
            },
            d,
        ),
    )
