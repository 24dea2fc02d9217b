"""PodsWatch: the agent's one watch of the kubelet's Pods API, kept up until the agent stops.

The stream has no resume: every (re)connect starts with a snapshot (one ADDED per pod, then
INITIAL_SYNC_COMPLETE), and any event may come twice. So the snapshot is buffered and only what
differs from the index held is reported (resync=True); a live event is an upsert by uid, and
reports something only if the pod differs from what is held. The index is the watch's alone.

States, and what the agent does in each (`on_state` is told of every change, the log once):
off (not started), absent (no socket, or nobody answers on it: the directory is watched and the
watch connects when a socket appears), denied (the socket refuses us: retried on the backoff),
disabled (the kubelet refuses the API with any code: retried on the backoff and at once when the
socket is replaced), initializing (the kubelet's warm-up: retried shortly), syncing (reading a
snapshot), watching (live). In every state but watching the agent works from pod-resources alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from watcher import errors, heap
from watcher.backoff import Backoff
from watcher.kubelet.identity import FileIdentity, is_replacement, probe_socket
from watcher.kubelet.pod_alarms import DecodeWarnings, FloodWarnings
from watcher.kubelet.pod_decoding import pod_meta, pod_uid
from watcher.kubelet.pods_api import PodsApiClient
from watcher.kubelet.watching import DirectoryWatches, Subscription
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.pod_meta import PodIndex, PodMeta
from watcher.supervision import Scope, StoppedError, sleep_or_stop, unless_stopped, wait_any

__all__ = ["PodChange", "PodsWatch", "STATES"]

log = structlog.get_logger("watcher.kubelet.pods_watch")

STATES = ("off", "absent", "denied", "disabled", "initializing", "syncing", "watching")
ADDED, MODIFIED, DELETED, SYNCED = (
    pods_pb2.ADDED,
    pods_pb2.MODIFIED,
    pods_pb2.DELETED,
    pods_pb2.INITIAL_SYNC_COMPLETE,
)
_INITIALIZING_CAP = 1.0  # the warm-up lasts seconds: retry within a second, not the backoff's cap
_DROPS_APART = 10.0  # a second drop sooner than this waits out the backoff before reconnecting
_FALLBACK = "the agent works from pod-resources alone"


@dataclass(frozen=True)
class PodChange:
    """One pod that differs from what the agent held."""

    uid: str
    before: PodMeta | None  # None: a pod new to the agent
    after: PodMeta | None  # None: deleted
    resources: bool  # its holdings may have changed: the reactor re-reads it with pod-resources Get


def _change(uid: str, before: PodMeta | None, after: PodMeta | None) -> PodChange:
    # A new spec bumps the generation; a phase change starts or ends containers. A status update
    # alone (a device verdict) leaves what the pod holds as it was.
    resources = (
        before is None
        or after is None
        or before.phase != after.phase
        or before.generation != after.generation
    )
    return PodChange(uid, before, after, resources)


class _ReplacedError(Exception):
    """Another socket is at the path: the stream is to the old kubelet, reconnect at once."""


class PodsWatch:
    """Run the watch (`run()`) until `stop`; see the module docstring."""

    def __init__(
        self,
        socket: Path,
        *,
        labels: Collection[str],
        backoff: Backoff,
        stop: asyncio.Event,
        on_changes: Callable[[Sequence[PodChange], bool], None],
        on_state: Callable[[str, str], None] | None = None,
        timeout: float = 5.0,
        watches: DirectoryWatches | None = None,
    ) -> None:
        self.socket = socket
        # The agent's one directory watch; without one given, this watch runs its own.
        self._own_watches = watches is None
        self.watches = watches if watches is not None else DirectoryWatches(stop=stop, step_ms=10)
        self.labels = frozenset(labels)
        self.backoff = backoff
        self.stop = stop
        self.on_changes = on_changes
        self.on_state = on_state
        self.timeout = timeout
        self.index = PodIndex()
        self.state = "off"
        self.detail = ""
        self.attempts = 0  # streams tried
        self.connects = 0  # streams the kubelet answered
        self.events = 0  # events read
        self.decode_warnings = DecodeWarnings()
        self.flood_warnings = FloodWarnings()
        self._attempt = 0
        self._last_drop = -_DROPS_APART
        self._troubles: set[type[BaseException]] = set()  # logged since the last "watching"
        self._stable = "off"  # the last state but syncing: what was last logged
        self._tried: FileIdentity | None = None  # the socket the last stream was opened on
        self._drop: tuple[FileIdentity | None] | None = None  # a closed stream's socket, until explained
        self._sub: Subscription | None = None

    # -- states --

    def _set_state(self, state: str, detail: str) -> None:
        self.detail = detail
        if state == self.state:
            return
        self.state = state
        if state == "watching":
            self._troubles.clear()
        if state != "syncing":
            # Logged once per change of the lasting state: a drop and its quick resync say nothing
            # more, a reconnect loop against a kubelet that is initializing says it once.
            stable, self._stable = self._stable, state
            if state != stable:
                self._log_state(state, detail)
        if self.on_state is not None:
            self.on_state(state, detail)

    def _log_state(self, state: str, detail: str) -> None:
        socket = str(self.socket)
        if state == "watching":
            log.info("watching the Pods API", socket=socket)
        elif state == "absent":
            log.info(f"Pods API not reachable; {_FALLBACK} until its socket is there", detail=detail)
        elif state in ("denied", "disabled"):
            log.warning(f"Pods API {state}; {_FALLBACK}", detail=detail)
        elif state == "initializing":
            log.info("the kubelet is initializing; the Pods API watch waits for it", detail=detail)

    def _trouble(self, err: BaseException) -> None:
        """A stream that ended for another reason: one warning per kind until watching again."""
        if type(err) not in self._troubles:
            self._troubles.add(type(err))
            log.warning("Pods API watch ended; reconnecting", error=str(err), socket=str(self.socket))
        self._set_state("syncing", str(err))

    # -- the loop --

    async def run(self) -> None:
        # Subscribed for the watch's life: a subscription per stream would have the one directory
        # watch made again at every (re)connect.
        self._sub = self.watches.subscribe(self.socket.parent, lambda n: n == self.socket.name, "pods-api")
        watching = asyncio.create_task(self.watches.run()) if self._own_watches else None
        try:
            await self._run()
        finally:
            self._sub.close()
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                await self._session()
            except _ReplacedError:
                continue
            except StoppedError:
                return
            except errors.WatchDroppedError as err:
                # Upstream's kubelet closes every watch with these very words as it stops, too:
                # the reconnect tells which it was (`_drop_explained`), and only a drop is warned.
                self._drop = (self._tried,)
                self._set_state("syncing", str(err))
                now = time.monotonic()
                if now - self._last_drop < _DROPS_APART:
                    await sleep_or_stop(self.stop, self._next_delay())
                self._last_drop = now
            except errors.KubeletInitializingError as err:
                self._set_state("initializing", str(err))
                await sleep_or_stop(self.stop, min(_INITIALIZING_CAP, self._next_delay()))
            except errors.SocketPermissionError as err:
                self._set_state("denied", str(err))
                await self._wait_for_socket(within=self._next_delay())
            except errors.MethodDisabledError as err:
                self._set_state("disabled", str(err))
                await self._wait_for_socket(within=self._next_delay())
            except (errors.SocketMissingError, errors.NotASocketError) as err:
                self._set_state("absent", str(err))
                await self._wait_for_socket(within=None)
            except errors.KubeletUnavailableError as err:  # a stale socket: the kubelet is down
                self._set_state("absent", str(err))
                await self._wait_for_socket(within=self._next_delay())
            except (errors.KubeletError, errors.PodDecodeError) as err:
                self._trouble(err)
                await sleep_or_stop(self.stop, self._next_delay())

    def _next_delay(self) -> float:
        delay = self.backoff.delay(self._attempt)
        self._attempt += 1
        return delay

    async def _session(self) -> None:
        """One stream: connect, snapshot, live events, until it ends (always with an exception)."""
        self.attempts += 1
        self._tried = probe_socket(self.socket).identity
        scope = Scope(self.stop)
        guard = asyncio.create_task(self._guard(self._tried, scope))
        try:
            async with PodsApiClient(str(self.socket), timeout=self.timeout) as client:
                await unless_stopped(scope, self._read(client.watch()))
        except errors.WatchDroppedError:
            raise
        except StoppedError:
            if self.stop.is_set():
                raise
            self._drop_explained(answered=False)
            raise _ReplacedError from None
        except Exception:
            self._drop_explained(answered=False)  # gone, refusing, warming up: it stopped
            raise
        finally:
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)

    def _drop_explained(self, *, answered: bool) -> None:
        """After a closed stream, the reconnect's outcome says why: the same kubelet answering again
        (`answered` on the same socket) dropped a watch that fell behind, a warning; one gone,
        refusing or replaced closed it as it stopped."""
        if self._drop is None:
            return
        (old,), self._drop = self._drop, None
        # The socket as it is now, not as probed before connecting: a kubelet replacing it in
        # between answers on the new one, and that is a restart, not a drop.
        now = probe_socket(self.socket).identity if answered else self._tried
        if (
            answered
            and old is not None
            and now is not None
            and not is_replacement(old, now, name_events=False)
        ):
            log.warning("the kubelet dropped the Pods API watch; reconnecting for a fresh snapshot")
        else:
            log.info("the Pods API watch was closed as the kubelet stopped", socket=str(self.socket))

    def _replaced(self, old: FileIdentity | None, name_events: bool) -> bool:
        """Is a socket at the path that is not `old` (None: any socket)?"""
        now = probe_socket(self.socket)
        if not now.present or now.identity is None:
            return False
        return old is None or is_replacement(old, now.identity, name_events=name_events)

    async def _guard(self, seen: FileIdentity | None, scope: Scope) -> None:
        """Set `scope` when another socket replaces `seen` (a kubelet restart we must not miss)."""
        if seen is None:
            return
        async with contextlib.aclosing(self._directory()) as batches:
            async for batch in batches:
                if self._replaced(seen, bool(batch)):
                    log.info("the Pods API socket was replaced; reconnecting", socket=str(self.socket))
                    scope.set()
                    return

    async def _directory(self) -> AsyncGenerator[dict[str, set[str]], None]:
        """The socket directory's batches from now on (what came before was probed by the caller)."""
        sub = self._sub
        assert sub is not None, "run() subscribes"
        sub.drain()
        while not self.stop.is_set():
            try:
                yield await unless_stopped(self.stop, sub.next())
            except StoppedError:
                return

    async def _wait_for_socket(self, *, within: float | None) -> None:
        """Until a socket other than the one last tried is at the path, or `within` seconds
        (None: no limit) pass. No polling: the directory's events, and its ticks for what they miss."""
        old = self._tried if probe_socket(self.socket).present else None
        if old is not None and self._replaced(old, False):
            return
        found = asyncio.Event()

        async def watch() -> None:
            async with contextlib.aclosing(self._directory()) as batches:
                async for batch in batches:
                    if self._replaced(old, bool(batch)):
                        found.set()
                        return

        task = asyncio.create_task(watch())
        try:
            await wait_any(found, self.stop, within=within)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the stream --

    async def _read(self, stream: AsyncGenerator[tuple[int, bytes], None]) -> None:
        snapshot: dict[str, PodMeta] | None = {}
        answered = False
        loop = asyncio.get_running_loop()
        try:
            async with contextlib.aclosing(stream) as events, asyncio.timeout(self.timeout) as deadline:
                async for kind, raw in events:
                    self.events += 1
                    if snapshot is None:
                        self._live(kind, raw)
                        continue
                    if not answered:  # the first event: the kubelet answered
                        answered = True
                        self.connects += 1
                        self._drop_explained(answered=True)
                        self._set_state("syncing", f"reading the Pods API's snapshot on {self.socket}")
                    if kind != SYNCED:
                        # A snapshot that stalls is a hung kubelet; live events may be hours apart.
                        deadline.reschedule(loop.time() + self.timeout)
                        self._buffer(snapshot, kind, raw)
                        continue
                    deadline.reschedule(None)
                    self._resync(snapshot)
                    snapshot = None
                    heap.settle("the Pods API's snapshot")  # every pod read afresh: watcher.heap
                    self._attempt = 0
                    self._set_state("watching", f"watching the Pods API on {self.socket}")
        except TimeoutError:
            raise errors.DeadlineExceededError(
                f"the Pods API on {self.socket} sent nothing for {self.timeout:g} s while sending its "
                "snapshot: the kubelet is overloaded or hung; reconnecting",
                socket=str(self.socket),
                method="WatchPods",
            ) from None
        raise AssertionError("unreachable: the client's watch always ends with an exception")

    def _decode(self, raw: bytes) -> PodMeta | None:
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

    def _buffer(self, snapshot: dict[str, PodMeta], kind: int, raw: bytes) -> None:
        if kind in (ADDED, MODIFIED):
            pod = self._decode(raw)
            if pod is not None:
                snapshot[pod.uid] = pod  # a duplicate replaces, as any upsert does
        elif kind == DELETED:
            uid = self._deleted_uid(raw)
            if uid is not None:
                snapshot.pop(uid, None)

    def _resync(self, snapshot: dict[str, PodMeta]) -> None:
        """Report what the fresh snapshot says differently from the index, and hold it."""
        changes = []
        for uid in sorted(self.index.uids() | snapshot.keys()):
            before, after = self.index.by_uid(uid), snapshot.get(uid)
            if before == after:
                continue
            if after is None:
                self.index.drop(uid)
            else:
                self.index.put(after)
            changes.append(_change(uid, before, after))
        if changes:
            self.on_changes(changes, True)

    def _live(self, kind: int, raw: bytes) -> None:
        if kind == DELETED:
            # Its body carries only name, namespace and uid: the uid is all that is read.
            uid = self._deleted_uid(raw)
            before = None if uid is None else self.index.drop(uid)
            if uid is not None and before is not None:
                self.on_changes([_change(uid, before, None)], False)
            return
        if kind not in (ADDED, MODIFIED):
            return  # an event type newer than this agent: nothing it can act on
        pod = self._decode(raw)
        if pod is None:
            return
        if kind == MODIFIED:
            self.flood_warnings.modified(pod.uid, pod.key)
        before = self.index.by_uid(pod.uid)
        if before == pod:
            return  # a duplicate, or a change to fields the agent does not keep
        self.index.put(pod)
        self.on_changes([_change(pod.uid, before, pod)], False)
