"""The frozen records an Inventory is made of, and their canonical JSON. Pure.

Every record is normalized by whoever builds it (`watcher.model.build`): tuples
sorted, entries naming the same thing merged. The JSON helpers rely on that and
never sort again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NUMA_ID_LIMIT",
    "NUMA_IDS_MAX",
    "NumaNodes",
    "Device",
    "Memory",
    "ClaimDevice",
    "Claim",
    "Container",
    "Pod",
    "compact_json",
    "devices_json",
    "memory_json",
    "claim_json",
    "pod_json",
]

NumaNodes = tuple[int, ...]

# NUMA ids are chosen by device plugins, and nothing but the receive limit bounds how many one lists:
# 100,000 ids on one device took the agent past its memory limit and /metrics past what Prometheus
# takes. Linux numbers its NUMA nodes below 1024 (MAX_NUMNODES at the largest NODES_SHIFT, 10), and
# no device sits on more than a few of them, so an id outside [0, NUMA_ID_LIMIT) is dropped and a set
# keeps its NUMA_IDS_MAX lowest ids (the lowest, so that the kubelet's order never changes the set).
NUMA_ID_LIMIT = 1024
NUMA_IDS_MAX = 64


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a resource with the NUMA nodes it is attached to (empty: no topology)."""

    resource: str
    id: str
    numa: NumaNodes


@dataclass(frozen=True, slots=True)
class Memory:
    """A block of memory of one type (`memory`, `hugepages-1Gi`, ...) on a set of NUMA nodes."""

    type: str
    numa: NumaNodes
    size: int


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a DRA claim resolved to."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True, slots=True)
class Claim:
    """A dynamic-resource (DRA) claim as seen by one container."""

    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...]


@dataclass(frozen=True, slots=True)
class Container:
    """What one container (sidecars included) holds exclusively."""

    name: str
    devices: tuple[Device, ...]
    cpu_ids: tuple[int, ...]
    memory: tuple[Memory, ...]
    claims: tuple[Claim, ...]


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod's holdings; pod-level CPUs and memory overlap the containers' (newest kubelets)."""

    namespace: str
    name: str
    containers: tuple[Container, ...]
    cpu_ids: tuple[int, ...]
    memory: tuple[Memory, ...]
    # The SHA-256 of `canonical_bytes`, made on first use. Kept instead of the bytes themselves
    # (32 bytes, not several times the pod's size on the wire): the decoder carries unchanged
    # pods into the next inventory, so its hash costs only the pods that changed.
    _digest: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def canonical_bytes(self) -> bytes:
        """The pod's canonical JSON, compact; made afresh on every access (see `digest`)."""
        return compact_json(pod_json(self))

    @property
    def digest(self) -> bytes:
        """SHA-256 of `canonical_bytes`: equal digests, equal pods."""
        digest = self._digest
        if digest is None:
            digest = hashlib.sha256(self.canonical_bytes).digest()
            object.__setattr__(self, "_digest", digest)
        return digest


# --- canonical JSON helpers ---


def compact_json(obj: Any) -> bytes:
    # Every dict of the canonical form is built in a fixed key order from sorted
    # content, so sorting the keys again would only cost time.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def devices_json(devices: Iterable[Device]) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for d in devices:
        out.setdefault(d.resource, {})[d.id] = list(d.numa)
    return out


def memory_json(m: Memory) -> dict[str, Any]:
    return {"type": m.type, "numa": list(m.numa), "size": m.size}


def claim_json(c: Claim) -> dict[str, Any]:
    """A claim in the canonical JSON form (also what events carry)."""
    return {
        "namespace": c.namespace,
        "name": c.name,
        "devices": [
            {
                "driver": d.driver,
                "pool": d.pool,
                "device": d.device,
                "cdi_devices": list(d.cdi_devices),
                "share_id": d.share_id,
            }
            for d in c.devices
        ],
    }


def pod_json(p: Pod) -> dict[str, Any]:
    return {
        "namespace": p.namespace,
        "name": p.name,
        "cpu_ids": list(p.cpu_ids),
        "memory": [memory_json(m) for m in p.memory],
        "containers": [
            {
                "name": c.name,
                "devices": devices_json(c.devices),
                "cpu_ids": list(c.cpu_ids),
                "memory": [memory_json(m) for m in c.memory],
                "dynamic_resources": [claim_json(cl) for cl in c.claims],
            }
            for c in p.containers
        ],
    }
