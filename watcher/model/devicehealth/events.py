"""The events a DRA device's health story makes (watcher.model.devicehealth.verdicts decides when): their
summaries and details. Pure.

`device.unhealthy` opens the story, `device.healthy` ends it with a heal, `device.health_unknown`
warns that a driver went quiet, and `device.health_unobserved` ends a story that no pod can confirm
any more: the device's holders are gone and none took it within the grace, so no Pod status speaks
of it. That last one is no heal; it closes the page so that a later failure pages again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, UNKNOWN
from watcher.model.devicehealth.taints import SOURCE as SLICE_SOURCE
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.records import ClaimDevice
from watcher.model.wording import make_change

__all__ = ["About", "Said", "SOURCE", "SLICE_SOURCE", "UNOBSERVED", "story_change", "unobserved_change"]

SOURCE = "pod-status"
UNOBSERVED = "Unobserved"  # the `health` of device.health_unobserved: nobody can say any more

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class Said:
    """What both sources say of one device now: the Pod status's health (its last word when it
    said nothing new), whether a failing taint is on it (`taints`: those read this time)."""

    health: str
    tainted: bool
    taints: tuple[DeviceTaint, ...]
    first_seen: float | None
    uids: frozenset[str]


@dataclass(frozen=True)
class About:
    """What an event names of the device: its claim and the Pod status's words, if any."""

    claim: str
    device: ClaimDevice
    pod_claim: str | None
    request: str | None
    message: str
    holder: str  # who holds it, when pod-resources names nobody


def _identity(key: DeviceKey, holders: list[str], sources: frozenset[str]) -> dict[str, Any]:
    driver, pool, name = key
    ordered = sorted(sources)
    return {
        "resource": driver,
        "device": f"{pool}/{name}",
        "driver": driver,
        "pool": pool,
        "device_name": name,
        "allocated_to": holders,
        "namespaces": sorted({h.split("/", 1)[0] for h in holders}),
        # One source names the story for what groups by it (flapping, incidents): the Pod status's
        # when it is one of them.
        "source": SOURCE if SOURCE in sources else (ordered[0] if ordered else SOURCE),
        "sources": ordered,
    }


def story_change(
    kind: Kind,
    key: DeviceKey,
    about: About,
    held_by: tuple[str, ...],
    sources: frozenset[str],
    said: Said,
    lasted: float | None = None,
) -> Change:
    """`device.unhealthy`, `device.healthy` or `device.health_unknown` for one device."""
    driver, pool, name = key
    words = (
        [about.message] if about.message and (kind is not Kind.DEVICE_UNHEALTHY or SOURCE in sources) else []
    )
    if kind is Kind.DEVICE_UNHEALTHY:
        words += [t.text for t in said.taints]
    message = "; ".join(words)
    holders = list(held_by) or [about.holder]
    details = _identity(key, holders, sources)
    details.update(
        {
            "cdi_devices": list(about.device.cdi_devices),
            "claim": about.claim,
            "pod_claim": about.pod_claim,
            "request": about.request,
            "health": {Kind.DEVICE_UNHEALTHY: UNHEALTHY, Kind.DEVICE_HEALTHY: HEALTHY}.get(kind, UNKNOWN),
            "message": message,
        }
    )
    if kind is Kind.DEVICE_UNHEALTHY and said.taints:
        details["taints"] = [t.to_json() for t in said.taints]
        rules = sorted({t.rule for t in said.taints if t.rule})
        if rules:  # the DeviceTaintRules that taint it: whom to ask to lift them
            details["rules"] = rules
    said_text = f": {message}" if message else ""
    if kind is Kind.DEVICE_UNHEALTHY:
        severity, state = Severity.CRITICAL, f"unhealthy{said_text}"
    elif kind is Kind.DEVICE_HEALTHY:
        severity, state = Severity.INFO, "healthy again"
    else:
        severity = Severity.WARNING
        state = f"health unknown for {lasted or 0:.0f} s (its driver stopped reporting){said_text}"
        details["unknown_for_s"] = round(lasted or 0.0, 3)
    summary = f"{driver} {name} (pool {pool}) {state}; held by {', '.join(holders)} (claim {about.claim})"
    return make_change(kind, severity, summary, details)


def unobserved_change(
    key: DeviceKey,
    reported: str,
    sources: frozenset[str],
    last_held_by: tuple[str, ...],
    unheld_for: float,
    told: frozenset[str] = frozenset(),
) -> Change:
    """`device.health_unobserved`: the story of a device reported `reported` (Unhealthy or Unknown)
    ends unconfirmed, since no pod has held it for `unheld_for` seconds."""
    driver, pool, name = key
    details = _identity(key, [], sources or frozenset([SOURCE]))
    details.update(
        {
            "health": UNOBSERVED,
            # Routed as its failure was, so a sink that took the page for a namespace takes its end.
            "namespaces": sorted(told | {h.split("/", 1)[0] for h in last_held_by}),
            "last_reported": reported,
            "last_allocated_to": list(last_held_by),
            "unheld_for_s": round(unheld_for, 3),
        }
    )
    was = "unhealthy" if reported == UNHEALTHY else "of unknown health"
    summary = (
        f"{driver} {name} (pool {pool}) was {was} and no pod has held it for {unheld_for:.0f} s: "
        "no Pod status can say how it is now, so its page is closed unconfirmed (it may still be "
        "bad; a later failure pages again)"
    )
    return make_change(Kind.DEVICE_HEALTH_UNOBSERVED, Severity.WARNING, summary, details)
