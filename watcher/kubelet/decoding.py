"""The kubelet's raw answers -> an Inventory, rebuilding only what changed. Pure: no I/O, no asyncio, no gRPC.

The kubelet answers from Go maps, so the same node comes back in a new order on
almost every call and comparing bytes rarely helps. Building the whole model to
find out costs ~15 ms on a large node; this decoder instead parses each answer
once, in C, into the views of `proto/v1/views.proto`, whose leaves stay encoded
(the List answer split into its pods' encodings, each pod parsed as a view in its
turn), and compares with the last answer, cheapest test first:

1. the same bytes: nothing to do;
2. per pod, in one pass over the answer: its bytes the bytes of a pod of the last
   answer (a digest looked up; the kubelet lists containers in spec order, so a
   pod's bytes often repeat): that pod, unparsed;
3. else its signature: its containers' and memory entries as sorted bytes and its
   sorted CPU ids, against the remembered pod of its name (plus the same for the
   allocatable side). Every pod found so: the same inventory, reordered; the last
   Inventory object is returned;
4. a pod whose signature differs has its containers parsed into an order-free key
   (each container's entries sorted); an equal key means only a container's own
   entries were reordered;
5. only the pods left, and the allocatable side if its signature changed, are
   built again. With the allocatable side the same, the last inventory is carried
   over with only those pods moved (`Inventory.with_pods`: its order, its pods'
   hashes and its tally kept), so a changed cycle costs the pass and the changed
   pods, not a second walk of every pod.

Signatures, keys and each pod's bytes are remembered as digests (SHA-256 over their exact
bytes, cut to 16 bytes), never as the bytes themselves: what the decoder keeps between answers
is some hundred bytes per pod, not a copy of the answer, and nothing refers to the answers, their
parsed views or their bytes once `decode()` returns. Equal digests imply equal content
(they cover every entry's exact bytes), so no shortcut can hide a change. The reverse
need not hold: an entry the kubelet encodes differently each time (several ids in one
entry, reordered) only costs the slower, exact path, which still finds "no change".
"""

from __future__ import annotations

import enum
import hashlib
import marshal
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from watcher.kubeletapi.v1 import api_pb2, views_pb2
from watcher.model.build import build, build_allocatable, build_pod
from watcher.model.inventory import Inventory
from watcher.model.records import Pod

__all__ = ["Decoder", "Outcome"]

_POD_FIELDS = attrgetter("namespace", "name", "containers", "cpu_ids", "memory")
_CONTAINER_FIELDS = attrgetter("name", "devices", "cpu_ids", "memory", "dynamic_resources")

# The digest of a signature or key (see `_digest`): 16 bytes.
_Digest = bytes
# What is remembered of a pod: its signature digest then its key digest, in one object, and the
# pod they were taken of.
_Remembered = tuple[bytes, Pod]
# namespace -> name -> what is remembered. Nested, so that the keys are the pods' own strings
# and no (namespace, name) tuple is kept, or made to look one up, per pod.
_Memo = dict[str, dict[str, _Remembered]]
_Name = tuple[str, str]  # (namespace, name)
_NONE: dict[str, _Remembered] = {}
_sha256, _dumps = hashlib.sha256, marshal.dumps


def _digest(value: tuple[Any, ...]) -> _Digest:
    """16 bytes of SHA-256 over `value` (nested tuples and lists of bytes and ints): equal digests,
    equal values.

    marshal's version 2 writes no back-references, so equal values give equal bytes whatever
    objects hold them; its output is used within this process only.
    """
    return _sha256(_dumps(value, 2)).digest()[:16]


def _answers_digest(alloc_raw: bytes | None, list_raw: bytes) -> _Digest:
    h = hashlib.sha256(b"-" if alloc_raw is None else b"+%d:" % len(alloc_raw))
    h.update(alloc_raw or b"")
    h.update(list_raw)
    return h.digest()


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
    pods_parsed: int = 0  # pods whose bytes were not a remembered pod's (the rest were not parsed)

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
        self._raw: _Digest | None = None  # of the last answers' bytes
        self._alloc_key: _Digest | None = None
        # The digests of `_last`'s pods, or None when it was built without them (a pod listed twice).
        self._pods: _Memo | None = None
        # The digest of each of the last answer's pods' bytes -> what is remembered of that pod.
        self._by_raw: dict[_Digest, _Remembered] = {}

    def forget(self) -> None:
        """Drop what was remembered: the next answer is decoded in full."""
        self._last = None
        self._raw = None
        self._alloc_key = None
        self._pods = None
        self._by_raw = {}

    def seed(self, inventory: Inventory) -> None:
        """Start from `inventory` (the saved state, after a restart) when nothing was decoded yet.

        Nothing of its answers is known, so every pod of the next answer is built; each one
        equal to the seed's pod of its name is then that pod object, one pod at a time, instead
        of a second model as large as the first living beside it until the two are compared."""
        if self._last is not None:
            return
        memo: _Memo = {}
        for pod in inventory.pods:
            memo.setdefault(pod.namespace, {})[pod.name] = (b"", pod)  # no digest matches b""
        self._last, self._pods, self._alloc_key, self._raw = inventory, memo, None, None

    def adopt(self, inventory: Inventory) -> None:
        """Take `inventory`, equal to the last one decoded (its content hash the same), as the last
        one: the caller keeps it (a restored state, an older commit), and two equal copies of a
        large node's model would live on otherwise, one here and one there."""
        last = self._last
        if last is None or inventory is last or inventory.content_hash != last.content_hash:
            return
        if self._pods is not None:
            taken: dict[int, _Remembered] = {}  # the old remembered pod's id -> the new one
            for pod in inventory.pods:  # equal inventories hold pods of the same names
                by_name = self._pods[pod.namespace]
                old = by_name[pod.name]
                by_name[pod.name] = taken[id(old)] = (old[0], pod)
            self._by_raw = {raw: taken.get(id(r), r) for raw, r in self._by_raw.items()}
        self._last = inventory

    def decode(self, alloc_raw: bytes | None, list_raw: bytes) -> tuple[Inventory, Outcome]:
        """The inventory for these answers (`alloc_raw` None: List-only mode) and how it was found."""
        raw = _answers_digest(alloc_raw, list_raw)
        last = self._last
        if last is not None and raw == self._raw:
            self.stats.same_bytes += 1
            return last, Outcome.SAME_BYTES

        alloc_key = None
        if alloc_raw is not None:
            alloc_key = _alloc_key(views_pb2.AllocatableView.FromString(alloc_raw))
        alloc_same = last is not None and last.allocatable_known == (alloc_raw is not None)
        alloc_same = alloc_same and alloc_key == self._alloc_key
        # Built before anything of this answer is remembered: a DecodeError here (a device id that
        # is not UTF-8) must leave the decoder as it was. Raised once the pods' bytes were
        # remembered, it made the repaired answer's new and changed pods look already seen (never
        # reported while the bad id stayed), and pods whose memory the refused walk renewed look gone.
        allocatable = None
        if alloc_raw is not None and not alloc_same:
            allocatable = build_allocatable(api_pb2.AllocatableResourcesResponse.FromString(alloc_raw))
        # Split into its pods' encodings only; each pod is parsed as a view in its turn and its
        # view goes with it: the answer parsed whole would be twice its size again.
        walk = self._walk(views_pb2.ListChunks.FromString(list_raw).pod_resources)
        if walk.duplicate:  # the same pod listed twice: merge it the exact way, remember no keys
            inventory = build(
                api_pb2.AllocatableResourcesResponse.FromString(alloc_raw) if alloc_raw is not None else None,
                api_pb2.ListPodResourcesResponse.FromString(list_raw),
            )
            self.forget()
            return self._settle(inventory, last, raw)
        if not walk.all_raw or len(walk.raws) != len(self._by_raw):
            # Remember this answer's pods' bytes, and only theirs: every entry taken by its bytes
            # and as many entries as there were (none listed twice) is the same set, but a pod
            # left remembered after it went would be taken as held still when it came back.
            self._by_raw = dict(zip(walk.raws, walk.chosen, strict=True))
        memo = self._pods
        if alloc_same and last is not None and memo is not None:
            if not walk.updated and len(walk.consumed) == len(last.pods):
                self._raw = raw
                self.stats.reordered += 1
                return last, Outcome.REORDERED
            return self._settle(_moved(last, memo, walk), last, raw)
        chosen = sorted(walk.chosen, key=_by_name)
        del walk  # nothing of the parsed answer is left past here
        if alloc_same and last is not None:
            devices, cpu_ids, memory = last.devices, last.cpu_ids, last.memory
        elif allocatable is not None:
            devices, cpu_ids, memory = allocatable
            self.stats.allocatable_rebuilt += 1
        else:
            devices, cpu_ids, memory = (), (), ()
        fresh: _Memo = {}
        for remembered in chosen:
            pod = remembered[1]
            by_name = fresh.get(pod.namespace)
            if by_name is None:
                fresh[pod.namespace] = by_name = {}
            by_name[pod.name] = remembered
        inventory = Inventory(
            devices=devices,
            cpu_ids=cpu_ids,
            memory=memory,
            pods=tuple(pod for _, pod in chosen),
            allocatable_known=alloc_raw is not None,
        )
        self._alloc_key, self._pods = alloc_key, fresh
        return self._settle(inventory, last, raw)

    def _settle(
        self, inventory: Inventory, last: Inventory | None, raw: _Digest
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

    def _walk(self, entries: Iterable[bytes]) -> _Walk:
        """One pass over the answer's pods, cheapest test first: a pod whose bytes are a remembered
        pod's bytes is that pod, unparsed; else its view's signature, then its key, against the
        remembered pod of its name; else it is built anew."""
        old, by_raw, sha = self._pods or {}, self._by_raw, _sha256
        walk = _Walk()
        chosen, raws, consumed, updated = walk.chosen, walk.raws, walk.consumed, walk.updated
        new_names: set[_Name] = set()
        for encoded in entries:
            raw = sha(encoded).digest()[:16]
            raws.append(raw)
            cached = by_raw.get(raw)
            if cached is not None:
                remembered = cached
            else:
                walk.all_raw = False
                remembered, cached = self._parsed(encoded, old)
                if remembered is not cached:
                    updated.append(remembered)
            chosen.append(remembered)
            # Each entry takes the remembered pod of its name, or a name none had: one taken twice
            # is a pod listed twice.
            if cached is None:
                name = _by_name(remembered)
                walk.duplicate = walk.duplicate or name in new_names
                new_names.add(name)
            elif id(cached) in consumed:
                walk.duplicate = True
            else:
                consumed.add(id(cached))
        return walk

    def _parsed(self, encoded: bytes, old: _Memo) -> tuple[_Remembered, _Remembered | None]:
        """What to remember of a pod whose bytes are new, and the remembered pod of its name."""
        view = views_pb2.PodView.FromString(encoded)
        self.stats.pods_parsed += 1
        namespace, name, containers, cpu_ids, memory = _POD_FIELDS(view)
        sig = _signature(containers, cpu_ids, memory)
        cached = old.get(namespace, _NONE).get(name)
        if cached is not None and cached[0].startswith(sig):
            return cached, cached
        # Its entries differ as bytes; parse the containers: if only their own entries were
        # reordered, the pod is the same.
        key = _pod_key(view)
        if cached is not None and cached[0].endswith(key):
            return (sig + key, cached[1]), cached
        pod = build_pod(namespace, name, [api_pb2.PodResources.FromString(encoded)])
        self.stats.pods_rebuilt += 1
        if cached is not None and cached[1] == pod:
            pod = cached[1]  # the same pod, regrouped: keep the object (and its hash)
        return (sig + key, pod), cached


@dataclass
class _Walk:
    """What one pass over an answer's pods found (see `Decoder._walk`), in the answer's order."""

    chosen: list[_Remembered] = field(default_factory=list)  # what to remember of each entry's pod
    raws: list[_Digest] = field(default_factory=list)  # each entry's bytes, digested
    consumed: set[int] = field(default_factory=set)  # the remembered pods the entries are (their ids)
    updated: list[_Remembered] = field(default_factory=list)  # entries not a remembered pod as it was
    all_raw: bool = True  # every entry's bytes were a remembered pod's
    duplicate: bool = False  # some pod is listed more than once


def _moved(last: Inventory, memo: _Memo, walk: _Walk) -> Inventory:
    """`last` with only the pods `walk` found different moved (its order, its pods' digests and its
    tally carried over as they are: `Inventory.with_pods`); `memo`, what is remembered of `last`'s
    pods, updated to match."""
    replaced: dict[_Name, Pod | None] = {}
    if len(walk.consumed) < len(last.pods):  # pods gone from the answer
        for names in memo.values():
            for remembered in names.values():
                if id(remembered) not in walk.consumed:
                    replaced[_by_name(remembered)] = None
    for namespace, name in replaced:  # the gone ones, so far
        del memo[namespace][name]
    for remembered in walk.updated:
        pod = remembered[1]
        by_name = memo.setdefault(pod.namespace, {})
        was = by_name.get(pod.name)
        if was is None or was[1] is not pod:  # not just the same pod's digests, renewed
            replaced[pod.namespace, pod.name] = pod
        by_name[pod.name] = remembered
    return last.with_pods(replaced)


def _by_name(remembered: _Remembered) -> _Name:
    pod = remembered[1]
    return pod.namespace, pod.name


def _signature(containers: Iterable[bytes], cpu_ids: Iterable[int], memory: Iterable[bytes]) -> _Digest:
    """A pod's containers and memory entries as sorted bytes and its sorted CPU ids, digested.
    (Lists, not tuples: marshal takes either, and this runs once per pod per cycle.)"""
    return _sha256(
        _dumps((sorted(containers), sorted(cpu_ids) if cpu_ids else (), sorted(memory) if memory else ()), 2)
    ).digest()[:16]


def _sorted(entries: Iterable[bytes] | Iterable[int]) -> tuple[Any, ...]:
    return tuple(sorted(entries))


def _pod_key(p: views_pb2.PodView) -> _Digest:
    """Order-free: each container's entries sorted, then the containers. (Lists, as in
    `_signature`: this runs for every pod whose bytes and signature are new.)"""
    parse, fields = views_pb2.ContainerView.FromString, _CONTAINER_FIELDS
    containers = []
    for encoded in p.containers:
        name, devices, cpu_ids, memory, claims = fields(parse(encoded))
        containers.append((name, sorted(devices), sorted(cpu_ids), sorted(memory), sorted(claims)))
    containers.sort()
    return _sha256(_dumps((containers, sorted(p.cpu_ids), sorted(p.memory)), 2)).digest()[:16]


def _alloc_key(a: views_pb2.AllocatableView) -> _Digest:
    return _digest((_sorted(a.devices), _sorted(a.cpu_ids), _sorted(a.memory)))
