"""The value types of change: kinds, severities and the Change record. Pure."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Kind", "Severity", "Change", "LIFECYCLE_KINDS", "DIFF_KINDS"]


class Kind(enum.StrEnum):
    """Every event kind the watcher emits; the string is the public `kind` field."""

    DEVICE_ADDED = "device.added"
    DEVICE_REMOVED = "device.removed"
    DEVICE_TOPOLOGY_CHANGED = "device.topology_changed"
    CPU_ADDED = "cpu.added"
    CPU_REMOVED = "cpu.removed"
    MEMORY_CHANGED = "memory.changed"
    ALLOCATION_ADDED = "allocation.added"
    ALLOCATION_REMOVED = "allocation.removed"
    ALLOCATION_CHANGED = "allocation.changed"
    CAPACITY_CHANGED = "capacity.changed"
    WATCHER_STARTED = "watcher.started"
    KUBELET_CONNECTED = "kubelet.connected"
    KUBELET_RESTARTED = "kubelet.restarted"
    KUBELET_UNREACHABLE = "kubelet.unreachable"
    KUBELET_REACHABLE = "kubelet.reachable"
    API_DEGRADED = "api.degraded"
    INVENTORY_SNAPSHOT = "inventory.snapshot"
    PLUGIN_UNREGISTERED = "plugin.unregistered"
    PLUGIN_REGISTERED = "plugin.registered"
    API_INVALID_TEXT = "api.invalid_text"
    API_ANSWER_TOO_LARGE = "api.answer_too_large"
    DEVICE_FLAPPING = "device.flapping"
    DEVICE_FLAP_ENDED = "device.flap_ended"
    DEVICE_INCIDENT = "device.incident"
    DEVICE_INCIDENT_RESOLVED = "device.incident_resolved"
    # The kubelet's verdict on a DRA device in its holder's Pod status (the Pods API).
    DEVICE_UNHEALTHY = "device.unhealthy"
    DEVICE_HEALTHY = "device.healthy"
    DEVICE_HEALTH_UNKNOWN = "device.health_unknown"
    # The end of a DRA device's story that no Pod status can confirm: no pod holds it any more.
    DEVICE_HEALTH_UNOBSERVED = "device.health_unobserved"
    # Issue 40: what no pod-resources answer says. An admin's DeviceTaintRule that matches every
    # device with NoExecute (it evicts every DRA pod of the cluster), and its end.
    DEVICE_TAINT_RULE_EVICTS_ALL = "device.taint_rule_evicts_all"
    DEVICE_TAINT_RULE_LIFTED = "device.taint_rule_lifted"
    # A pod evicted because a device it held was tainted (DeviceTaintManagerEviction).
    POD_EVICTED = "pod.evicted"
    # A pod the kubelet failed at admission for a device reason, and many of them in a window.
    POD_REJECTED = "pod.rejected"
    NODE_REJECTING_PODS = "node.rejecting_pods"
    NODE_REJECTING_PODS_ENDED = "node.rejecting_pods_ended"
    # Fewer devices known to the kubelet than the operator expects, and the count back.
    DEVICE_MISSING = "device.missing"
    DEVICE_MISSING_RESOLVED = "device.missing_resolved"
    # A failed device back only because its plugin or driver restarted: not a verified heal.
    DEVICE_RESET = "device.reset"


LIFECYCLE_KINDS = frozenset(
    {
        Kind.WATCHER_STARTED,
        Kind.KUBELET_CONNECTED,
        Kind.KUBELET_RESTARTED,
        Kind.KUBELET_UNREACHABLE,
        Kind.KUBELET_REACHABLE,
        Kind.API_DEGRADED,
        Kind.INVENTORY_SNAPSHOT,
        Kind.PLUGIN_UNREGISTERED,
        Kind.PLUGIN_REGISTERED,
        Kind.API_INVALID_TEXT,
        Kind.API_ANSWER_TOO_LARGE,
    }
)
DIFF_KINDS = frozenset(Kind) - LIFECYCLE_KINDS


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def _freeze(details: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(details))


@dataclass(frozen=True)
class Change:
    """One thing that happened on the node, before it is wrapped in an event envelope.

    `details` is JSON-ready (str keys; str, int, bool, None, lists and dicts)
    and read-only at the top level.
    """

    kind: Kind
    severity: Severity
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", _freeze(self.details))
