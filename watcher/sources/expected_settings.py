"""`[expected]`: how many devices of a resource the node should have, for `device.missing`
(watcher.model.expected). Kept apart from the source that reads the Node, so that reading the
settings imports nothing of the API client."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from watcher.config import ConfigError, field_meta

__all__ = ["ExpectedSettings", "check_expected"]

# An extended resource's name (nvidia.com/gpu): a DNS subdomain, '/', a name of up to 63 characters;
# a label key is the same with the prefix optional (GPU feature discovery's nvidia.com/gpu.count).
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_RESOURCE = re.compile(rf"{_SUBDOMAIN}/{_NAME}")
_LABEL = re.compile(rf"({_SUBDOMAIN}/)?{_NAME}")
MAX_DEVICES = 4096  # per resource on one node: far above any machine, low enough to catch a typo


@dataclass(frozen=True)
class ExpectedSettings:
    devices: Mapping[str, int] = field(
        default_factory=dict,
        metadata=field_meta(
            'Devices each resource should have on this node (`{ "nvidia.com/gpu" = 8 }`): fewer known '
            "to the kubelet (allocatable + unhealthy, from the Node's status.capacity) is one "
            "`device.missing`, back to the count its `device.missing_resolved`. Needs the API server "
            "([kubernetes] api: a kubernetes sink, or `on`).",
            min=1,
            max=MAX_DEVICES,
        ),
    )
    labels: Mapping[str, str] = field(
        default_factory=dict,
        metadata=field_meta(
            "The Node label holding each resource's count, read from the agent's own Node "
            '(`{ "nvidia.com/gpu" = "nvidia.com/gpu.count" }`, GPU feature discovery\'s label): a '
            "label absent or not a whole number expects nothing. Needs `get` on nodes/status, which "
            "the shipped RBAC grants."
        ),
    )
    interval: float = field(
        default=30.0,
        metadata=field_meta(
            "Seconds between two reads of the agent's Node (its labels and status.capacity) while an "
            "expectation is configured; nothing is read without one.",
            min=1,
            max=3600,
        ),
    )

    @property
    def configured(self) -> bool:
        return bool(self.devices or self.labels)


def check_expected(expected: ExpectedSettings, *, api: bool) -> None:
    """The names are a resource's and a label key's, each resource expected one way, and the API
    server is there: without the Node's capacity an unhealthy device would look vanished."""
    named = [("devices", r) for r in expected.devices] + [("labels", r) for r in expected.labels]
    for key, resource in named:
        if not _RESOURCE.fullmatch(resource) or len(resource) > 253 + 64:
            raise ConfigError(
                f"expected.{key}.{resource}: not a device resource's name "
                "(vendor-domain/name, e.g. nvidia.com/gpu)"
            )
    for resource, label in expected.labels.items():
        if not _LABEL.fullmatch(label):
            raise ConfigError(f"expected.labels.{resource}: not a label key (e.g. nvidia.com/gpu.count)")
        if resource in expected.devices:
            raise ConfigError(
                f"expected.labels.{resource}: expected.devices sets its count too; set one of the two"
            )
    if expected.configured and not api:
        raise ConfigError(
            'expected: needs the API server ([kubernetes] api = "on", or a kubernetes sink): the '
            "Node's status.capacity is what tells an unhealthy device, still known to the kubelet, "
            "from a vanished one"
        )
