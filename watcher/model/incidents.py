"""Incidents: many devices of one resource failing at once are one page, not thousands.

When `threshold` or more devices of one resource leave allocatable in one re-query (or, for DRA, of
one driver turn unhealthy in their holders' Pod status), paging sinks
(PagerDuty, Alertmanager) get one `device.incident` (count, devices, pods hit) instead of a
page per device; its devices' `device.removed` / `device.unhealthy` events, and the `device.added` /
`device.healthy` that bring them back, are marked with the incident's key (the audit log and webhooks
still carry each one), and one `device.incident_resolved` follows when every one of them is back
(or, for a DRA device, its story ended unconfirmed: `device.health_unobserved`). A device that fails
again while an older incident still counts it missing is that record gone stale: the new failure is
its own, never swallowed by the old incident's key. Pure; open incidents are plain data
(`to_json`), kept in the saved state so a restart still resolves them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity

__all__ = ["Incidents"]

_DOWN = (Kind.DEVICE_REMOVED, Kind.DEVICE_UNHEALTHY)
_UP = (Kind.DEVICE_ADDED, Kind.DEVICE_HEALTHY, Kind.DEVICE_HEALTH_UNOBSERVED)


@dataclass(frozen=True)
class _Open:
    key: str
    resource: str
    missing: frozenset[str]
    total: int
    source: str | None = None  # "pod-status": DRA devices that turned unhealthy
    unobserved: frozenset[str] = frozenset()  # devices whose story ended with nobody holding them
    stale: frozenset[str] = frozenset()  # devices that failed again: their record here went stale
    namespaces: frozenset[str] = frozenset()  # where its page went: its resolve goes there too


@dataclass(frozen=True)
class Incidents:
    open: tuple[_Open, ...] = ()

    def group(self, cycle: str, changes: Sequence[Change], threshold: int) -> tuple[Incidents, list[Change]]:
        """The cycle's changes with mass failures turned into incidents (see the module). With
        `threshold` 0 no incident opens, but one still open (saved before it was turned off) ends."""
        if threshold <= 0 and not self.open:
            return self, list(changes)
        # A failure marked `failed_again` (watcher.model.resets) is a device whose heal was held
        # after its plugin's reset: its page, or its incident, is still open. It opens nothing new
        # and stays with the incident that counts it missing (that record is not stale).
        fresh = [c for c in changes if c.kind in _DOWN and not c.details.get("failed_again")]
        removed: dict[str, list[Change]] = defaultdict(list)
        for c in fresh:
            if not c.details.get("flapping"):
                removed[str(c.details.get("resource", ""))].append(c)
        opening = {r: cs for r, cs in removed.items() if len(cs) >= threshold > 0}
        # Failing again while an older incident counts it missing: that record is stale (its end
        # went unseen), and the new failure is paged on its own or in a new incident.
        again = {(str(c.details.get("resource", "")), _device(c)) for c in fresh}
        still = [
            dataclasses.replace(
                inc,
                missing=frozenset(d for d in inc.missing if (inc.resource, d) not in again),
                stale=inc.stale | {d for d in inc.missing if (inc.resource, d) in again},
            )
            for inc in self.open
        ]
        new = [
            _Open(
                f"{resource}/{cycle}",
                resource,
                frozenset(_device(c) for c in cs),
                len(cs),
                _source(cs[0]),
                namespaces=frozenset(n for c in cs for n in c.details.get("namespaces") or ()),
            )
            for resource, cs in sorted(opening.items())
        ]
        out: list[Change] = []
        for c in changes:
            incident = self._incident_of(c, [*still, *new])
            out.append(c if incident is None else _marked(c, incident.key))
        for inc in new:
            out.append(_opened(inc, removed[inc.resource]))
        # Devices back: an incident whose devices are all back is resolved.
        back = {(str(c.details.get("resource", "")), _device(c)) for c in changes if c.kind in _UP}
        unseen = {
            (str(c.details.get("resource", "")), _device(c))
            for c in changes
            if c.kind is Kind.DEVICE_HEALTH_UNOBSERVED
        }
        remaining: list[_Open] = []
        for inc in [*still, *new]:
            missing = frozenset(d for d in inc.missing if (inc.resource, d) not in back)
            gone = inc.unobserved | {d for d in inc.missing if (inc.resource, d) in unseen}
            inc = dataclasses.replace(inc, missing=missing, unobserved=frozenset(gone))
            if missing:
                remaining.append(inc)
            else:
                out.append(_resolved(inc))
        return Incidents(tuple(remaining)), out

    def to_json(self) -> list[dict[str, Any]]:
        """The open incidents, for the saved state (a restart must still resolve them)."""
        return [
            {
                "key": i.key,
                "resource": i.resource,
                "missing": sorted(i.missing),
                "total": i.total,
                "source": i.source,
                "unobserved": sorted(i.unobserved),
                "stale": sorted(i.stale),
                "namespaces": sorted(i.namespaces),
            }
            for i in self.open
        ]

    @classmethod
    def from_json(cls, data: Any) -> Incidents:
        """What `to_json` saved; an unreadable entry is left out, never an error (the worst it
        costs is an incident's resolve not sent)."""
        if not isinstance(data, list):
            return cls()
        out: list[_Open] = []
        for entry in data:
            if not isinstance(entry, Mapping):
                continue
            key, resource, total, source = (entry.get(k) for k in ("key", "resource", "total", "source"))
            missing, unobserved = _strings(entry.get("missing")), _strings(entry.get("unobserved", []))
            stale, namespaces = _strings(entry.get("stale", [])), _strings(entry.get("namespaces", []))
            if not isinstance(key, str) or not isinstance(resource, str) or not isinstance(total, int):
                continue
            if not missing or unobserved is None or stale is None or namespaces is None:
                continue
            out.append(
                _Open(
                    key,
                    resource,
                    frozenset(missing),
                    total,
                    source if isinstance(source, str) else None,
                    frozenset(unobserved),
                    frozenset(stale),
                    frozenset(namespaces),
                )
            )
        return cls(tuple(out))

    @staticmethod
    def _incident_of(change: Change, incidents: Sequence[_Open]) -> _Open | None:
        if change.kind not in (*_DOWN, *_UP):
            return None
        resource, device = str(change.details.get("resource", "")), _device(change)
        return next((i for i in incidents if i.resource == resource and device in i.missing), None)


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return list(value)


def _device(change: Change) -> str:
    return str(change.details.get("device", ""))


def _source(change: Change) -> str | None:
    source = change.details.get("source")
    return source if isinstance(source, str) else None


def _marked(change: Change, key: str) -> Change:
    return Change(change.kind, change.severity, change.summary, {**change.details, "incident": key})


def _opened(inc: _Open, removed: Sequence[Change]) -> Change:
    pods = sorted({p for c in removed for p in c.details.get("allocated_to") or []})
    devices = sorted(inc.missing)
    shown = ", ".join(devices[:5]) + (f" and {len(devices) - 5} more" if len(devices) > 5 else "")
    went = "left allocatable" if inc.source is None else "turned unhealthy"
    details = {
        "resource": inc.resource,
        "incident": inc.key,
        "count": len(devices),
        "devices": devices,
        "allocated_to": pods,
        "namespaces": sorted({p.split("/")[0] for p in pods}),
    }
    return Change(
        Kind.DEVICE_INCIDENT,
        Severity.CRITICAL if pods else Severity.WARNING,
        f"{len(devices)} {inc.resource} devices {went} at once ({shown})"
        + (f"; {len(pods)} container(s) hit" if pods else ""),
        details if inc.source is None else {**details, "source": inc.source},
    )


def _resolved(inc: _Open) -> Change:
    details: dict[str, Any] = {
        "resource": inc.resource,
        "incident": inc.key,
        "count": inc.total,
        "namespaces": sorted(inc.namespaces),
    }
    back = "are back" if inc.source is None else "are healthy again"
    summary = f"all {inc.total} {inc.resource} devices of the incident {back}"
    if inc.unobserved or inc.stale:
        n, m = len(inc.unobserved), len(inc.stale)
        parts = [f"{inc.total - n - m} {'back' if inc.source is None else 'healthy again'}"]
        if n:
            parts.append(f"{n} no longer held by any pod (closed unconfirmed, they may still be bad)")
            details["unobserved"] = sorted(inc.unobserved)
        if m:
            parts.append(f"{m} failing again, paged on their own")
            details["failed_again"] = sorted(inc.stale)
        summary = f"the incident of {inc.total} {inc.resource} devices is over: " + "; ".join(parts)
    return Change(
        Kind.DEVICE_INCIDENT_RESOLVED,
        Severity.INFO,
        summary,
        details if inc.source is None else {**details, "source": inc.source},
    )
