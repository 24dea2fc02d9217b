"""A reset is not a heal: a failed device back only because its plugin or driver restarted.

A device plugin (or a DRA driver) that restarts forgets what it knew: it comes back listing every
device Healthy, the one that failed a minute ago included. The GPU did not heal; its plugin lost the
memory of the failure. So a failed device (its last health change `device.removed` or
`device.unhealthy`) that comes back (`device.added` / `device.healthy`) within `RESET_WINDOW_S` of its
resource's plugin or driver registering again is told as `device.reset` (warning) instead, and its
heal is held: the page stays open. Only if the device stays up for `hold_down` seconds does the held
heal follow (marked `after_reset`), resolving the page as a heal would have. Failing again meanwhile
is the failure event marked `failed_again`: the page is still open, so a paging sink updates it at
most. A heal with no restart before it passes through untouched, as it always did.

Pure: the caller brings the monotonic time and which resources re-registered. The failed devices
and the held heals are plain data (`to_json`) in the saved state, so a reset is told once and its
heal follows once across agent restarts (the hold-down then counts again from the restart: never
early).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from watcher.model.changes import Change, Kind, Severity

__all__ = ["RESET_WINDOW_S", "Resets"]

# A device back this long after its plugin or driver registered again came back with the restart.
# Long enough for a DRA device: the kubelet writes the driver's new Healthy into the holder's Pod
# status at the pod's next sync (a periodic one is 60 to 90 s away). A genuine heal inside it is
# taken for a reset: its resolve waits the hold-down, which delays a resolve and never pages.
RESET_WINDOW_S = 120.0
# The failed devices kept; the oldest are forgotten first (a node that renames its devices, MIG
# re-partitioning, must not grow the saved state for ever). A forgotten one heals as before.
MAX_FAILED = 4096

# A device plugin's socket new or replaced: some plugin registered again (which resource it serves
# is not visible). It stands for every device plugin's resource: with a resource whose devices had
# all failed, the kubelet had none to drop, so no `plugin.registered` names it.
_ANY_PLUGIN = "device-plugins/"
_DOWN = (Kind.DEVICE_REMOVED, Kind.DEVICE_UNHEALTHY)
_UP = (Kind.DEVICE_ADDED, Kind.DEVICE_HEALTHY)
DeviceKey = tuple[str, str]  # (resource or driver, device or pool/device)


@dataclass(frozen=True)
class _Held:
    since: float  # monotonic: when the reset was told (or the agent restarted)
    heal: Change  # the heal held back, told when the hold-down has passed


@dataclass(frozen=True)
class Resets:
    # Devices whose last health change was a failure, with when it was seen (monotonic), oldest first.
    failed: tuple[tuple[DeviceKey, float], ...] = ()
    held: tuple[tuple[DeviceKey, _Held], ...] = ()
    # When each resource's plugin (or driver) last registered again, in this process only.
    restarts: tuple[tuple[str, float], ...] = ()
    # Each DRA driver's registration socket as last seen (name -> identity); None: not looked yet.
    drivers: tuple[tuple[str, str], ...] | None = None
    plugins: tuple[tuple[str, str], ...] | None = None  # the device plugins' sockets, likewise

    def next_look(self, hold_down: float) -> float | None:
        """When a held heal falls due."""
        return min((h.since + hold_down for _, h in self.held), default=None)

    def holding(self) -> frozenset[DeviceKey]:
        return frozenset(k for k, _ in self.held)

    def observe(
        self,
        now: float,
        changes: Sequence[Change],
        restarted: Collection[str],
        hold_down: float,
        drivers: Mapping[str, str] | None = None,
        plugins: Mapping[str, str] | None = None,
    ) -> tuple[Resets, list[Change]]:
        """The cycle's changes with each heal a restart explains turned into `device.reset`, each
        failure of a device whose heal is held marked `failed_again`, and the held heals now due.
        `restarted`: the resources whose device plugin registered again in this cycle. `drivers`:
        the DRA drivers' registration sockets now (name -> identity; None: unreadable), one new or
        replaced since the last look being its driver registering again. `plugins`: the device
        plugins' sockets now, likewise (a new one: some device plugin registered again).
        `hold_down` 0: no reset is told (a heal is a heal); heals held before still follow."""
        restarts = {r: t for r, t in self.restarts if now - t <= RESET_WINDOW_S}
        restarts.update(dict.fromkeys(restarted, now))
        restarts.update(dict.fromkeys(_new(self.drivers, drivers), now))
        if _new(self.plugins, plugins):
            restarts[_ANY_PLUGIN] = now
        failed = dict(self.failed)
        held = dict(self.held)
        out: list[Change] = []
        for change in changes:
            key = _key(change)
            if change.kind in _DOWN:
                failed.pop(key, None)
                failed[key] = now
                out.append(_failed_again(change) if held.pop(key, None) is not None else change)
            elif change.kind in _UP and key in held:
                held[key] = replace(held[key], heal=change)  # still up: the latest words are told
            elif change.kind in _UP and hold_down > 0 and failed.get(key, now) < _restarted(change, restarts):
                # Failed, and its plugin registered again since (a plugin back still calling it
                # failed said so itself: a heal after that is the plugin's own word, a heal).
                del failed[key]
                held[key] = _Held(now, change)
                out.append(_reset(change, now - _restarted(change, restarts), hold_down))
            else:
                if change.kind in _UP or change.kind is Kind.DEVICE_HEALTH_UNOBSERVED:
                    failed.pop(key, None)
                out.append(change)
        for key, h in sorted(held.items(), key=lambda kh: kh[1].since):
            if now - h.since >= hold_down:
                del held[key]
                out.append(_healed(h, now))
        kept = tuple(failed.items())[-MAX_FAILED:]
        return Resets(
            kept,
            tuple(sorted(held.items())),
            tuple(sorted(restarts.items())),
            self.drivers if drivers is None else tuple(sorted(drivers.items())),
            self.plugins if plugins is None else tuple(sorted(plugins.items())),
        ), out

    def to_json(self) -> dict[str, Any]:
        return {
            "failed": [list(k) for k, _ in self.failed],
            "held": [
                {
                    "resource": k[0],
                    "device": k[1],
                    "heal": {
                        "kind": str(h.heal.kind),
                        "severity": str(h.heal.severity),
                        "summary": h.heal.summary,
                        "details": dict(h.heal.details),
                    },
                }
                for k, h in self.held
            ],
        }

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> Resets:
        """What `to_json` saved, read at monotonic time `now`: each held heal's hold-down counts
        again from `now` (the saved times meant nothing to this process). Unreadable entries are
        left out, never an error."""
        if not isinstance(data, Mapping):
            return cls()
        failed = [
            ((k[0], k[1]), now)
            for k in data.get("failed") or ()
            if isinstance(k, list) and len(k) == 2 and all(isinstance(x, str) for x in k)
        ]
        held: dict[DeviceKey, _Held] = {}
        for e in data.get("held") or ():
            heal = _change_from_json(e.get("heal")) if isinstance(e, Mapping) else None
            if heal is not None and isinstance(e["resource"], str) and isinstance(e["device"], str):
                held[(e["resource"], e["device"])] = _Held(now, heal)
        return cls(tuple(failed[-MAX_FAILED:]), tuple(sorted(held.items())))


def _new(before: tuple[tuple[str, str], ...] | None, now: Mapping[str, str] | None) -> list[str]:
    """The sockets new or replaced since the last look (the first look says nothing: the agent did
    not see them start)."""
    if now is None or before is None:
        return []
    seen = dict(before)
    return [name for name, identity in now.items() if seen.get(name) != identity]


def _restarted(change: Change, restarts: Mapping[str, float]) -> float:
    """When the plugin or driver of `change`'s device last registered again (-1: not lately). A
    device plugin's device (back in allocatable) counts any device plugin's socket replaced."""
    times = [restarts.get(str(change.details.get("resource", "")), -1.0)]
    if change.kind is Kind.DEVICE_ADDED:
        times.append(restarts.get(_ANY_PLUGIN, -1.0))
    return max(times)


def _change_from_json(data: Any) -> Change | None:
    if not isinstance(data, Mapping):
        return None
    try:
        kind, severity = Kind(data["kind"]), Severity(data["severity"])
    except (KeyError, ValueError):
        return None
    summary, details = data.get("summary"), data.get("details")
    if kind not in _UP or not isinstance(summary, str) or not isinstance(details, Mapping):
        return None
    return Change(kind, severity, summary, dict(details))


def _key(change: Change) -> DeviceKey:
    return (str(change.details.get("resource", "")), str(change.details.get("device", "")))


def _reset(heal: Change, after: float, hold_down: float) -> Change:
    resource, device = _key(heal)
    return Change(
        Kind.DEVICE_RESET,
        Severity.WARNING,
        f"{resource} {device} is back after its plugin restarted, not a verified heal: its page "
        f"stays open until it has stayed healthy for {hold_down:g} s",
        {
            **heal.details,
            "reset_of": str(heal.kind),
            "restarted_s_ago": round(max(after, 0.0), 3),
            "hold_down_s": hold_down,
        },
    )


def _failed_again(change: Change) -> Change:
    return Change(
        change.kind,
        change.severity,
        change.summary + " (failed again after its plugin's reset; its page is still open)",
        {**change.details, "failed_again": True},
    )


def _healed(h: _Held, now: float) -> Change:
    lasted = round(now - h.since, 3)
    return Change(
        h.heal.kind,
        h.heal.severity,
        h.heal.summary + f" (healthy for {lasted:g} s since its plugin's reset)",
        {**h.heal.details, "after_reset": True, "healthy_for_s": lasted},
    )
