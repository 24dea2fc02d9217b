"""What each Node condition the agent owns says: one per device resource, True while any of its
devices is failed or missing, False once every one is back; its type is derived from the resource
(or configured) and always ends in CONDITION_SUFFIX. Pure: `conditions` writes them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from watcher.model.wording import printable
from watcher.sinks.kubernetes.notes import fit, listed, pods_of

__all__ = [
    "CONDITION_SUFFIX",
    "MAX_MESSAGE_BYTES",
    "NodeCondition",
    "condition_type",
    "check_condition_type",
    "conditions_for",
]

# Every condition type the agent owns ends in this: the shipped admission policy lets the agent change
# only conditions whose type ends so, never the kubelet's (Ready, MemoryPressure, NetworkUnavailable…).
CONDITION_SUFFIX = "DevicesUnavailable"
# A condition's message is not capped by the API, but `kubectl describe node` prints it on one line.
MAX_MESSAGE_BYTES = 1024


@dataclass(frozen=True)
class NodeCondition:
    type: str
    status: Literal["True", "False"]
    reason: str
    message: str


_WORD = re.compile(r"[A-Za-z0-9]+")
# A Node condition type as Kubernetes' own condition types are spelled (and as metav1.Condition
# validates them): a letter or digit first and last, letters, digits, '-', '_', '.' between.
_TYPE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,314}[A-Za-z0-9])?")


def condition_type(resource: str, overrides: Mapping[str, str] | None = None) -> str:
    """The Node condition type for a device resource: `overrides[resource]`, or CamelCase of the
    vendor's first domain label and the name, then the suffix: nvidia.com/gpu ->
    NvidiaGpuDevicesUnavailable, example.com/sriov-nic -> ExampleSriovNicDevicesUnavailable."""
    if overrides and resource in overrides:
        return overrides[resource]
    vendor, _, name = resource.rpartition("/")
    words = _WORD.findall(vendor.split(".")[0]) + _WORD.findall(name)
    derived = "".join(w[:1].upper() + w[1:] for w in words) + CONDITION_SUFFIX
    if check_condition_type(derived) is None:
        return derived
    # A name with nothing usable in it (or far too long): still one stable type per resource.
    return "Resource" + hashlib.sha256(resource.encode()).hexdigest()[:12] + CONDITION_SUFFIX


def check_condition_type(value: str) -> str | None:
    """Why `value` cannot be one of our condition types, or None."""
    if not _TYPE.fullmatch(value):
        return "not a valid condition type (letters, digits, '-', '_', '.'; a letter or digit first and last)"
    if not value.endswith(CONDITION_SUFFIX) or value == CONDITION_SUFFIX:
        return (
            f"must end in {CONDITION_SUFFIX!r} (after a name of its own): the shipped admission "
            "policy lets the agent change only conditions so named"
        )
    return None


def conditions_for(
    missing: Mapping[str, Mapping[str, Sequence[str]]],
    resources: Iterable[str],
    overrides: Mapping[str, str] | None = None,
) -> list[NodeCondition]:
    """The condition of each resource in `resources`, in order of type."""
    out = []
    for resource in sorted(set(resources)):
        devices = sorted(missing.get(resource, {}))
        ctype = condition_type(resource, overrides)
        if devices:
            hit = pods_of(h for dev in devices for h in missing[resource][dev])
            message = f"{len(devices)} {resource} device(s) failed, missing or flapping: {listed(devices)}"
            message += f"; pods hit: {listed(hit)}" if hit else "; none was allocated to a pod"
            out.append(
                NodeCondition(ctype, "True", "DevicesFailedOrMissing", fit(message, MAX_MESSAGE_BYTES))
            )
        else:
            message = f"every {resource} device is in the kubelet's allocatable set"
            message = fit(printable(message), MAX_MESSAGE_BYTES)
            out.append(NodeCondition(ctype, "False", "DevicesAvailable", message))
    return sorted(out, key=lambda c: c.type)
