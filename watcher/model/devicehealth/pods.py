"""What the kubelet's Pods API says of a pod beyond its holdings: who it is, what owns it, and the
kubelet's verdict on each device allocated to it. Pure.

pod-resources names a pod by namespace and name only; the Pods API (a watch of the kubelet's pods)
carries the whole Pod object. The agent keeps this small part of it (`watcher.sources.pods_api.decoding`
makes it, within bounds) and nothing else, so 10,000 pods cost a few megabytes, not the objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "UNKNOWN",
    "CLAIM_PREFIX",
    "Owner",
    "DeviceVerdict",
    "ExtendedRequest",
    "PodMeta",
    "PodIndex",
]

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
# allocatedResourcesStatus names a DRA allocation "claim:<pod claim>" or "claim:<pod claim>/<request>".
CLAIM_PREFIX = "claim:"


@dataclass(frozen=True, slots=True)
class Owner:
    """The pod's controller as its own ownerReferences name it (ReplicaSet, Job, StatefulSet, ...).
    Only one level: what owns the ReplicaSet is not in the pod, and the agent asks no API server."""

    kind: str
    name: str
    uid: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    """The kubelet's verdict on one device allocated to a container
    (`status.containerStatuses[].allocatedResourcesStatus[].resources[]`).

    `resource` is the status entry's name: a device plugin's resource (`nvidia.com/gpu`), or
    `claim:<pod claim name>[/<request>]` for DRA. `resource_id` is the device id as pod-resources
    shows it (device plugin), or the device's first CDI id, else `driver/pool/device` (DRA).
    `health` is Healthy, Unhealthy or Unknown (DRA only); `message` the driver's words (DRA only).
    """

    container: str
    resource: str
    resource_id: str
    health: str
    message: str

    @property
    def is_claim(self) -> bool:
        return self.resource.startswith(CLAIM_PREFIX)

    @property
    def claim(self) -> tuple[str, str | None]:
        """(pod claim name, request or None) of a DRA verdict."""
        ref = self.resource[len(CLAIM_PREFIX) :]
        name, _, request = ref.partition("/")
        return name, request or None


@dataclass(frozen=True, slots=True)
class ExtendedRequest:
    """A classic extended resource (`nvidia.com/gpu`) a DRA driver serves for one container
    (`status.extendedResourceClaimStatus.requestMappings[]`): its devices are under the container's
    DRA claims in pod-resources, never in allocatable."""

    container: str
    resource: str
    request: str


@dataclass(frozen=True, slots=True)
class PodMeta:
    """One pod as the Pods API shows it, cut to what events use. `labels` holds only the
    configured keys, values printable and capped; `claims` maps the pod's claim names to the
    ResourceClaim objects' names (`status.resourceClaimStatuses`)."""

    uid: str
    namespace: str
    name: str
    phase: str = ""
    generation: int = 0
    owner: Owner | None = None
    labels: tuple[tuple[str, str], ...] = ()
    verdicts: tuple[DeviceVerdict, ...] = ()
    claims: tuple[tuple[str, str], ...] = ()
    extended_claim: str | None = None  # the ResourceClaim serving its extended resources
    extended: tuple[ExtendedRequest, ...] = ()
    dropped_verdicts: int = 0  # verdicts past the per-pod cap, counted, not kept
    # A Pending pod's extended resources (nvidia.com/gpu) in its containers' limits: what it waits
    # for (watcher.model.expected); () for a pod past Pending, so an unchanged pod decodes equal.
    wants: tuple[str, ...] = ()
    # status.reason and status.message: why the kubelet failed it (an admission rejection:
    # watcher.model.rejections); "" for a pod that did not fail so.
    reason: str = ""
    message: str = ""
    # The DisruptionTarget condition's reason while it is True: why the pod is being deleted
    # (DeletionByDeviceTaintManager: a device taint evicts it, watcher.model.devicehealth.evictions).
    disruption: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def claim_object(self, pod_claim: str) -> str | None:
        """The ResourceClaim object's name for the pod's claim `pod_claim` (None: not known)."""
        for name, obj in self.claims:
            if name == pod_claim:
                return obj
        return None

    def who(self) -> dict[str, Any]:
        """What events about this pod carry of it: uid, controller, allowlisted labels."""
        return {
            "uid": self.uid,
            "owner": self.owner.to_json() if self.owner is not None else None,
            "labels": dict(self.labels),
        }


class PodIndex:
    """The pods the Pods API last showed, by uid and by namespace/name.

    A name is reused (a StatefulSet's pod deleted and recreated) and a late update of the old pod
    may come after the new one's ADDED, so the uid is the key and a name is only a pointer: it
    names the newest pod that has it, the one pod-resources now shows under it. A pod first seen
    takes its name; an update of a pod already held never takes it back from a newer one. When the
    newest goes, the name falls back to the newest older pod still held.

    Mutable, and written by its one owner (the Pods API watch) only: a stream that floods changes
    for one pod costs a dict write per change, not a copy of 10,000 entries. Readers get it as a
    read-only view through `get` and iteration.
    """

    def __init__(self, pods: Iterable[PodMeta] = ()) -> None:
        self._by_uid: dict[str, PodMeta] = {}
        self._by_key: dict[str, str] = {}  # "namespace/name" -> the uid of the newest pod so named
        # The older pods under a name a newer one took, oldest first: only reused names have an entry.
        self._older: dict[str, list[str]] = {}
        self._claim_verdicts: set[str] = set()  # uids of pods with a verdict on a DRA device
        for pod in pods:
            self.put(pod)

    def __len__(self) -> int:
        return len(self._by_uid)

    def __iter__(self) -> Iterator[PodMeta]:
        return iter(self._by_uid.values())

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def with_claim_verdicts(self) -> Iterator[PodMeta]:
        """The pods whose status has a verdict on a DRA device (the few a health look reads)."""
        return (self._by_uid[uid] for uid in sorted(self._claim_verdicts))

    def uids(self) -> frozenset[str]:
        return frozenset(self._by_uid)

    def by_uid(self, uid: str) -> PodMeta | None:
        return self._by_uid.get(uid)

    def get(self, namespace: str, name: str) -> PodMeta | None:
        """The newest pod named namespace/name (the one pod-resources shows under it), if any."""
        uid = self._by_key.get(f"{namespace}/{name}")
        return None if uid is None else self._by_uid.get(uid)

    def named(self, namespace: str, name: str) -> tuple[PodMeta, ...]:
        """Every pod held under namespace/name, oldest first: the newest (`get`) is the last."""
        key = f"{namespace}/{name}"
        newest = self._by_key.get(key)
        uids = [*self._older.get(key, ()), *([newest] if newest is not None else [])]
        return tuple(self._by_uid[uid] for uid in uids)

    def put(self, pod: PodMeta) -> PodMeta | None:
        """Store `pod` (an upsert by uid); the entry it replaced, if any."""
        old = self._by_uid.get(pod.uid)
        new_here = old is None or old.key != pod.key
        if old is not None and new_here:
            self._unname(pod.uid, old.key)  # a uid renamed: never in Kubernetes, but bytes are bytes
        self._by_uid[pod.uid] = pod
        key, holder = pod.key, self._by_key.get(pod.key)
        if new_here and holder is not None and holder != pod.uid:
            self._older.setdefault(key, []).append(holder)  # a new pod under a reused name
            self._by_key[key] = pod.uid
        elif holder is None:
            self._by_key[key] = pod.uid
        if any(v.is_claim for v in pod.verdicts):
            self._claim_verdicts.add(pod.uid)
        else:
            self._claim_verdicts.discard(pod.uid)
        return old

    def drop(self, uid: str) -> PodMeta | None:
        """Forget the pod `uid`; the entry dropped, if any."""
        old = self._by_uid.pop(uid, None)
        self._claim_verdicts.discard(uid)
        if old is not None:
            self._unname(uid, old.key)
        return old

    def _unname(self, uid: str, key: str) -> None:
        older = self._older.get(key)
        if self._by_key.get(key) == uid:
            if older:
                self._by_key[key] = older.pop()  # the newest older pod still held
            else:
                del self._by_key[key]
        elif older is not None and uid in older:
            older.remove(uid)
        if older is not None and not older:
            del self._older[key]
