"""The node's inventory: an immutable, normalized model of the two kubelet responses.

Pure: no I/O, no asyncio, no gRPC. The kubelet answers from Go maps in no
particular order and reports one device entry per device per NUMA node, so
`build()` merges and sorts everything; two responses that differ only in order
or in how entries are split give equal inventories and the same `content_hash`.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

__all__ = [
    "FORMAT",
    "Device",
    "Memory",
    "ClaimDevice",
    "Claim",
    "Container",
    "Pod",
    "NumaCapacity",
    "ResourceCapacity",
    "CpuCapacity",
    "MemoryCapacity",
    "MissingDevice",
    "Inventory",
    "build",
    "build_allocatable",
    "build_pod",
    "claim_json",
    "cpuset_string",
    "from_canonical",
]

# Bumped whenever the canonical form changes, so old hashes never match new ones.
FORMAT = 2

NumaNodes = tuple[int, ...]


# --- The protobuf shapes `build()` reads (structural, so this module needs no gRPC). ---


class _NUMANode(Protocol):
    @property
    def ID(self) -> int: ...  # noqa: N802 - the wire name


class _Topology(Protocol):
    @property
    def nodes(self) -> Sequence[_NUMANode]: ...


class _Devices(Protocol):
    @property
    def resource_name(self) -> str: ...
    @property
    def device_ids(self) -> Sequence[str]: ...
    @property
    def topology(self) -> _Topology: ...


class _Memory(Protocol):
    @property
    def memory_type(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def topology(self) -> _Topology: ...


class _CDIDevice(Protocol):
    @property
    def name(self) -> str: ...


class _ClaimResource(Protocol):
    @property
    def cdi_devices(self) -> Sequence[_CDIDevice]: ...
    @property
    def driver_name(self) -> str: ...
    @property
    def pool_name(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def share_id(self) -> str: ...
    def HasField(self, field_name: Any) -> bool: ...  # noqa: N802 - protobuf API


class _DynamicResource(Protocol):
    @property
    def claim_name(self) -> str: ...
    @property
    def claim_namespace(self) -> str: ...
    @property
    def claim_resources(self) -> Sequence[_ClaimResource]: ...


class _Container(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> Sequence[_Devices]: ...
    @property
    def cpu_ids(self) -> Sequence[int]: ...
    @property
    def memory(self) -> Sequence[_Memory]: ...
    @property
    def dynamic_resources(self) -> Sequence[_DynamicResource]: ...


class _Pod(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def containers(self) -> Sequence[_Container]: ...
    @property
    def cpu_ids(self) -> Sequence[int]: ...
    @property
    def memory(self) -> Sequence[_Memory]: ...


class AllocatableResponse(Protocol):
    @property
    def devices(self) -> Sequence[_Devices]: ...
    @property
    def cpu_ids(self) -> Sequence[int]: ...
    @property
    def memory(self) -> Sequence[_Memory]: ...


class ListResponse(Protocol):
    @property
    def pod_resources(self) -> Sequence[_Pod]: ...


# --- The model. ---


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


@dataclass(frozen=True)
class Pod:
    """A pod's holdings; pod-level CPUs and memory overlap the containers' (newest kubelets)."""

    namespace: str
    name: str
    containers: tuple[Container, ...]
    cpu_ids: tuple[int, ...]
    memory: tuple[Memory, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def canonical_bytes(self) -> bytes:
        # Cached on the pod (no slots, for that) because the decoder carries unchanged
        # pods into the next inventory: their part of its canonical form is then free.
        return _dumps(_pod_json(self))


@dataclass(frozen=True, slots=True)
class NumaCapacity:
    """Device counts on one NUMA node (`numa` None: devices without topology).

    A device attached to several NUMA nodes counts on each of them.
    `allocatable` and `free` are None when the allocatable side is unknown.
    """

    numa: int | None
    allocatable: int | None
    allocated: int
    free: int | None


@dataclass(frozen=True, slots=True)
class ResourceCapacity:
    """Device counts for one resource.

    `allocated` counts every device held by a pod, `unavailable` those of them
    that are absent from allocatable; `free` is allocatable minus the allocated
    ones that are allocatable, so it is never negative.
    """

    resource: str
    allocatable: int | None
    allocated: int
    free: int | None
    unavailable: int
    per_numa: tuple[NumaCapacity, ...]


@dataclass(frozen=True, slots=True)
class CpuCapacity:
    allocatable: int | None
    allocated: int
    free: int | None
    allocated_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MemoryCapacity:
    """Bytes of one memory type on one set of NUMA nodes."""

    type: str
    numa: NumaNodes
    allocatable: int | None
    allocated: int
    free: int | None


@dataclass(frozen=True, slots=True)
class MissingDevice:
    """A device allocated to pods but absent from allocatable: failed or vanished while in use."""

    resource: str
    id: str
    numa: NumaNodes
    holders: tuple[str, ...]  # "namespace/pod/container"


@dataclass(frozen=True)
class Inventory:
    """A normalized snapshot of the node. Build with `build()`; compare with `==` or `content_hash`.

    `allocatable_known` is False in List-only mode (GetAllocatableResources
    disabled or absent): then the allocatable fields are empty and nothing can
    be called missing.
    """

    devices: tuple[Device, ...]
    cpu_ids: tuple[int, ...]
    memory: tuple[Memory, ...]
    pods: tuple[Pod, ...]
    allocatable_known: bool = True

    # -- canonical form and hash --

    @property
    def canonical(self) -> dict[str, Any]:
        """The JSON-ready canonical form: sorted, merged, every field explicit.

        A fresh dict on every access, so no caller can corrupt the cached hash.
        """
        return {
            "format": FORMAT,
            "allocatable": self._allocatable_json(),
            "pods": [_pod_json(p) for p in self.pods],
        }

    def _allocatable_json(self) -> dict[str, Any]:
        return {
            "known": self.allocatable_known,
            "devices": _devices_json(self.devices),
            "cpu_ids": list(self.cpu_ids),
            "memory": [_memory_json(m) for m in self.memory],
        }

    @cached_property
    def canonical_bytes(self) -> bytes:
        """`canonical` as compact JSON: exactly `_dumps(self.canonical)`, assembled from each pod's own
        (cached) fragment so that an inventory sharing most pods with the last one costs little."""
        head = _dumps({"format": FORMAT, "allocatable": self._allocatable_json()})
        pods = b",".join(p.canonical_bytes for p in self.pods)
        return head[:-1] + b',"pods":[' + pods + b"]}"

    @cached_property
    def content_hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes).hexdigest()

    # -- derived views --

    @cached_property
    def devices_by_resource(self) -> Mapping[str, Mapping[str, NumaNodes]]:
        out: dict[str, dict[str, NumaNodes]] = {}
        for d in self.devices:
            out.setdefault(d.resource, {})[d.id] = d.numa
        return out

    @cached_property
    def holders(self) -> Mapping[tuple[str, str], tuple[tuple[str, ...], NumaNodes]]:
        """(resource, device id) -> ("ns/pod/container", ...) and the NUMA nodes pods saw."""
        held: dict[tuple[str, str], tuple[list[str], set[int]]] = {}
        for pod in self.pods:
            for c in pod.containers:
                who = f"{pod.namespace}/{pod.name}/{c.name}"
                for d in c.devices:
                    names, numa = held.setdefault((d.resource, d.id), ([], set()))
                    names.append(who)
                    numa.update(d.numa)
        return {k: (tuple(sorted(v[0])), tuple(sorted(v[1]))) for k, v in held.items()}

    @cached_property
    def missing_devices(self) -> tuple[MissingDevice, ...]:
        if not self.allocatable_known:
            return ()
        by_res = self.devices_by_resource
        return tuple(
            MissingDevice(res, dev_id, numa, names)
            for (res, dev_id), (names, numa) in sorted(self.holders.items())
            if dev_id not in by_res.get(res, {})
        )

    @cached_property
    def capacity(self) -> tuple[ResourceCapacity, ...]:
        by_res = self.devices_by_resource
        held_by_res: dict[str, dict[str, NumaNodes]] = defaultdict(dict)
        for (res, dev_id), (_, numa) in self.holders.items():
            held_by_res[res][dev_id] = numa
        known = self.allocatable_known
        out = []
        for res in sorted(set(by_res) | set(held_by_res)):
            alloc = by_res.get(res, {})
            held = held_by_res.get(res, {})
            n_alloc: dict[int | None, int] = defaultdict(int)
            n_held: dict[int | None, int] = defaultdict(int)
            n_free: dict[int | None, int] = defaultdict(int)
            for dev_id, numa in alloc.items():
                for node in numa or (None,):
                    n_alloc[node] += 1
                    if dev_id not in held:
                        n_free[node] += 1
            for dev_id, pod_numa in held.items():
                # Trust the allocatable topology when the device is still there.
                numa = alloc.get(dev_id, pod_numa)
                for node in numa or (None,):
                    n_held[node] += 1
            unavailable = sum(1 for dev_id in held if dev_id not in alloc) if known else 0
            per_numa = tuple(
                NumaCapacity(
                    node,
                    n_alloc[node] if known else None,
                    n_held[node],
                    n_free[node] if known else None,
                )
                for node in sorted(set(n_alloc) | set(n_held), key=_numa_sort_key)
            )
            out.append(
                ResourceCapacity(
                    resource=res,
                    allocatable=len(alloc) if known else None,
                    allocated=len(held),
                    free=sum(1 for dev_id in alloc if dev_id not in held) if known else None,
                    unavailable=unavailable,
                    per_numa=per_numa,
                )
            )
        return tuple(out)

    @cached_property
    def cpus(self) -> CpuCapacity:
        allocated: set[int] = set()
        for pod in self.pods:
            allocated.update(pod.cpu_ids)
            for c in pod.containers:
                allocated.update(c.cpu_ids)
        if not self.allocatable_known:
            return CpuCapacity(None, len(allocated), None, tuple(sorted(allocated)))
        free = len(set(self.cpu_ids) - allocated)
        return CpuCapacity(len(self.cpu_ids), len(allocated), free, tuple(sorted(allocated)))

    @cached_property
    def memory_capacity(self) -> tuple[MemoryCapacity, ...]:
        allocated: dict[tuple[str, NumaNodes], int] = defaultdict(int)
        for pod in self.pods:
            # Pod-level values overlap the containers': count the larger of the two.
            per_pod: dict[tuple[str, NumaNodes], int] = defaultdict(int)
            for c in pod.containers:
                for m in c.memory:
                    per_pod[(m.type, m.numa)] += m.size
            for m in pod.memory:
                key = (m.type, m.numa)
                per_pod[key] = max(per_pod[key], m.size)
            for key, size in per_pod.items():
                allocated[key] += size
        alloc = {(m.type, m.numa): m.size for m in self.memory}
        known = self.allocatable_known
        return tuple(
            MemoryCapacity(
                type=key[0],
                numa=key[1],
                allocatable=alloc.get(key, 0) if known else None,
                allocated=allocated.get(key, 0),
                free=max(0, alloc.get(key, 0) - allocated.get(key, 0)) if known else None,
            )
            for key in sorted(set(alloc) | set(allocated))
        )

    def pod(self, namespace: str, name: str) -> Pod | None:
        for p in self.pods:
            if p.namespace == namespace and p.name == name:
                return p
        return None

    def derived(self) -> dict[str, Any]:
        """Capacity, CPU, memory and missing-device figures as JSON-ready data."""
        return {
            "capacity": [
                {
                    "resource": c.resource,
                    "allocatable": c.allocatable,
                    "allocated": c.allocated,
                    "free": c.free,
                    "unavailable": c.unavailable,
                    "per_numa": [
                        {
                            "numa": n.numa,
                            "allocatable": n.allocatable,
                            "allocated": n.allocated,
                            "free": n.free,
                        }
                        for n in c.per_numa
                    ],
                }
                for c in self.capacity
            ],
            "cpus": {
                "allocatable": self.cpus.allocatable,
                "allocated": self.cpus.allocated,
                "free": self.cpus.free,
            },
            "memory": [
                {
                    "type": m.type,
                    "numa": list(m.numa),
                    "allocatable": m.allocatable,
                    "allocated": m.allocated,
                    "free": m.free,
                }
                for m in self.memory_capacity
            ],
            "missing_devices": [
                {"resource": m.resource, "id": m.id, "numa": list(m.numa), "holders": list(m.holders)}
                for m in self.missing_devices
            ],
        }


def cpuset_string(ids: Iterable[int]) -> str:
    """Linux cpuset notation, e.g. `0-3,8,10-11`; empty for no CPUs."""
    out: list[str] = []
    start = prev = None
    for i in sorted(set(ids)):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def _numa_sort_key(node: int | None) -> tuple[int, int]:
    return (1, 0) if node is None else (0, node)


# --- canonical JSON helpers ---


def _dumps(obj: Any) -> bytes:
    # Every dict of the canonical form is built in a fixed key order from sorted
    # content, so sorting the keys again would only cost time.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _devices_json(devices: Iterable[Device]) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for d in devices:
        out.setdefault(d.resource, {})[d.id] = list(d.numa)
    return out


def _memory_json(m: Memory) -> dict[str, Any]:
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


def _pod_json(p: Pod) -> dict[str, Any]:
    return {
        "namespace": p.namespace,
        "name": p.name,
        "cpu_ids": list(p.cpu_ids),
        "memory": [_memory_json(m) for m in p.memory],
        "containers": [
            {
                "name": c.name,
                "devices": _devices_json(c.devices),
                "cpu_ids": list(c.cpu_ids),
                "memory": [_memory_json(m) for m in c.memory],
                "dynamic_resources": [claim_json(cl) for cl in c.claims],
            }
            for c in p.containers
        ],
    }


# --- building from the wire ---


def _merge_devices(entries: Iterable[_Devices], into: dict[tuple[str, str], set[int]]) -> None:
    for entry in entries:
        nodes = [n.ID for n in entry.topology.nodes]
        res = entry.resource_name
        for dev_id in entry.device_ids:
            numa = into.get((res, dev_id))
            if numa is None:
                into[(res, dev_id)] = set(nodes)
            else:
                numa.update(nodes)


def _merge_memory(entries: Sequence[_Memory], into: dict[tuple[str, NumaNodes], int]) -> None:
    for m in entries:
        nodes = m.topology.nodes
        # One NUMA node is by far the common case: skip the set and the sort.
        numa = (nodes[0].ID,) if len(nodes) == 1 else tuple(sorted({n.ID for n in nodes}))
        key = (m.memory_type, numa)
        into[key] = into.get(key, 0) + m.size


def _freeze_devices(merged: Mapping[tuple[str, str], set[int]]) -> tuple[Device, ...]:
    if not merged:
        return ()
    return tuple(Device(res, dev_id, tuple(sorted(merged[(res, dev_id)]))) for res, dev_id in sorted(merged))


def _freeze_memory(merged: Mapping[tuple[str, NumaNodes], int]) -> tuple[Memory, ...]:
    if not merged:
        return ()
    return tuple(Memory(t, numa, merged[(t, numa)]) for t, numa in sorted(merged))


class _ContainerAcc:
    __slots__ = ("claims", "cpu_ids", "devices", "memory")

    def __init__(self) -> None:
        self.devices: dict[tuple[str, str], set[int]] = {}
        self.cpu_ids: set[int] = set()
        self.memory: dict[tuple[str, NumaNodes], int] = {}
        self.claims: dict[tuple[str, str], set[ClaimDevice]] = {}


class _PodAcc:
    __slots__ = ("containers", "cpu_ids", "memory")

    def __init__(self) -> None:
        self.containers: dict[str, _ContainerAcc] = {}
        self.cpu_ids: set[int] = set()
        self.memory: dict[tuple[str, NumaNodes], int] = {}


def _claim_device(r: _ClaimResource) -> ClaimDevice:
    return ClaimDevice(
        driver=r.driver_name,
        pool=r.pool_name,
        device=r.device_name,
        cdi_devices=tuple(sorted({c.name for c in r.cdi_devices})),
        share_id=r.share_id if r.HasField("share_id") else None,
    )


def build(allocatable: AllocatableResponse | None, pods: ListResponse) -> Inventory:
    """Normalize the two responses into an Inventory.

    `allocatable` is None in List-only mode. Entries naming the same device,
    container, pod or claim are merged; repeated ids are de-duplicated; memory
    blocks of the same type and NUMA nodes are summed.
    """
    groups: dict[tuple[str, str], list[_Pod]] = {}
    for p in pods.pod_resources:
        groups.setdefault((p.namespace, p.name), []).append(p)
    devices, cpu_ids, memory = build_allocatable(allocatable) if allocatable is not None else ((), (), ())
    return Inventory(
        devices=devices,
        cpu_ids=cpu_ids,
        memory=memory,
        pods=tuple(build_pod(ns, name, groups[(ns, name)]) for ns, name in sorted(groups)),
        allocatable_known=allocatable is not None,
    )


def build_allocatable(
    allocatable: AllocatableResponse,
) -> tuple[tuple[Device, ...], tuple[int, ...], tuple[Memory, ...]]:
    """The allocatable side of an Inventory: devices, CPU ids and memory, merged and sorted."""
    devices: dict[tuple[str, str], set[int]] = {}
    memory: dict[tuple[str, NumaNodes], int] = {}
    _merge_devices(allocatable.devices, devices)
    _merge_memory(allocatable.memory, memory)
    return _freeze_devices(devices), tuple(sorted(set(allocatable.cpu_ids))), _freeze_memory(memory)


def build_pod(namespace: str, name: str, entries: Iterable[_Pod]) -> Pod:
    """One pod from every List entry naming it (normally one), merged."""
    acc = _PodAcc()
    for p in entries:
        acc.cpu_ids.update(p.cpu_ids)
        _merge_memory(p.memory, acc.memory)
        for c in p.containers:
            cacc = acc.containers.get(c.name)
            if cacc is None:
                cacc = acc.containers[c.name] = _ContainerAcc()
            if c.devices:
                _merge_devices(c.devices, cacc.devices)
            cacc.cpu_ids.update(c.cpu_ids)
            if c.memory:
                _merge_memory(c.memory, cacc.memory)
            for dr in c.dynamic_resources:
                claim = cacc.claims.setdefault((dr.claim_namespace, dr.claim_name), set())
                claim.update(_claim_device(r) for r in dr.claim_resources)
    return Pod(
        namespace=namespace,
        name=name,
        containers=tuple(
            Container(
                name=cname,
                devices=_freeze_devices(c.devices),
                cpu_ids=tuple(sorted(c.cpu_ids)),
                memory=_freeze_memory(c.memory),
                claims=tuple(
                    Claim(cns, cn, tuple(sorted(c.claims[(cns, cn)], key=_claim_device_key)))
                    for cns, cn in sorted(c.claims)
                )
                if c.claims
                else (),
            )
            for cname, c in sorted(acc.containers.items())
        ),
        cpu_ids=tuple(sorted(acc.cpu_ids)),
        memory=_freeze_memory(acc.memory),
    )


def _claim_device_key(d: ClaimDevice) -> tuple[str, str, str, tuple[str, ...], bool, str]:
    # Unset share_id sorts first and never ties with any real value.
    return (d.driver, d.pool, d.device, d.cdi_devices, d.share_id is not None, d.share_id or "")


# --- reading the canonical form back (persisted state) ---


def _devices_from(data: Mapping[str, Mapping[str, Sequence[int]]]) -> tuple[Device, ...]:
    return tuple(
        Device(res, dev_id, tuple(data[res][dev_id])) for res in sorted(data) for dev_id in sorted(data[res])
    )


def _memory_from(data: Sequence[Mapping[str, Any]]) -> tuple[Memory, ...]:
    return tuple(Memory(str(m["type"]), tuple(m["numa"]), int(m["size"])) for m in data)


def from_canonical(data: Mapping[str, Any]) -> Inventory:
    """Rebuild an Inventory from `Inventory.canonical` (e.g. loaded from the state file).

    Raises ValueError on any other format or shape.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"malformed inventory: expected an object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ValueError(f"unsupported inventory format {data.get('format')!r}, expected {FORMAT}")
    try:
        alloc = data["allocatable"]
        pods = tuple(
            Pod(
                namespace=p["namespace"],
                name=p["name"],
                cpu_ids=tuple(p["cpu_ids"]),
                memory=_memory_from(p["memory"]),
                containers=tuple(
                    Container(
                        name=c["name"],
                        devices=_devices_from(c["devices"]),
                        cpu_ids=tuple(c["cpu_ids"]),
                        memory=_memory_from(c["memory"]),
                        claims=tuple(
                            Claim(
                                cl["namespace"],
                                cl["name"],
                                tuple(
                                    ClaimDevice(
                                        d["driver"],
                                        d["pool"],
                                        d["device"],
                                        tuple(d["cdi_devices"]),
                                        d["share_id"],
                                    )
                                    for d in cl["devices"]
                                ),
                            )
                            for cl in c["dynamic_resources"]
                        ),
                    )
                    for c in p["containers"]
                ),
            )
            for p in data["pods"]
        )
        return Inventory(
            devices=_devices_from(alloc["devices"]),
            cpu_ids=tuple(alloc["cpu_ids"]),
            memory=_memory_from(alloc["memory"]),
            pods=pods,
            allocatable_known=bool(alloc["known"]),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"malformed inventory: {err!r}") from err
