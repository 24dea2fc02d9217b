"""Building an Inventory from the kubelet's two responses. Pure.

The kubelet answers from Go maps in no particular order and reports one device
entry per device per NUMA node, so `build()` merges and sorts everything; two
responses that differ only in order or in how entries are split give equal
inventories and the same `content_hash`. The decoder (`watcher.kubelet.decoding`)
calls `build_allocatable` and `build_pod` directly to rebuild only what changed.
Reading the canonical form back is `watcher.model.restore`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Protocol

from watcher.model.inventory import Inventory
from watcher.model.records import NUMA_ID_LIMIT, Claim, ClaimDevice, Container, Device, Memory, NumaNodes, Pod
from watcher.model.sharing import shared, shared_device, shared_ids, shared_memory, shared_numa

__all__ = [
    "AllocatableResponse",
    "ListResponse",
    "build",
    "build_allocatable",
    "build_pod",
]

_VALID_NUMA = range(NUMA_ID_LIMIT)
_node_ids = attrgetter("ID")


def _topology(nodes: Sequence[_NUMANode]) -> NumaNodes:
    # One valid NUMA node is by far the common case: skip the filter and the sort.
    if len(nodes) == 1 and (only := nodes[0].ID) in _VALID_NUMA:
        return shared((only,))
    return shared_numa(map(_node_ids, nodes))


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


class _Holding(Protocol):
    """What a pod, a container and the node's allocatable all carry: CPU ids and memory."""

    @property
    def cpu_ids(self) -> Sequence[int]: ...
    @property
    def memory(self) -> Sequence[_Memory]: ...


class _Container(_Holding, Protocol):
    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> Sequence[_Devices]: ...
    @property
    def dynamic_resources(self) -> Sequence[_DynamicResource]: ...


class _Pod(_Holding, Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def containers(self) -> Sequence[_Container]: ...


class AllocatableResponse(_Holding, Protocol):
    @property
    def devices(self) -> Sequence[_Devices]: ...


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
                into[(res, dev_id)] = shared_numa((*numa, *nodes))


def _merge_memory(entries: Sequence[_Memory], into: dict[tuple[str, NumaNodes], int]) -> None:
    for m in entries:
        key = (m.memory_type, _topology(m.topology.nodes))
        into[key] = into.get(key, 0) + m.size


def _freeze_devices(merged: Mapping[tuple[str, str], NumaNodes]) -> tuple[Device, ...]:
    if not merged:
        return ()
    return tuple(shared_device(res, dev_id, merged[(res, dev_id)]) for res, dev_id in sorted(merged))


def _freeze_memory(merged: Mapping[tuple[str, NumaNodes], int]) -> tuple[Memory, ...]:
    if not merged:
        return ()
    return shared(tuple(shared_memory(t, numa, merged[(t, numa)]) for t, numa in sorted(merged)))


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
    return _freeze_devices(devices), shared_ids(set(allocatable.cpu_ids)), _freeze_memory(memory)


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
            shared(
                Container(
                    name=sys.intern(cname),
                    devices=_freeze_devices(c.devices),
                    cpu_ids=shared_ids(c.cpu_ids),
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
        cpu_ids=shared_ids(acc.cpu_ids),
        memory=_freeze_memory(acc.memory),
    )


def _claim_device_key(d: ClaimDevice) -> tuple[str, str, str, tuple[str, ...], bool, str]:
    # Unset share_id sorts first and never ties with any real value.
    return (d.driver, d.pool, d.device, d.cdi_devices, d.share_id is not None, d.share_id or "")
