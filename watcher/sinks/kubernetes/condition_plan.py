"""What each Node condition the agent owns says: one per device resource, True while any of its
devices is failed or missing, False once every one is back; its type is derived from the resource
(or configured) and always ends in CONDITION_SUFFIX, and its message starts with OWNER_MARK, which is
how the agent (and its admission policy) tells its own conditions from another writer's of a similar
name. Pure: `conditions` writes them."""

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
    "OWNER_MARK",
    "REJECTING_SUFFIX",
    "MAX_MESSAGE_BYTES",
    "NodeCondition",
    "condition_type",
    "check_condition_type",
    "conditions_for",
    "is_owned",
    "shared_types",
]

# Every condition type the agent owns ends in this: the shipped admission policy lets the agent change
# only conditions whose type ends so, never the kubelet's (Ready, MemoryPressure, NetworkUnavailable…).
CONDITION_SUFFIX = "DevicesUnavailable"
# A suffix is only a naming habit another controller may share (a NIC operator's
# VendorNicDevicesUnavailable): every message the agent writes starts with this, and a condition
# without it is another writer's, never changed or removed, whatever its type. The admission policy
# (deploy/kubernetes/reporting/admissionpolicy.yaml) holds the agent to the same rule.
OWNER_MARK = "pod-resources-watcher: "
# A resource with fewer devices than expected has a condition of its own (episodes.MISSING), owned
# likewise: this suffix (NvidiaGpuDevicesMissing) and our mark.
MISSING_SUFFIX = "DevicesMissing"
# A node that keeps rejecting a resource's pods has a condition of its own (episodes.REJECTING), owned
# likewise: this suffix (NvidiaGpuPodsRejected) and our mark.
REJECTING_SUFFIX = "PodsRejected"
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


def is_owned(ctype: str, message: str | None) -> bool:
    """Whether a condition on the node is one this agent wrote: our suffix and our mark."""
    if ctype.endswith(MISSING_SUFFIX) and ctype != MISSING_SUFFIX and _TYPE.fullmatch(ctype):
        return (message or "").startswith(OWNER_MARK)
    rejecting = ctype.endswith(REJECTING_SUFFIX) and ctype != REJECTING_SUFFIX and _TYPE.fullmatch(ctype)
    return (check_condition_type(ctype) is None or bool(rejecting)) and (message or "").startswith(OWNER_MARK)


def shared_types(
    resources: Iterable[str], overrides: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """Condition types that more than one of `resources` maps to (nvidia.com/gpu and nvidia.io/gpu
    both derive NvidiaGpuDevicesUnavailable): a config error that `condition_types` resolves."""
    by_type: dict[str, list[str]] = {}
    for resource in sorted(set(resources)):
        by_type.setdefault(condition_type(resource, overrides), []).append(resource)
    return {t: rs for t, rs in by_type.items() if len(rs) > 1}


def conditions_for(
    missing: Mapping[str, Mapping[str, Sequence[str]]],
    resources: Iterable[str],
    overrides: Mapping[str, str] | None = None,
) -> list[NodeCondition]:
    """The condition of each resource in `resources`, in order of type. Resources that share a type
    share its condition, True while any of them has a device missing: one of them back must never
    write False over another's failure."""
    asked = set(resources)
    types = {condition_type(r, overrides) for r in asked}
    involved = asked | {r for r in missing if condition_type(r, overrides) in types}
    by_type: dict[str, list[str]] = {}
    for resource in sorted(involved):
        by_type.setdefault(condition_type(resource, overrides), []).append(resource)
    out = []
    for ctype, shared in sorted(by_type.items()):
        parts = []
        for resource in shared:
            devices = sorted(missing.get(resource, {}))
            if not devices:
                continue
            hit = pods_of(h for dev in devices for h in missing[resource][dev])
            part = f"{len(devices)} {resource} device(s) failed, missing or flapping: {listed(devices)}"
            parts.append(part + (f"; pods hit: {listed(hit)}" if hit else "; none was allocated to a pod"))
        if parts:
            message = fit(OWNER_MARK + "; ".join(parts), MAX_MESSAGE_BYTES)
            out.append(NodeCondition(ctype, "True", "DevicesFailedOrMissing", message))
        else:
            message = f"{OWNER_MARK}every {' and '.join(shared)} device is in the kubelet's allocatable set"
            message = fit(printable(message), MAX_MESSAGE_BYTES)
            out.append(NodeCondition(ctype, "False", "DevicesAvailable", message))
    return out
