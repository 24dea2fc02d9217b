"""Routing: which events a sink asked for. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from watcher.model.changes import Kind, Severity
from watcher.model.conditions import CONDITION_KINDS, condition_of
from watcher.model.events import Event

__all__ = ["Route", "names_in"]


def names_in(details: Mapping[str, Any], single: str, plural: str) -> list[str]:
    """The values an event names under `single` / `plural` (e.g. resource / resources)."""
    out: list[str] = []
    one = details.get(single)
    if isinstance(one, str) and one:
        out.append(one)
    many = details.get(plural)
    if isinstance(many, list | tuple):
        out.extend(str(x) for x in many if x)
    return out


def _any_match(values: Iterable[str], patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(v, p) for v in values for p in patterns)


_DEVICE_HEALTH = (
    Kind.DEVICE_REMOVED,
    Kind.DEVICE_ADDED,
    Kind.DEVICE_UNHEALTHY,
    Kind.DEVICE_HEALTHY,
    Kind.DEVICE_HEALTH_UNOBSERVED,
)


@dataclass(frozen=True)
class Route:
    """Globs for kind, resource and namespace, and a minimum severity.

    A resource or namespace filter other than "*" lets through only events
    that name a matching resource or namespace. `resolutions` (paging sinks)
    lets the end of a condition through below the minimum severity, so what
    was triggered always gets resolved.
    """

    kinds: tuple[str, ...] = ("*",)
    min_severity: Severity = Severity.INFO
    resources: tuple[str, ...] = ("*",)
    namespaces: tuple[str, ...] = ("*",)
    resolutions: bool = False
    # Notification sinks: a flapping device's individual changes stay in the audit log and the
    # webhooks; these sinks get its device.flapping and device.flap_ended instead.
    skip_flapping: bool = False
    # Paging sinks: the devices of a mass failure are paged once, as its device.incident.
    skip_incident_devices: bool = False

    def matches(self, event: Event) -> bool:
        if self.skip_flapping and event.details.get("flapping") is True:
            return False
        if self.skip_incident_devices and "incident" in event.details and event.kind in _DEVICE_HEALTH:
            return False
        if not any(fnmatchcase(event.kind, p) for p in self.kinds):
            return False
        if self.resources != ("*",) and not _any_match(
            names_in(event.details, "resource", "resources"), self.resources
        ):
            return False
        if self.namespaces != ("*",) and not _any_match(
            names_in(event.details, "namespace", "namespaces"), self.namespaces
        ):
            return False
        if event.severity.rank >= self.min_severity.rank:
            return True
        if self.resolutions and event.kind in CONDITION_KINDS:
            condition = condition_of(event)
            return condition is not None and not condition.active
        return False
