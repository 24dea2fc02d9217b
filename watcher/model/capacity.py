"""What a node has, holds and has free: the capacity records and the figures behind them. Pure.

The figures are computed from an inventory's parts (its devices indexed by
resource, who holds which device, its pods, CPUs and memory) so that
`Inventory` can cache each one as a property.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from watcher.model.records import Memory, NumaNodes
from watcher.model.tally import Holders

__all__ = [
    "NUMA_FIGURES_MAX",
    "DevicesByResource",
    "Holders",
    "NumaCapacity",
    "ResourceCapacity",
    "CpuCapacity",
    "MemoryCapacity",
    "MissingDevice",
    "count_devices",
    "count_cpus",
    "count_memory",
    "find_missing",
]

# The most per-NUMA device figures of one node, over all its resources: the first ones in the order
# of resources then NUMA nodes are kept, the totals stay exact. A real node has a few resources on a
# few NUMA nodes; plugins that give every device other NUMA ids must not make this as large as the
# answer (each figure costs the model, the capacity events and the metrics far more than its id).
NUMA_FIGURES_MAX = 4096

# resource -> device id -> NUMA nodes, as allocatable lists them.
DevicesByResource = Mapping[str, Mapping[str, NumaNodes]]


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


def find_missing(by_res: DevicesByResource, holders: Holders, known: bool) -> tuple[MissingDevice, ...]:
    """The held devices absent from allocatable; none when the allocatable side is unknown."""
    if not known:
        return ()
    return tuple(
        MissingDevice(res, dev_id, numa, names)
        for (res, dev_id), (names, numa) in sorted(holders.items())
        if dev_id not in by_res.get(res, {})
    )


def count_devices(by_res: DevicesByResource, holders: Holders, known: bool) -> tuple[ResourceCapacity, ...]:
    """Device counts per resource, and per NUMA node within each."""
    held_by_res: dict[str, dict[str, NumaNodes]] = defaultdict(dict)
    for (res, dev_id), (_, numa) in holders.items():
        held_by_res[res][dev_id] = numa
    out = []
    budget = NUMA_FIGURES_MAX
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
        nodes = sorted(set(n_alloc) | set(n_held), key=_numa_sort_key)[:budget]
        budget -= len(nodes)
        per_numa = tuple(
            NumaCapacity(
                node,
                n_alloc[node] if known else None,
                n_held[node],
                n_free[node] if known else None,
            )
            for node in nodes
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


def count_cpus(cpu_ids: tuple[int, ...], held: Mapping[int, int], known: bool) -> CpuCapacity:
    """Allocatable, allocated (pod- or container-level; `held`: CPU id -> holders) and free CPUs."""
    allocated = tuple(sorted(held))
    if not known:
        return CpuCapacity(None, len(allocated), None, allocated)
    free = len(set(cpu_ids) - set(held))
    return CpuCapacity(len(cpu_ids), len(allocated), free, allocated)


def count_memory(
    memory: Iterable[Memory], allocated: Mapping[tuple[str, NumaNodes], int], known: bool
) -> tuple[MemoryCapacity, ...]:
    """Bytes per memory type and set of NUMA nodes (`allocated`: what the pods hold of each)."""
    alloc = {(m.type, m.numa): m.size for m in memory}
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


def _numa_sort_key(node: int | None) -> tuple[int, int]:
    return (1, 0) if node is None else (0, node)
