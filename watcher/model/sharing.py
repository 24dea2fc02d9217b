"""Equal values built once and shared: what keeps a large node's model a fraction of its size. Pure.

A large node repeats the same small values in thousands of containers: NUMA node sets, memory
blocks (type, NUMA, size), a device seen by allocatable and by the container holding it, a
container holding nothing. Each is built once and shared (records are immutable). Both ways an
Inventory is built share through here: from the kubelet's answers (`watcher.model.build`) and
from the canonical form (`watcher.model.restore`).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

from watcher.model.records import NUMA_ID_LIMIT, NUMA_IDS_MAX, Device, Memory, NumaNodes

__all__ = ["shared", "shared_numa", "shared_ids", "shared_device", "shared_memory"]

H = TypeVar("H", bound=Hashable)

# Bounded: emptied when full, so values of pods long gone are not kept for ever (what was
# shared stays shared; later values are shared from then on).
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 16_384


def shared(value: H) -> H:
    """The one copy of `value` kept, or `value` itself, kept from now on."""
    got = _SHARED.get(value)
    if got is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        _SHARED[value] = got = value
    return got


_VALID_NUMA = range(NUMA_ID_LIMIT)


def shared_numa(nodes: Iterable[int]) -> NumaNodes:
    """The NUMA set of `nodes`, bounded (see NUMA_IDS_MAX): the ids filtered before they are
    collected, in C, so the set never holds more than NUMA_ID_LIMIT of them whatever was listed."""
    return shared(tuple(sorted(set(filter(_VALID_NUMA.__contains__, nodes)))[:NUMA_IDS_MAX]))


def shared_ids(ids: Iterable[int]) -> tuple[int, ...]:
    # CPU ids above 256 are an object each; the same few hundred are shared instead.
    return tuple(shared(i) for i in sorted(ids))


def shared_device(resource: str, dev_id: str, numa: Iterable[int]) -> Device:
    return shared(Device(sys.intern(resource), dev_id, shared_numa(numa)))


def shared_memory(mtype: str, numa: Iterable[int], size: int) -> Memory:
    return shared(Memory(sys.intern(mtype), shared_numa(numa), size))
