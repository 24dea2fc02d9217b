"""The node's inventory: an immutable, normalized snapshot of the two kubelet responses.

Pure: no I/O, no asyncio, no gRPC. Built by `watcher.model.build`, which merges
and sorts everything, so two responses that differ only in order or in how
entries are split give equal inventories and the same `content_hash`.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from watcher.model.capacity import (
    CpuCapacity,
    DevicesByResource,
    MemoryCapacity,
    MissingDevice,
    ResourceCapacity,
    count_cpus,
    count_devices,
    count_memory,
    find_missing,
)
from watcher.model.records import (
    Device,
    Memory,
    NumaNodes,
    Pod,
    compact_json,
    devices_json,
    memory_json,
    pod_json,
)
from watcher.model.tally import Holders, Tally

__all__ = ["FORMAT", "Inventory", "changed_pods"]

# Bumped whenever the canonical form or how its hash is made changes, so old hashes never match
# new ones. 3: the hash is made over each pod's own hash (see `content_hash`); the form is 2's.
FORMAT = 3


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
            "pods": [pod_json(p) for p in self.pods],
        }

    def _allocatable_json(self) -> dict[str, Any]:
        return {
            "known": self.allocatable_known,
            "devices": devices_json(self.devices),
            "cpu_ids": list(self.cpu_ids),
            "memory": [memory_json(m) for m in self.memory],
        }

    @property
    def canonical_bytes(self) -> bytes:
        """`canonical` as compact JSON: exactly `compact_json(self.canonical)`. Made afresh on every
        access, not kept: it is several times the answers' size (who needs it keeps it)."""
        pods = b",".join(p.canonical_bytes for p in self.pods)
        return self.allocatable_bytes[:-1] + b',"pods":[' + pods + b"]}"

    @property
    def allocatable_bytes(self) -> bytes:
        """The canonical form without its pods (`{"format", "allocatable"}`), compact JSON."""
        return compact_json({"format": FORMAT, "allocatable": self._allocatable_json()})

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 over the hash of `allocatable_bytes` and each pod's `digest`, in order: it
        stands for `canonical_bytes` as a whole, but an inventory that shares most of its pods
        with the last one hashes only the pods that changed, and no copy of the whole is kept."""
        return "sha256:" + hashlib.sha256(self._allocatable_digest + self._pod_digests).hexdigest()

    @cached_property
    def _allocatable_digest(self) -> bytes:
        return hashlib.sha256(self.allocatable_bytes).digest()

    @cached_property
    def _pod_digests(self) -> bytes:
        """Each pod's digest, in order, joined: spliced, not rebuilt, by `with_pods`."""
        return b"".join(p.digest for p in self.pods)

    # -- derived views --

    @cached_property
    def devices_by_resource(self) -> DevicesByResource:
        out: dict[str, dict[str, NumaNodes]] = {}
        for d in self.devices:
            out.setdefault(d.resource, {})[d.id] = d.numa
        return out

    @cached_property
    def tally(self) -> Tally:
        """What the pods hold, summed (see watcher.model.tally); carried over by `carry_tally`."""
        return Tally.of(self.pods)

    @property
    def holders(self) -> Holders:
        """(resource, device id) -> ("ns/pod/container", ...) and the NUMA nodes pods saw."""
        return self.tally.holders

    def carry_tally(self, before: Inventory) -> None:
        """Take `before`'s tally with only the pods that differ moved, when `before` has one made
        and this inventory has none yet: one pod's change then costs that pod, not every pod.
        Cached values only; the inventory itself stays as it is."""
        if "tally" in self.__dict__ or "tally" not in before.__dict__ or before is self:
            return
        gone, came = changed_pods(before, self)
        if len(gone) + len(came) > max(16, len(self.pods) // 4):
            return  # most of the node changed: a recount costs no more
        self.__dict__["tally"] = before.tally.moved(gone, came)

    @cached_property
    def missing_devices(self) -> tuple[MissingDevice, ...]:
        return find_missing(self.devices_by_resource, self.holders, self.allocatable_known)

    @cached_property
    def capacity(self) -> tuple[ResourceCapacity, ...]:
        return count_devices(self.devices_by_resource, self.holders, self.allocatable_known)

    @cached_property
    def cpus(self) -> CpuCapacity:
        return count_cpus(self.cpu_ids, self.tally.cpus, self.allocatable_known)

    @cached_property
    def memory_capacity(self) -> tuple[MemoryCapacity, ...]:
        return count_memory(self.memory, self.tally.memory, self.allocatable_known)

    def with_pods(self, replaced: Mapping[tuple[str, str], Pod | None]) -> Inventory:
        """This inventory with the pods named (namespace, name) replaced, added, or (None) taken
        out; `self` when nothing differs. What this inventory has worked out is carried over with
        only those pods moved (its tally, the pods' digests for the hash, the allocatable side's
        hash), and the new inventory remembers which pods differ from this one (`changed_pods`
        reads that instead of walking every pod): one pod's change costs that pod."""
        pods = list(self.pods)
        digests = bytearray(self._pod_digests) if "_pod_digests" in self.__dict__ else None
        gone: list[Pod] = []
        came: list[Pod] = []
        for key in sorted(replaced):
            pod = replaced[key]
            assert pod is None or _pod_name(pod) == key, "a pod filed under another name"
            i = bisect.bisect_left(pods, key, key=_pod_name)
            old = pods[i] if i < len(pods) and _pod_name(pods[i]) == key else None
            if old == pod:
                continue
            at = slice(32 * i, 32 * i + (32 if old is not None else 0))
            if old is not None:
                gone.append(old)
            if pod is None:
                del pods[i]
            elif old is None:
                pods.insert(i, pod)
            else:
                pods[i] = pod
            if pod is not None:
                came.append(pod)
            if digests is not None:
                digests[at] = pod.digest if pod is not None else b""
        if not gone and not came:
            return self
        after = dataclasses.replace(self, pods=tuple(pods))
        known = after.__dict__
        known["_moved"] = (weakref.ref(self), tuple(gone), tuple(came))
        if digests is not None:
            known["_pod_digests"] = bytes(digests)
        if "_allocatable_digest" in self.__dict__:
            known["_allocatable_digest"] = self._allocatable_digest
        if "tally" in self.__dict__:
            known["tally"] = self.tally.moved(gone, came)
        return after

    def pod(self, namespace: str, name: str) -> Pod | None:
        """The pod of that name (pods are sorted by namespace and name: a binary search)."""
        i = bisect.bisect_left(self.pods, (namespace, name), key=_pod_name)
        if i < len(self.pods) and _pod_name(pod := self.pods[i]) == (namespace, name):
            return pod
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


def _pod_name(pod: Pod) -> tuple[str, str]:
    return pod.namespace, pod.name


def changed_pods(before: Inventory, after: Inventory) -> tuple[list[Pod], list[Pod]]:
    """The pods of `before` that `after` does not hold as they are (changed or gone), and the pods
    of `after` that `before` does not (changed or new), each in order.

    One walk of the two sorted tuples, nothing built per pod: a pod carried over from one
    inventory to the next is the same object and costs an `is`; only the few that differ cost more.
    """
    moved = after.__dict__.get("_moved")
    if moved is not None and moved[0]() is before:  # made from `before` by with_pods: it knows
        return sorted(moved[1], key=_pod_name), sorted(moved[2], key=_pod_name)
    old, new = before.pods, after.pods
    gone: list[Pod] = []
    came: list[Pod] = []
    i = j = 0
    while i < len(old) and j < len(new):
        a, b = old[i], new[j]
        if a is b:
            i, j = i + 1, j + 1
            continue
        ka, kb = (a.namespace, a.name), (b.namespace, b.name)
        if ka == kb:
            if a != b:
                gone.append(a)
                came.append(b)
            i, j = i + 1, j + 1
        elif ka < kb:
            gone.append(a)
            i += 1
        else:
            came.append(b)
            j += 1
    gone.extend(old[i:])
    came.extend(new[j:])
    return gone, came
