"""PodStream: the Pods API's index and what keeps it, one stream after another.

Each stream (`read`) starts with a snapshot, buffered within bounds (`watcher.sources.pods_api.snapshot`)
and compared with the index: only what differs is reported (resync=True). Then live events: each an
upsert by uid, reported only when the pod differs from what is held in what a cycle acts on
(`watcher.sources.pods_api.changes`: labels and owner alone are not). While a stream is live, a periodic
ListPods checks that it still delivers (`watcher.sources.pods_api.resync`). The watch
(`watcher.sources.pods_api.watch`) opens the streams and keeps their states; the index outlives them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from pathlib import Path

import structlog

from watcher import errors
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.devicehealth.pods import PodIndex, PodMeta
from watcher.sources.pods_api.alarms import DecodeWarnings, FloodWarnings
from watcher.sources.pods_api.changes import PodChange, pod_change, told
from watcher.sources.pods_api.decoding import pod_meta, pod_uid
from watcher.sources.pods_api.resync import Listed, StreamCheck
from watcher.sources.pods_api.snapshot import Digests, Snapshot, SnapshotBounds, digest

__all__ = ["PodStream"]

log = structlog.get_logger("watcher.sources.pods_api.watch")

ADDED, MODIFIED, DELETED, SYNCED = (
    pods_pb2.ADDED,
    pods_pb2.MODIFIED,
    pods_pb2.DELETED,
    pods_pb2.INITIAL_SYNC_COMPLETE,
)


class PodStream:
    """The index (`index`), kept by each stream `read` gives it; see the module docstring."""

    def __init__(
        self,
        socket: Path,
        *,
        labels: Collection[str],
        timeout: float,
        bounds: SnapshotBounds,
        on_changes: Callable[[Sequence[PodChange], bool], None],
        check: StreamCheck | None,
    ) -> None:
        self.socket = socket
        self.labels = frozenset(labels)
        self.timeout = timeout
        self.bounds = bounds
        self.index = PodIndex()
        self.digests = Digests()  # of the bytes each index entry came from: unchanged pods skip decoding
        self.on_changes = on_changes
        self.check = check  # None: no periodic check ([pods] resync_interval = 0)
        self.events = 0  # events read
        self.decoded = 0  # pods decoded: bytes the index holds already (by digest) are not
        self.decode_warnings = DecodeWarnings()
        self.flood_warnings = FloodWarnings()

    async def read(
        self,
        stream: AsyncGenerator[tuple[int, bytes], None],
        *,
        reconnect: Callable[[], None],
        answered: Callable[[], None],
        synced: Callable[[], None],
    ) -> None:
        """Read `stream` until it ends (always with an exception): `answered` at its first event,
        `synced` once its snapshot is held; `reconnect` is what the check calls on a stream that
        missed changes. SnapshotBoundError for a snapshot past its bounds."""
        loop = asyncio.get_running_loop()
        fresh = Snapshot(self.bounds, started=loop.time(), socket=str(self.socket))
        snapshot: Snapshot | None = fresh
        ends, first = fresh.ends, True
        checking: asyncio.Task[None] | None = None
        try:
            async with (
                contextlib.aclosing(stream) as events,
                asyncio.timeout_at(min(loop.time() + self.timeout, ends)) as deadline,
            ):
                async for kind, raw in events:
                    self.events += 1
                    if snapshot is None:
                        self._live(kind, raw)
                        continue
                    if first:  # the kubelet answered
                        first = False
                        answered()
                    if kind != SYNCED:
                        self._buffer(snapshot, kind, raw)
                        # A snapshot that stalls is a hung kubelet; live events may be hours apart.
                        deadline.reschedule(min(loop.time() + self.timeout, ends))
                        continue
                    deadline.reschedule(None)
                    self._resync(snapshot)
                    snapshot = None
                    synced()
                    checking = self._start_check(reconnect)
        except TimeoutError:
            if snapshot is not None and loop.time() >= ends:
                raise snapshot.timed_out() from None
            raise errors.DeadlineExceededError(
                f"the Pods API on {self.socket} sent nothing for {self.timeout:g} s while sending its "
                "snapshot: the kubelet is overloaded or hung; reconnecting",
                socket=str(self.socket),
                method="WatchPods",
            ) from None
        finally:
            if checking is not None:
                checking.cancel()
                await asyncio.gather(checking, return_exceptions=True)
        raise AssertionError("unreachable: the client's watch always ends with an exception")

    def _start_check(self, reconnect: Callable[[], None]) -> asyncio.Task[None] | None:
        """The live stream's periodic ListPods check; it ends the stream (`reconnect`) when it
        finds changes the stream missed, for a fresh one."""
        if self.check is None:
            return None
        task = asyncio.create_task(
            self.check.run(
                index=self.index,
                digests=self.digests,
                decode=self._decode,
                apply=self._apply_listed,
                reconnect=reconnect,
            )
        )
        task.add_done_callback(self._check_ended)
        return task

    def _check_ended(self, task: asyncio.Task[None]) -> None:
        # It ends only cancelled or after asking for a reconnect; anything else is a bug, said
        # loudly rather than left to end the checks silently.
        if not task.cancelled() and (err := task.exception()) is not None:
            log.error(
                "the Pods API stream check failed; the stream goes on unchecked until it reconnects",
                error=repr(err),
                socket=str(self.socket),
            )

    def _decode(self, raw: bytes) -> PodMeta | None:
        self.decoded += 1
        try:
            return pod_meta(raw, labels=self.labels)
        except errors.PodDecodeError as err:
            self.decode_warnings.skipped_pod(err.uid, str(err), socket=str(self.socket))
            return None

    def _deleted_uid(self, raw: bytes) -> str | None:
        try:
            return pod_uid(raw)
        except errors.PodDecodeError as err:
            self.decode_warnings.skipped_pod(err.uid, str(err), socket=str(self.socket))
            return None

    def _buffer(self, snapshot: Snapshot, kind: int, raw: bytes) -> None:
        snapshot.add(
            kind, raw, index=self.index, digests=self.digests, decode=self._decode, uid_of=self._deleted_uid
        )

    def _hold(self, uid: str, pod: PodMeta | None, key: bytes | None) -> PodMeta | None:
        """Put `pod` in the index as `uid`'s entry (None: forget it), its bytes' digest beside it;
        the entry it replaced."""
        before = self.index.by_uid(uid)
        if pod is None:
            self.index.drop(uid)
        elif pod != before:
            self.index.put(pod)
        if pod is None or key is None:
            self.digests.drop(uid)
        else:
            self.digests.set(uid, key)
        return before

    def _tell(self, changes: list[PodChange], resync: bool) -> None:
        """Report what a cycle acts on; labels and owner alone are in the index already."""
        acted = [c for c in changes if told(c.before, c.after)]
        if acted:
            self.on_changes(acted, resync)

    def _resync(self, snapshot: Snapshot) -> None:
        """Report what the fresh snapshot says differently from the index, and hold it."""
        changes = []
        for uid in sorted(self.index.uids() | snapshot.pods.keys()):
            before, after = self.index.by_uid(uid), snapshot.pods.get(uid)
            if before == after:
                continue
            if after is None:
                self.index.drop(uid)
            else:
                self.index.put(after)
            changes.append(pod_change(uid, before, after))
        self.digests.replace(snapshot.digests)
        self._tell(changes, True)

    def _apply_listed(self, found: Listed) -> int:
        """Hold what a ListPods check found the stream missed and report it as a snapshot's
        differences; how many pods changed in what the agent keeps (a pod whose bytes alone
        changed, nothing the agent keeps, only moves its digest)."""
        changes = []
        for uid, (pod, key) in sorted(found.items()):
            before = self._hold(uid, pod, key)
            if before != pod:
                changes.append(pod_change(uid, before, pod))
        self._tell(changes, True)
        return len(changes)

    def _live(self, kind: int, raw: bytes) -> None:
        if kind == DELETED:
            # Its body carries only name, namespace and uid: the uid is all that is read.
            uid = self._deleted_uid(raw)
            if uid is None:
                return
            if self.check is not None:
                self.check.touched(uid)
            before = self._hold(uid, None, None)
            if before is not None:
                self._tell([pod_change(uid, before, None)], False)
            return
        if kind not in (ADDED, MODIFIED):
            return  # an event type newer than this agent: nothing it can act on
        pod = self._decode(raw)
        if pod is None:
            return
        if self.check is not None:
            self.check.touched(pod.uid)
        if kind == MODIFIED:
            self.flood_warnings.modified(pod.uid, pod.key)
        before = self._hold(pod.uid, pod, digest(raw))
        if before == pod:
            return  # a duplicate, or a change to fields the agent does not keep
        self._tell([pod_change(pod.uid, before, pod)], False)
