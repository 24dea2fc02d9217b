"""A Pods API snapshot read within bounds, and compared with the index by the bytes' digests.

The kubelet sends a snapshot as one ADDED per pod, then INITIAL_SYNC_COMPLETE; nothing in the
protocol bounds it. A kubelet that never says INITIAL_SYNC_COMPLETE would have the agent buffer pods
for ever (74 to 177 MiB in 40 s, a core busy), and one that trickles a pod every few seconds would
keep the watch `syncing` for ever. So a snapshot may hold `SnapshotBounds.pods` events, carry
`.bytes` bytes and take `.seconds` seconds; past any of them it is given up (SnapshotBoundError):
the agent works from pod-resources alone and tries again on a slow backoff (`.retry`).

The defaults sit well above a real large node: 10,000 pods of a few KiB each are 10,000 events
and some tens of MiB, read in about a second. The pods bound is what bounds memory (a buffered pod
is its small record, not its bytes); the bytes bound, the CPU spent decoding; the time bound, a
kubelet that trickles.

`Digests` keeps, per indexed pod, a digest of the bytes it was decoded from: a snapshot or a
ListPods answer hashes each pod and decodes only those whose bytes the index does not hold, so an
unchanged 10,000-pod node costs hashing (tens of milliseconds), no decode.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from watcher import errors
from watcher.backoff import Backoff
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.devicehealth.pods import PodIndex, PodMeta

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PODS",
    "DEFAULT_MAX_SECONDS",
    "Digests",
    "Snapshot",
    "SnapshotBounds",
    "digest",
]

DEFAULT_MAX_PODS = 25_000  # 2.5x the largest node measured (10,000 pods); 225x kubelet's default maxPods
DEFAULT_MAX_BYTES = 512 << 20  # 5x 10,000 pods of 10 KiB; also what one ListPods may answer
DEFAULT_MAX_SECONDS = 60.0  # a 10,000-pod snapshot is read in about a second

ADDED, MODIFIED, DELETED = pods_pb2.ADDED, pods_pb2.MODIFIED, pods_pb2.DELETED
_FALLBACK = "the agent works from pod-resources alone and reads a snapshot again later"


def digest(raw: bytes | memoryview) -> bytes:
    """A pod's bytes, named in 16 bytes: BLAKE2b, so that two versions of a pod colliding, by
    chance or crafted in its labels, is out of reach (2^64 work) and a change is never missed."""
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass(frozen=True)
class SnapshotBounds:
    """What one snapshot may cost before it is given up. Only the time is a setting
    (`[pods] snapshot_timeout`): no real node comes near the other two."""

    pods: int = DEFAULT_MAX_PODS
    bytes: int = DEFAULT_MAX_BYTES
    seconds: float = DEFAULT_MAX_SECONDS
    # A kubelet that went past a bound once will likely do it again: retried after 30 s, then
    # doubling up to 10 min, each try costing at most one bound's worth of reading.
    retry: Backoff = field(default_factory=lambda: Backoff(base=30.0, cap=600.0))


class Digests:
    """uid <-> the digest of the bytes its index entry was decoded from. Kept by the index's one
    writer (the watch) in step with it: every entry the index gains, changes or loses."""

    def __init__(self) -> None:
        self._of: dict[str, bytes] = {}
        self._uid: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self._of)

    def uid(self, key: bytes) -> str | None:
        """The indexed pod whose bytes were these (None: bytes the index does not hold)."""
        return self._uid.get(key)

    def set(self, uid: str, key: bytes) -> None:
        self.drop(uid)
        self._of[uid] = key
        self._uid[key] = uid

    def drop(self, uid: str) -> None:
        old = self._of.pop(uid, None)
        if old is not None and self._uid.get(old) == uid:
            del self._uid[old]

    def replace(self, of: dict[str, bytes]) -> None:
        """Hold exactly `of` (a fresh snapshot's digests)."""
        self._of = dict(of)
        self._uid = {key: uid for uid, key in of.items()}


class Snapshot:
    """One snapshot as it is read: its pods by uid, their digests, and its cost so far."""

    def __init__(self, bounds: SnapshotBounds, *, started: float, socket: str) -> None:
        self.bounds = bounds
        self.started = started
        self.socket = socket
        self.pods: dict[str, PodMeta] = {}
        self.digests: dict[str, bytes] = {}
        self.events = 0
        self.bytes = 0

    @property
    def ends(self) -> float:
        """When the snapshot's time is up (the loop's clock)."""
        return self.started + self.bounds.seconds

    def add(
        self,
        kind: int,
        raw: bytes,
        *,
        index: PodIndex,
        digests: Digests,
        decode: Callable[[bytes], PodMeta | None],
        uid_of: Callable[[bytes], str | None],
    ) -> None:
        """Buffer one event (a duplicate replaces, as any upsert does); SnapshotBoundError past a bound."""
        self.events += 1
        self.bytes += len(raw)
        self._check()
        if kind == DELETED:
            uid = uid_of(raw)
            if uid is not None:
                self.pods.pop(uid, None)
                self.digests.pop(uid, None)
            return
        if kind not in (ADDED, MODIFIED):
            return
        key = digest(raw)
        known = digests.uid(key)
        pod = index.by_uid(known) if known is not None else None
        if pod is None:
            pod = decode(raw)
        if pod is not None:
            self.pods[pod.uid] = pod
            self.digests[pod.uid] = key

    def _check(self) -> None:
        b = self.bounds
        if self.events > b.pods:
            self._exceeded(f"more than {b.pods} pods")
        if self.bytes > b.bytes:
            self._exceeded(f"more than {b.bytes} bytes of pods")

    def timed_out(self) -> errors.SnapshotBoundError:
        """The error for a snapshot still unfinished when its time is up."""
        return self._error(
            f"no INITIAL_SYNC_COMPLETE within {self.bounds.seconds:g} s ([pods] snapshot_timeout), "
            f"after {self.events} pods"
        )

    def _exceeded(self, what: str) -> None:
        raise self._error(f"{what} without INITIAL_SYNC_COMPLETE")

    def _error(self, what: str) -> errors.SnapshotBoundError:
        return errors.SnapshotBoundError(
            f"the Pods API's snapshot on {self.socket} sent {what}: the kubelet is misbehaving, or "
            f"the node is larger than the bound allows; {_FALLBACK}",
            socket=self.socket,
            method="WatchPods",
        )
