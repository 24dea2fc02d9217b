"""The kubelet's raw answers -> an Inventory, rebuilding only what changed. Pure: no I/O, no asyncio, no gRPC.

The kubelet answers from Go maps, so the same node comes back in a new order on
almost every call and comparing bytes rarely helps. Building the whole model to
find out costs ~15 ms on a large node; this decoder instead parses each answer
once, in C, into the views of `proto/v1/views.proto`, whose leaves stay encoded,
and compares with the last answer, cheapest test first:

1. the same bytes: nothing to do;
2. per pod, its signature: its containers' and memory entries as sorted bytes and
   its sorted CPU ids (plus the same for the allocatable side). All equal: the same
   inventory, reordered; the last Inventory object is returned;
3. a pod whose signature differs has its containers parsed into an order-free key
   (each container's entries sorted); an equal key means only a container's own
   entries were reordered;
4. only the pods left, and the allocatable side if its signature changed, are
   built again. Everything else is carried over as it is, including each pod's
   cached canonical JSON, so hashing and diffing the result stay cheap.

Equal signatures or keys imply equal content (they hold every entry's exact bytes),
so no shortcut can hide a change. The reverse need not hold: an entry the kubelet
encodes differently each time (several ids in one entry, reordered) only costs the
slower, exact path, which still finds "no change".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from operator import attrgetter

from watcher.kubeletapi.v1 import api_pb2, views_pb2
from watcher.model.build import build, build_allocatable, build_pod
from watcher.model.inventory import Inventory
from watcher.model.records import Pod

__all__ = ["Decoder", "Outcome"]

_POD_FIELDS = attrgetter("namespace", "name", "containers", "cpu_ids", "memory")

# Sorted encoded entries (devices, memory, claims) and sorted CPU ids.
_ContainerKey = tuple[str, tuple[bytes, ...], tuple[int, ...], tuple[bytes, ...], tuple[bytes, ...]]
_PodKey = tuple[tuple[_ContainerKey, ...], tuple[int, ...], tuple[bytes, ...]]
_AllocKey = tuple[tuple[bytes, ...], tuple[int, ...], tuple[bytes, ...]]
# A pod's containers and memory entries as sorted bytes, and its sorted CPU ids.
_Signature = tuple[tuple[bytes, ...], tuple[int, ...], tuple[bytes, ...]]
_Remembered = tuple[_Signature, _PodKey, "Pod"]
_Name = tuple[str, str]  # (namespace, name)


class Outcome(enum.Enum):
    SAME_BYTES = "same_bytes"  # byte-identical answers
    REORDERED = "reordered"  # same content, another order
    CHANGED = "changed"  # something was rebuilt


@dataclass
class DecoderStats:
    same_bytes: int = 0
    reordered: int = 0
    changed: int = 0
    pods_rebuilt: int = 0
    allocatable_rebuilt: int = 0

    @property
    def parsed(self) -> int:
        """Answers that were not byte-identical to the last ones (and so were parsed)."""
        return self.reordered + self.changed


class Decoder:
    """Turns successive answers into inventories; keeps what it needs to spot the unchanged parts.

    `decode()` returns the previous Inventory object itself when nothing changed,
    so `after is before` is the cheap test for "no change". Raises protobuf's
    DecodeError on bytes that do not parse; the decoder's memory is then untouched.
    """

    def __init__(self) -> None:
        self.stats = DecoderStats()
        self._last: Inventory | None = None
        self._raw: tuple[bytes | None, bytes] | None = None
        self._alloc_key: _AllocKey | None = None
        # The keys of `_last`, or None when it was built without them (a pod listed twice).
        self._pods: dict[_Name, _Remembered] | None = None

    def forget(self) -> None:
        """Drop what was remembered: the next answer is decoded in full."""
        self._last = None
        self._raw = None
        self._alloc_key = None
        self._pods = None

    def decode(self, alloc_raw: bytes | None, list_raw: bytes) -> tuple[Inventory, Outcome]:
        """The inventory for these answers (`alloc_raw` None: List-only mode) and how it was found."""
        raw = (alloc_raw, list_raw)
        last = self._last
        if last is not None and raw == self._raw:
            self.stats.same_bytes += 1
            return last, Outcome.SAME_BYTES

        alloc_key = None
        if alloc_raw is not None:
            alloc_key = _alloc_key(views_pb2.AllocatableView.FromString(alloc_raw))
        pods = self._signatures(views_pb2.ListView.FromString(list_raw))
        if pods is None:  # the same pod listed twice: merge it the exact way, remember no keys
            inventory = build(
                api_pb2.AllocatableResourcesResponse.FromString(alloc_raw) if alloc_raw is not None else None,
                api_pb2.ListPodResourcesResponse.FromString(list_raw),
            )
            self.forget()
            return self._settle(inventory, last, raw)

        alloc_same = last is not None and last.allocatable_known == (alloc_raw is not None)
        alloc_same = alloc_same and alloc_key == self._alloc_key
        old = self._pods or {}
        if (
            last is not None
            and self._pods is not None
            and alloc_same
            and len(pods) == len(old)
            and all(name in old and old[name][0] == sig for name, (sig, _) in pods.items())
        ):
            self._raw = raw
            self.stats.reordered += 1
            return last, Outcome.REORDERED

        if alloc_same and last is not None:
            devices, cpu_ids, memory = last.devices, last.cpu_ids, last.memory
        elif alloc_raw is not None:
            devices, cpu_ids, memory = build_allocatable(
                api_pb2.AllocatableResourcesResponse.FromString(alloc_raw)
            )
            self.stats.allocatable_rebuilt += 1
        else:
            devices, cpu_ids, memory = (), (), ()
        remembered: dict[_Name, _Remembered] = {}
        for name in sorted(pods):
            sig, view = pods[name]
            cached = old.get(name)
            if cached is not None and cached[0] == sig:
                remembered[name] = cached
                continue
            # Its entries differ as bytes; parse the containers: if only their own
            # entries were reordered, the pod is the same.
            key = _pod_key(view)
            if cached is not None and cached[1] == key:
                remembered[name] = (sig, key, cached[2])
                continue
            pod = build_pod(name[0], name[1], [api_pb2.PodResources.FromString(view.SerializeToString())])
            remembered[name] = (sig, key, pod)
            self.stats.pods_rebuilt += 1
        inventory = Inventory(
            devices=devices,
            cpu_ids=cpu_ids,
            memory=memory,
            pods=tuple(pod for _, _, pod in remembered.values()),
            allocatable_known=alloc_raw is not None,
        )
        self._alloc_key, self._pods = alloc_key, remembered
        return self._settle(inventory, last, raw)

    def _settle(
        self, inventory: Inventory, last: Inventory | None, raw: tuple[bytes | None, bytes]
    ) -> tuple[Inventory, Outcome]:
        self._raw = raw
        if last is not None and inventory == last:
            # Reordered or regrouped below what the signatures see: the same content.
            # Return the old object, so the caller sees "no change" at once.
            self._last = last
            self.stats.reordered += 1
            return last, Outcome.REORDERED
        self._last = inventory
        self.stats.changed += 1
        return inventory, Outcome.CHANGED

    @staticmethod
    def _signatures(answer: views_pb2.ListView) -> dict[_Name, tuple[_Signature, views_pb2.PodView]] | None:
        """Each pod's entries as sorted bytes, or None when a pod is listed more than once."""
        # The hot loop of an unchanged cycle (once per pod): one C-level attribute fetch,
        # and no sorting of the pod-level fields, which are nearly always empty.
        fields = _POD_FIELDS
        out: dict[_Name, tuple[_Signature, views_pb2.PodView]] = {}
        for p in answer.pod_resources:
            namespace, name, containers, cpu_ids, memory = fields(p)
            out[(namespace, name)] = (
                (
                    tuple(sorted(containers)),
                    tuple(sorted(cpu_ids)) if cpu_ids else (),
                    tuple(sorted(memory)) if memory else (),
                ),
                p,
            )
        return out if len(out) == len(answer.pod_resources) else None


def _pod_key(p: views_pb2.PodView) -> _PodKey:
    containers = sorted(_container_key(views_pb2.ContainerView.FromString(c)) for c in p.containers)
    return tuple(containers), tuple(sorted(p.cpu_ids)), tuple(sorted(p.memory))


def _container_key(c: views_pb2.ContainerView) -> _ContainerKey:
    return (
        c.name,
        tuple(sorted(c.devices)),
        tuple(sorted(c.cpu_ids)),
        tuple(sorted(c.memory)),
        tuple(sorted(c.dynamic_resources)),
    )


def _alloc_key(a: views_pb2.AllocatableView) -> _AllocKey:
    return tuple(sorted(a.devices)), tuple(sorted(a.cpu_ids)), tuple(sorted(a.memory))
