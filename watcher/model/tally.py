"""What the pods hold, summed over the node: who holds each device, how many holders each CPU has,
and the bytes allocated of each memory block. Pure.

An inventory's capacity figures are read off its tally. The tally is made once over every pod;
after that, an inventory that shares most of its pods with the one before carries the earlier
tally over with only the changed pods' holdings taken out and put in (`moved`), so a change to one
pod costs that pod, not a recount of the node's 10,000.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from watcher.model.records import NumaNodes, Pod

__all__ = ["Tally", "Holders", "ClaimKey", "DeviceKey", "MemoryKey", "pod_memory"]

DeviceKey = tuple[str, str]  # (resource, device id)
ClaimKey = tuple[str, str, str]  # a DRA device: (driver, pool, device)
MemoryKey = tuple[str, NumaNodes]  # (memory type, NUMA nodes)
# (resource, device id) -> ("ns/pod/container", ...) sorted, and the NUMA nodes pods saw.
Holders = Mapping[DeviceKey, tuple[tuple[str, ...], NumaNodes]]
K = TypeVar("K", bound=tuple[str, ...])


def pod_memory(pod: Pod) -> dict[MemoryKey, int]:
    """The bytes `pod` holds per memory block: its containers' sum, or its pod-level value where
    that is larger (pod-level values overlap the containers', newest kubelets)."""
    per_pod: dict[MemoryKey, int] = {}
    for c in pod.containers:
        for m in c.memory:
            key = (m.type, m.numa)
            per_pod[key] = per_pod.get(key, 0) + m.size
    for m in pod.memory:
        key = (m.type, m.numa)
        per_pod[key] = max(per_pod.get(key, 0), m.size)
    return per_pod


def _held(pod: Pod) -> Iterable[tuple[DeviceKey, str, NumaNodes]]:
    for c in pod.containers:
        if c.devices:
            who = f"{pod.namespace}/{pod.name}/{c.name}"
            for d in c.devices:
                yield (d.resource, d.id), who, d.numa


def _claimed(pod: Pod) -> Iterable[tuple[ClaimKey, str, NumaNodes]]:
    for c in pod.containers:
        if c.claims:
            who = f"{pod.namespace}/{pod.name}/{c.name}"
            for claim in c.claims:
                for d in claim.devices:
                    yield (d.driver, d.pool, d.device), who, ()


def _cpu_ids(pod: Pod) -> set[int]:
    ids = set(pod.cpu_ids)
    for c in pod.containers:
        ids.update(c.cpu_ids)
    return ids


def _entry(per: Mapping[str, NumaNodes]) -> tuple[tuple[str, ...], NumaNodes]:
    numa: set[int] = set()
    for n in per.values():
        numa.update(n)
    return tuple(sorted(per)), tuple(sorted(numa))


class _Held(Generic[K]):
    """Who holds each thing (a device, a DRA device): key -> holder -> the NUMA nodes it saw, and
    the summary per key that readers use. Built in place, then frozen into the tally."""

    def __init__(
        self, per: Mapping[K, Mapping[str, NumaNodes]], entries: Mapping[K, tuple[tuple[str, ...], NumaNodes]]
    ):
        self.per: dict[K, dict[str, NumaNodes]] = dict(per)  # type: ignore[arg-type]  # replaced when touched
        self.entries = dict(entries)
        self.touched: set[K] = set()

    def add(self, key: K, who: str, numa: NumaNodes, sign: int) -> None:
        if key not in self.touched:
            self.touched.add(key)
            self.per[key] = dict(self.per.get(key, {}))  # copied before it is changed: shared otherwise
        if sign > 0:
            self.per[key][who] = numa
        else:
            self.per[key].pop(who, None)

    def frozen(
        self,
    ) -> tuple[Mapping[K, Mapping[str, NumaNodes]], Mapping[K, tuple[tuple[str, ...], NumaNodes]]]:
        for key in self.touched:
            if self.per[key]:
                self.entries[key] = _entry(self.per[key])
            else:
                del self.per[key]
                self.entries.pop(key, None)
        return self.per, self.entries


@dataclass(frozen=True)
class Tally:
    """Everything the pods hold, summed. Values are never mutated once the tally is made."""

    holders: Holders
    cpus: Mapping[int, int]  # CPU id -> how many pods hold it (more than one: the kubelet's bug)
    # Memory block -> (bytes allocated, how many pods hold some): a block held at 0 bytes is still
    # a held block, as the recount over every pod has it.
    memory_held: Mapping[MemoryKey, tuple[int, int]]
    # A DRA device -> ("ns/pod/container", ...) holding it through any claim, sorted (and no NUMA).
    claim_holders: Mapping[ClaimKey, tuple[tuple[str, ...], NumaNodes]]
    _per_holder: Mapping[DeviceKey, Mapping[str, NumaNodes]]
    _per_claim_holder: Mapping[ClaimKey, Mapping[str, NumaNodes]]

    @property
    def memory(self) -> dict[MemoryKey, int]:
        """Bytes allocated per memory block."""
        return {key: size for key, (size, _) in self.memory_held.items()}

    @classmethod
    def of(cls, pods: Iterable[Pod]) -> Tally:
        return cls({}, {}, {}, {}, {}, {}).moved((), pods)

    def moved(self, gone: Iterable[Pod], came: Iterable[Pod]) -> Tally:
        """This tally with `gone` pods' holdings taken out and `came` pods' put in. Only what
        those pods touch is copied deeply; the rest is shared with this tally."""
        devices = _Held(self._per_holder, self.holders)
        claims = _Held(self._per_claim_holder, self.claim_holders)
        cpus, memory = dict(self.cpus), dict(self.memory_held)
        for sign, pods in ((-1, gone), (1, came)):
            for pod in pods:
                for key, who, numa in _held(pod):
                    devices.add(key, who, numa, sign)
                for dra, who, numa in _claimed(pod):
                    claims.add(dra, who, numa, sign)
                _count(pod, cpus, memory, sign)
        per, holders = devices.frozen()
        per_claim, claim_holders = claims.frozen()
        return Tally(holders, cpus, memory, claim_holders, per, per_claim)


def _count(pod: Pod, cpus: dict[int, int], memory: dict[MemoryKey, tuple[int, int]], sign: int) -> None:
    if pod.cpu_ids or any(c.cpu_ids for c in pod.containers):
        for cpu in _cpu_ids(pod):
            left = cpus.get(cpu, 0) + sign
            if left > 0:
                cpus[cpu] = left
            else:
                cpus.pop(cpu, None)
    if pod.memory or any(c.memory for c in pod.containers):
        for key, size in pod_memory(pod).items():
            total, holders = memory.get(key, (0, 0))
            if holders + sign > 0:
                memory[key] = (total + sign * size, holders + sign)
            else:
                memory.pop(key, None)
