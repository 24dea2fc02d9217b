"""The kubernetes sink's settings, and the checks a config must pass before it is used."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from watcher.config import ConfigError, field_meta
from watcher.kubeapi.settings import ConnectionSettings
from watcher.model.changes import Kind
from watcher.sinks.base import BaseSinkSettings
from watcher.sinks.kubernetes.condition_plan import CONDITION_SUFFIX, check_condition_type, shared_types

__all__ = ["KubernetesSinkSettings", "check_settings"]

# The kinds the conditions are built from: a sink whose `kinds` left these out would report
# conditions that never clear, so check-config refuses that.
_NEEDED_KINDS = (
    Kind.WATCHER_STARTED,
    Kind.DEVICE_REMOVED,
    Kind.DEVICE_ADDED,
    Kind.DEVICE_FLAPPING,
    Kind.DEVICE_FLAP_ENDED,
    Kind.DEVICE_INCIDENT,
)


@dataclass(frozen=True)
class KubernetesSinkSettings(BaseSinkSettings, ConnectionSettings):
    """The sink's own settings, and (ConnectionSettings) how it connects when `[kubernetes]` says
    nothing of that: configurations written before `[kubernetes]` existed keep working."""

    events: bool = field(
        default=True, metadata=field_meta("Create Events on the affected Pods and the Node.")
    )
    conditions: bool = field(
        default=True, metadata=field_meta("Keep one Node condition per device resource (docs/kubernetes.md).")
    )
    condition_types: Mapping[str, str] = field(
        default_factory=dict,
        metadata=field_meta(
            "Condition type per resource, overriding the derived one (nvidia.com/gpu -> "
            f"NvidiaGpu{CONDITION_SUFFIX}); every type must end in {CONDITION_SUFFIX!r}."
        ),
    )
    event_namespace: str = field(
        default="default",
        metadata=field_meta("Namespace of the Node's Events (a Node has none; kubectl looks in default)."),
    )
    reporting_controller: str = field(
        default="pod-resources-watcher",
        metadata=field_meta("The Events' reportingController; reportingInstance is the node name."),
    )
    series_window: float = field(
        default=1800.0,
        metadata=field_meta(
            "Seconds within which a repeat of the same Event updates its series instead of creating "
            "another (keep under the API server's event TTL, 1 h by default).",
            min=1,
            max=86400,
        ),
    )
    # One delivery per re-query, whole: a mass failure becomes one Event per pod, one condition write.
    group: Literal["none", "cycle", "window"] = field(
        default="cycle",
        metadata=field_meta("cycle (default): one delivery per re-query; see the other sinks for the rest."),
    )
    max_batch: int = field(
        default=1000, metadata=field_meta("Most events in one delivery.", min=1, max=10000)
    )
    type: Literal["kubernetes"] = "kubernetes"


def check_settings(path: str, s: KubernetesSinkSettings) -> None:
    from fnmatch import fnmatchcase

    for kind in _NEEDED_KINDS:
        if not any(fnmatchcase(str(kind), p) for p in s.kinds):
            raise ConfigError(
                f"{path}.kinds: must let {kind} through: the Node conditions are built from "
                + ", ".join(str(k) for k in _NEEDED_KINDS)
            )
    for key in ("resources", "namespaces"):
        if getattr(s, key) != ("*",):
            raise ConfigError(
                f'{path}.{key}: must stay ["*"] for a kubernetes sink: its conditions are reconciled '
                "from events that name no resource or namespace"
            )
    if s.min_severity != "info":
        raise ConfigError(
            f'{path}.min_severity: must stay "info" for a kubernetes sink (it reconciles at start)'
        )
    for resource, ctype in s.condition_types.items():
        problem = check_condition_type(ctype)
        if problem is not None:
            raise ConfigError(f"{path}.condition_types.{resource}: {problem}")
    shared = sorted(shared_types(s.condition_types, s.condition_types).items())
    if shared:
        # One condition for two resources: one of them back would say False over the other's failure.
        ctype, resources = shared[0]
        raise ConfigError(
            f"{path}.condition_types.{resources[1]}: {ctype} is {resources[0]}'s condition type "
            "too; each resource needs a type of its own"
        )
    if s.event_namespace not in ("default", "kube-system"):
        raise ConfigError(
            f"{path}.event_namespace: the API server keeps Events about a Node (which has no namespace) "
            'only in "default" or "kube-system"'
        )
    if not _QUALIFIED.fullmatch(s.reporting_controller):
        raise ConfigError(
            f"{path}.reporting_controller: not a qualified name (e.g. example.com/pod-resources-watcher)"
        )
    if s.kubeconfig is not None and s.server is not None:
        raise ConfigError(f"{path}.server: only for in-cluster use; the kubeconfig names its server")


# What the API server takes as an Event's reportingController: [DNS subdomain "/"] name.
_QUALIFIED = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
