"""`[device_taint_rules]`: whether and how often the agent lists the cluster's DeviceTaintRules
(watcher.sources.device_taint_rules). Kept apart from the source, so that reading the settings
imports nothing of the API client."""

from __future__ import annotations

from dataclasses import dataclass, field

from watcher.config import field_meta

__all__ = ["DeviceTaintRulesSettings"]


@dataclass(frozen=True)
class DeviceTaintRulesSettings:
    enabled: bool = field(
        default=True,
        metadata=field_meta(
            "Read the cluster's DeviceTaintRules where the agent talks to the API server ([kubernetes] "
            "api: with a `kubernetes` sink, or `on`; needs `list` on resource.k8s.io devicetaintrules), "
            "match them against the node's held DRA devices, and count a NoSchedule/NoExecute rule's "
            "taint as Unhealthy (one story with the Pod status's and the slices'); a NoExecute rule "
            "with an empty selector is one critical `device.taint_rule_evicts_all`."
        ),
    )
    interval: float = field(
        default=10.0,
        metadata=field_meta(
            "Seconds between two lists of the DeviceTaintRules (short: a NoExecute rule evicts at once).",
            min=1,
            max=3600,
        ),
    )
