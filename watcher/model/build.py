"""Building an Inventory: from the kubelet's two responses, and back from its canonical JSON. Pure.

The kubelet answers from Go maps in no particular order and reports one device
entry per device per NUMA node, so `build()` merges and sorts everything; two
responses that differ only in order or in how entries are split give equal
inventories and the same `content_hash`. The decoder (`watcher.kubelet.decoding`)
calls `build_allocatable` and `build_pod` directly to rebuild only what changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from watcher.model.inventory import FORMAT, Inventory
from watcher.model.records import (
    NUMA_ID_LIMIT,
    NUMA_IDS_MAX,
    Claim,
    ClaimDevice,
    Container,
    Device,
    Memory,
    NumaNodes,
    Pod,
)

__all__ = [
    "AllocatableResponse",
    "ListResponse",
    "FORMATS_READ",
    "build",
    "build_allocatable",
    "build_pod",
    "from_canonical",
    "allocatable_from_canonical",
    "pod_from_canonical",
    "pod_from_json",
]

# Canonical forms `from_canonical` reads: 2 has the same shape as 3 (only the hash differs).
FORMATS_READ = (2, FORMAT)

H = TypeVar("H", bound=Hashable)

# --- sharing equal values ---

# A large node repeats the same small values in thousands of containers: NUMA node sets, memory
# blocks (type, NUMA, size), a device seen by allocatable and by the container holding it, a
# container holding nothing. Each is built once and shared (records are immutable), which makes
# the model a fraction of its size. Bounded: emptied when full, so values of pods long gone are
# not kept for ever (what was shared stays shared; later values are shared from then on).
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 16_384


def _share(value: H) -> H:
    got = _SHARED.get(value)
    if got is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        _SHARED[value] = got = value
    return got


_VALID_NUMA = range(NUMA_ID_LIMIT)
_node_ids = attrgetter("ID")


def _numa(nodes: Iterable[int]) -> NumaNodes:
    """The NUMA set of `nodes`, bounded (see NUMA_IDS_MAX): the ids filtered before they are
    collected, in C, so the set never holds more than NUMA_ID_LIMIT of them whatever was listed."""
    return _share(tuple(sorted(set(filter(_VALID_NUMA.__contains__, nodes)))[:NUMA_IDS_MAX]))


def _topology(nodes: Sequence[_NUMANode]) -> NumaNodes:
    # One valid NUMA node is by far the common case: skip the filter and the sort.
    if len(nodes) == 1 and (only := nodes[0].ID) in _VALID_NUMA:
        return _share((only,))
    return _numa(map(_node_ids, nodes))


def _ids(ids: Iterable[int]) -> tuple[int, ...]:
    # CPU ids above 256 are an object each; the same few hundred are shared instead.
    return tuple(_share(i) for i in sorted(ids))


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


# --- building from the wire ---


def _merge_devices(entries: Iterable[_Devices], into: dict[tuple[str, str], NumaNodes]) -> None:
    # Each device id gets the entry's one shared, bounded set, not a set of its own: an entry may
    # list a million ids, each on the same many NUMA nodes. The lowest ids of a union are the lowest
    # of the parts' lowest, so bounding each entry first changes nothing.
    for entry in entries:
        nodes = _topology(entry.topology.nodes)
        res = entry.resource_name
        for dev_id in entry.device_ids:
            numa = into.get((res, dev_id))
            if numa is None:
                into[(res, dev_id)] = nodes
            elif numa != nodes:
                into[(res, dev_id)] = _numa((*numa, *nodes))


def _merge_memory(entries: Sequence[_Memory], into: dict[tuple[str, NumaNodes], int]) -> None:
    for m in entries:
        key = (m.memory_type, _topology(m.topology.nodes))
        into[key] = into.get(key, 0) + m.size


def _device(resource: str, dev_id: str, numa: Iterable[int]) -> Device:
    return _share(Device(sys.intern(resource), dev_id, _numa(numa)))


def _memory(mtype: str, numa: Iterable[int], size: int) -> Memory:
    return _share(Memory(sys.intern(mtype), _numa(numa), size))


def _freeze_devices(merged: Mapping[tuple[str, str], NumaNodes]) -> tuple[Device, ...]:
    if not merged:
        return ()
    return tuple(_device(res, dev_id, merged[(res, dev_id)]) for res, dev_id in sorted(merged))


def _freeze_memory(merged: Mapping[tuple[str, NumaNodes], int]) -> tuple[Memory, ...]:
    if not merged:
        return ()
    return _share(tuple(_memory(t, numa, merged[(t, numa)]) for t, numa in sorted(merged)))


class _ContainerAcc:
    __slots__ = ("claims", "cpu_ids", "devices", "memory")

    def __init__(self) -> None:
        self.devices: dict[tuple[str, str], NumaNodes] = {}
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
    devices: dict[tuple[str, str], NumaNodes] = {}
    memory: dict[tuple[str, NumaNodes], int] = {}
    _merge_devices(allocatable.devices, devices)
    _merge_memory(allocatable.memory, memory)
    return _freeze_devices(devices), _ids(set(allocatable.cpu_ids)), _freeze_memory(memory)


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
        namespace=sys.intern(namespace),
        name=name,
        containers=tuple(
            _share(
                Container(
                    name=sys.intern(cname),
                    devices=_freeze_devices(c.devices),
                    cpu_ids=_ids(c.cpu_ids),
                    memory=_freeze_memory(c.memory),
                    claims=tuple(
                        Claim(cns, cn, tuple(sorted(c.claims[(cns, cn)], key=_claim_device_key)))
                        for cns, cn in sorted(c.claims)
                    )
                    if c.claims
                    else (),
                )
            )
            for cname, c in sorted(acc.containers.items())
        ),
        cpu_ids=_ids(acc.cpu_ids),
        memory=_freeze_memory(acc.memory),
    )


def _claim_device_key(d: ClaimDevice) -> tuple[str, str, str, tuple[str, ...], bool, str]:
    # Unset share_id sorts first and never ties with any real value.
    return (d.driver, d.pool, d.device, d.cdi_devices, d.share_id is not None, d.share_id or "")


# --- reading the canonical form back (persisted state) ---


def _ints(values: Iterable[Any]) -> list[int]:
    # JSON from disk: only ints may reach the shared values (a `true` would stand for 1 there).
    return [int(v) for v in values]


def _devices_from(data: Mapping[str, Mapping[str, Sequence[int]]]) -> tuple[Device, ...]:
    return tuple(
        _device(res, dev_id, _ints(data[res][dev_id])) for res in sorted(data) for dev_id in sorted(data[res])
    )


def _memory_from(data: Sequence[Mapping[str, Any]]) -> tuple[Memory, ...]:
    if not data:
        return ()
    return _share(tuple(_memory(str(m["type"]), _ints(m["numa"]), int(m["size"])) for m in data))


def _malformed(err: Exception) -> ValueError:
    return ValueError(f"malformed inventory: {err!r}")


def pod_from_canonical(p: Mapping[str, Any]) -> Pod:
    """One pod from its canonical JSON form (`pod_json`). Raises ValueError on another shape."""
    try:
        return Pod(
            namespace=sys.intern(p["namespace"]),
            name=p["name"],
            cpu_ids=_ids(_ints(p["cpu_ids"])),
            memory=_memory_from(p["memory"]),
            containers=tuple(
                _share(
                    Container(
                        name=sys.intern(c["name"]),
                        devices=_devices_from(c["devices"]),
                        cpu_ids=_ids(_ints(c["cpu_ids"])),
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
                )
                for c in p["containers"]
            ),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise _malformed(err) from err


def pod_from_json(body: bytes) -> Pod:
    """One pod from the compact JSON `Pod.canonical_bytes` made of it (as the saved state keeps
    it), its digest taken from `body` as it is: nothing is serialised again. Were `body` not
    those exact bytes, the digest, and any inventory hash made of it, would not match the ones
    recorded when it was written. Raises ValueError on another shape."""
    pod = pod_from_canonical(json.loads(body))
    object.__setattr__(pod, "_digest", hashlib.sha256(body).digest())
    return pod


def allocatable_from_canonical(
    data: Mapping[str, Any],
) -> tuple[tuple[Device, ...], tuple[int, ...], tuple[Memory, ...], bool]:
    """The allocatable side from the canonical form without its pods (`{"format", "allocatable"}`,
    as `Inventory.allocatable_bytes`): devices, CPU ids, memory, and whether it is known."""
    if not isinstance(data, Mapping):
        raise ValueError(f"malformed inventory: expected an object, got {type(data).__name__}")
    if data.get("format") not in FORMATS_READ:
        raise ValueError(f"unsupported inventory format {data.get('format')!r}, expected {FORMAT}")
    try:
        alloc = data["allocatable"]
        return (
            _devices_from(alloc["devices"]),
            _ids(_ints(alloc["cpu_ids"])),
            _memory_from(alloc["memory"]),
            bool(alloc["known"]),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise _malformed(err) from err


def from_canonical(data: Mapping[str, Any]) -> Inventory:
    """Rebuild an Inventory from `Inventory.canonical` (e.g. loaded from the state file).

    Raises ValueError on any other format or shape.
    """
    devices, cpu_ids, memory, known = allocatable_from_canonical(data)
    try:
        pods = tuple(pod_from_canonical(p) for p in data["pods"])
    except (KeyError, TypeError) as err:
        raise _malformed(err) from err
    return Inventory(devices=devices, cpu_ids=cpu_ids, memory=memory, pods=pods, allocatable_known=known)
