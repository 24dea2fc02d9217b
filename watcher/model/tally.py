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

from watcher.model.records import NumaNodes, Pod

__all__ = ["Tally", "Holders", "DeviceKey", "MemoryKey", "pod_memory"]

DeviceKey = tuple[str, str]  # (resource, device id)
MemoryKey = tuple[str, NumaNodes]  # (memory type, NUMA nodes)
# (resource, device id) -> ("ns/pod/container", ...) sorted, and the NUMA nodes pods saw.
Holders = Mapping[DeviceKey, tuple[tuple[str, ...], NumaNodes]]
# (resource, device id) -> "ns/pod/container" -> the NUMA nodes that container saw.
_PerHolder = dict[DeviceKey, dict[str, NumaNodes]]


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


@dataclass(frozen=True)
class Tally:
    """Everything the pods hold, summed. Values are never mutated once the tally is made."""

    holders: Holders
    cpus: Mapping[int, int]  # CPU id -> how many pods hold it (more than one: the kubelet's bug)
    # Memory block -> (bytes allocated, how many pods hold some): a block held at 0 bytes is still
    # a held block, as the recount over every pod has it.
    memory_held: Mapping[MemoryKey, tuple[int, int]]
    _per_holder: Mapping[DeviceKey, Mapping[str, NumaNodes]]

    @property
    def memory(self) -> dict[MemoryKey, int]:
        """Bytes allocated per memory block."""
        return {key: size for key, (size, _) in self.memory_held.items()}

    @classmethod
    def of(cls, pods: Iterable[Pod]) -> Tally:
        per: _PerHolder = {}
        cpus: dict[int, int] = {}
        memory: dict[MemoryKey, tuple[int, int]] = {}
        for pod in pods:
            cls._add(pod, per, cpus, memory, sign=1)
        return cls({k: _entry(v) for k, v in per.items()}, cpus, memory, per)

    @staticmethod
    def _add(
        pod: Pod,
        per: _PerHolder,
        cpus: dict[int, int],
        memory: dict[MemoryKey, tuple[int, int]],
        *,
        sign: int,
    ) -> None:
        for device, who, numa in _held(pod):
            if sign > 0:
                per.setdefault(device, {})[who] = numa
            else:
                named = per.get(device)
                if named is not None:
                    named.pop(who, None)
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

    def moved(self, gone: Iterable[Pod], came: Iterable[Pod]) -> Tally:
        """This tally with `gone` pods' holdings taken out and `came` pods' put in. Only the
        devices those pods touch are copied deeply; the rest is shared with this tally."""
        gone, came = list(gone), list(came)
        touched = {key for pod in (*gone, *came) for key, _, _ in _held(pod)}
        per: _PerHolder = dict(self._per_holder)  # type: ignore[arg-type]  # inner dicts replaced below
        for key in touched:
            per[key] = dict(self._per_holder.get(key, {}))
        cpus, memory = dict(self.cpus), dict(self.memory_held)
        for pod in gone:
            self._add(pod, per, cpus, memory, sign=-1)
        for pod in came:
            self._add(pod, per, cpus, memory, sign=1)
        holders = dict(self.holders)
        for key in touched:
            if per[key]:
                holders[key] = _entry(per[key])
            else:
                del per[key]
                holders.pop(key, None)
        return Tally(holders, cpus, memory, per)
