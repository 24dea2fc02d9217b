"""Conditions: the states that start and stop (a device gone, the kubelet unreachable).

Pure. Paging and alerting sinks (PagerDuty, Alertmanager) trigger on a
condition becoming active and resolve it with the same key when it clears.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watcher.model.changes import Kind
from watcher.model.events import Event

__all__ = ["Condition", "condition_of", "CONDITION_KINDS"]

DEVICE_ALERT = "PodResourcesDeviceUnavailable"
KUBELET_ALERT = "PodResourcesKubeletUnreachable"
INCIDENT_ALERT = "PodResourcesDevicesUnavailable"
RULE_ALERT = "PodResourcesDeviceTaintRuleEvictsAll"
MISSING_ALERT = "PodResourcesDevicesMissing"
REJECTING_ALERT = "PodResourcesNodeRejectingPods"

# Kinds that can start or end a condition; routes of paging sinks let the
# ending ones through whatever their minimum severity.
CONDITION_KINDS = frozenset(
    {
        Kind.DEVICE_REMOVED,
        Kind.DEVICE_ADDED,
        Kind.DEVICE_UNHEALTHY,
        Kind.DEVICE_HEALTHY,
        Kind.DEVICE_HEALTH_UNOBSERVED,
        Kind.DEVICE_FLAPPING,
        Kind.DEVICE_FLAP_ENDED,
        Kind.DEVICE_INCIDENT,
        Kind.DEVICE_INCIDENT_RESOLVED,
        Kind.DEVICE_TAINT_RULE_EVICTS_ALL,
        Kind.DEVICE_TAINT_RULE_LIFTED,
        Kind.NODE_REJECTING_PODS,
        Kind.NODE_REJECTING_PODS_ENDED,
        Kind.KUBELET_UNREACHABLE,
        Kind.KUBELET_REACHABLE,
        Kind.KUBELET_CONNECTED,
        Kind.WATCHER_STARTED,
        Kind.DEVICE_MISSING,
        Kind.DEVICE_MISSING_RESOLVED,
    }
)
# A device's condition: gone from allocatable (device plugins) or unhealthy in its holder's Pod status
# (DRA, where `resource` is the driver and `device` is pool/device), one key shape for both.
# device.health_unknown is neither: a driver that stopped reporting is no failure, so never a page.
# device.health_unobserved ends it unconfirmed: no pod holds the device any more (no heal, but a
# page must not stay open for ever, and a later failure must page again).
_DEVICE_KINDS = (
    Kind.DEVICE_REMOVED,
    Kind.DEVICE_ADDED,
    Kind.DEVICE_UNHEALTHY,
    Kind.DEVICE_HEALTHY,
    Kind.DEVICE_HEALTH_UNOBSERVED,
    Kind.DEVICE_FLAPPING,
    Kind.DEVICE_FLAP_ENDED,
)


@dataclass(frozen=True)
class Condition:
    """`key` is stable per condition: node + resource + device, or node + kubelet."""

    key: str
    active: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    summary: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


def condition_of(event: Event) -> Condition | None:
    """The condition `event` starts or ends, if any."""
    d = event.details
    node = event.node
    if event.kind in _DEVICE_KINDS:
        resource, device = str(d.get("resource", "")), str(d.get("device", ""))
        labels = {
            "alertname": DEVICE_ALERT,
            "node": node,
            "resource": resource,
            "device": device,
            "severity": str(event.severity),
        }
        # A flapping device is one open condition until it settles; it ends present or missing.
        active = event.kind in (Kind.DEVICE_REMOVED, Kind.DEVICE_UNHEALTHY, Kind.DEVICE_FLAPPING) or (
            event.kind == Kind.DEVICE_FLAP_ENDED and not d.get("present", True)
        )
        return Condition(
            key=f"{node}/device/{resource}/{device}",
            active=active,
            labels=labels,
            summary=event.summary,
            details=d,
        )
    if event.kind in (Kind.DEVICE_INCIDENT, Kind.DEVICE_INCIDENT_RESOLVED):
        labels = {
            "alertname": INCIDENT_ALERT,
            "node": node,
            "resource": str(d.get("resource", "")),
            "incident": str(d.get("incident", "")),
            "severity": str(event.severity),
        }
        return Condition(
            key=f"{node}/incident/{d.get('incident', '')}",
            active=event.kind == Kind.DEVICE_INCIDENT,
            labels=labels,
            summary=event.summary,
            details=d,
        )
    if event.kind in (Kind.NODE_REJECTING_PODS, Kind.NODE_REJECTING_PODS_ENDED):
        # One page per node and resource while it keeps rejecting pods (watcher.model.rejections).
        resource = str(d.get("resource", ""))
        labels = {"alertname": REJECTING_ALERT, "node": node, "resource": resource}
        labels["severity"] = str(event.severity)
        active = event.kind == Kind.NODE_REJECTING_PODS
        return Condition(f"{node}/rejecting/{resource}", active, labels, event.summary, d)
    if event.kind in (Kind.DEVICE_MISSING, Kind.DEVICE_MISSING_RESOLVED):
        # Fewer devices than expected (watcher.model.expected): one condition per node and
        # resource, whichever devices went, so a second one going does not page again. None when
        # the devices' own device.removed pages already cover the shortfall (Shortfall.pages).
        if d.get("pages") is False:
            return None
        resource = str(d.get("resource", ""))
        labels = {
            "alertname": MISSING_ALERT,
            "node": node,
            "resource": resource,
            "severity": str(event.severity),
        }
        return Condition(
            key=f"{node}/missing/{resource}",
            active=event.kind == Kind.DEVICE_MISSING,
            labels=labels,
            summary=event.summary,
            details=d,
        )
    if event.kind in (Kind.DEVICE_TAINT_RULE_EVICTS_ALL, Kind.DEVICE_TAINT_RULE_LIFTED):
        # One rule evicting from every device is one cluster-wide condition: keyed (and labelled)
        # by the rule's uid alone, no node, so every node's agent opens and ends the same page.
        uid = str(d.get("rule_uid", ""))
        labels = {"alertname": RULE_ALERT, "rule": str(d.get("rule", "")), "rule_uid": uid}
        labels["severity"] = str(event.severity)
        active = event.kind == Kind.DEVICE_TAINT_RULE_EVICTS_ALL
        return Condition(f"device-taint-rule/{uid}", active, labels, event.summary, d)
    kubelet_labels = {"alertname": KUBELET_ALERT, "node": node, "severity": str(event.severity)}
    if event.kind == Kind.KUBELET_UNREACHABLE:
        return Condition(f"{node}/kubelet", True, kubelet_labels, event.summary, d)
    if event.kind in (Kind.KUBELET_REACHABLE, Kind.KUBELET_CONNECTED):
        return Condition(f"{node}/kubelet", False, kubelet_labels, event.summary, d)
    if event.kind == Kind.WATCHER_STARTED:
        kubelet = d.get("kubelet")
        if isinstance(kubelet, Mapping) and kubelet.get("reachable"):
            return Condition(f"{node}/kubelet", False, kubelet_labels, event.summary, d)
    return None
