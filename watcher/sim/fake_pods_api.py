"""The fake kubelet's Pods API (v1alpha1.Pods, KEP-4188) at `<root>/pods-api/pods-api.sock`.

It behaves as upstream's server (pkg/kubelet/apis/pods, served by ListenAndServePodsServer):

- ListPods and GetPod share one token bucket (100/s, burst 10: the pods package's DefaultQPS and
  DefaultBurstTokens), checked before anything else: RESOURCE_EXHAUSTED "rejected by rate limit".
  WatchPods has no limiter.
- Every call is FAILED_PRECONDITION "Kubelet is initializing" until the kubelet's pod sources are
  ready: here, until the fake's warm-up shows every pod.
- ListPods gives every pod in uid order; GetPod of a uid it does not have is NOT_FOUND "pod with UID
  <uid> not found".
- WatchPods registers the watcher first, then sends an ADDED per pod in uid order, then
  INITIAL_SYNC_COMPLETE, then ADDED, MODIFIED (spec or status changed) and DELETED (only name,
  namespace and uid) as they happen. Changes reach watchers through a broadcaster, a moment after
  they happen (upstream's incoming channel): a change made just before a watch starts can show both
  in its snapshot and again after INITIAL_SYNC_COMPLETE. `delay_broadcasts()` widens that moment so
  a test can make such a duplicate.
- Each watcher has a buffer of 100 events. One that falls further behind (its buffer full when the
  next event comes) is dropped: it still gets the buffered events, then RESOURCE_EXHAUSTED "watch
  client channel closed". Stopping closes every watch the same way, as upstream's kubelet does.

Faults a test can add: `refuse(code, details)` answers every call with that status (a kubelet with
the gate off, or one too old for the API), `inject(kind, pod)` sends every watcher an event with
any bytes as its pod, `answer_garbage(method)` answers ListPods or GetPod with bytes that are not
protobuf, and `add_raw_pods(*raws)` puts any bytes among ListPods' pods (a broken or hostile kubelet);
`stall()` leaves every open watch open but sends it nothing more (a stuck broadcaster: ListPods and
new watches still see the changes), and `endless_snapshot(every, pad)` has each new watch send ADDED
for ever, a new pod each time, and never INITIAL_SYNC_COMPLETE.

The fake finds changes by comparing each pod's encoding with the last one it broadcast, and only
while someone watches (or broadcasts are delayed): with no watcher a change costs nothing.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.ratelimit import TokenBucket
from watcher.sim.fake_faults import GARBAGE
from watcher.sim.fake_pod_objects import deleted_pod
from watcher.sim.fake_sockets import serve_at

__all__ = ["FakePodsApi", "WATCH_BUFFER"]

SERVICE = "v1alpha1.Pods"
WATCH_BUFFER = 100  # events a watcher may have unread before it is dropped
NOT_READY = "Kubelet is initializing"
DROPPED = "watch client channel closed"
RATE_LIMITED = "rejected by rate limit"
STOP_GRACE = 0.2  # seconds the watches get to end in upstream's words when the fake stops

ADDED, MODIFIED, DELETED = pods_pb2.ADDED, pods_pb2.MODIFIED, pods_pb2.DELETED


@dataclass
class _Watcher:
    events: deque[bytes] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False
    stalled: bool = False  # stall(): what is offered is lost

    def offer(self, event: bytes) -> bool:
        """Buffer `event`; False when the buffer is full (the watcher is to be dropped)."""
        if self.stalled:
            return True
        if len(self.events) >= WATCH_BUFFER:
            return False
        self.events.append(event)
        self.wakeup.set()
        return True


@dataclass(frozen=True)
class _Seen:
    namespace: str
    name: str
    encoded: bytes


class FakePodsApi:
    """Serve the pods `pods()` gives (core/v1 Pod messages) while `ready()`, under `root`."""

    def __init__(
        self,
        root: Path,
        pods: Callable[[], list[core_v1_pb2.Pod]],
        *,
        ready: Callable[[], bool],
        rate: float = 100.0,
        burst: int = 10,
    ) -> None:
        self.socket_path = root / "pods-api" / "pods-api.sock"
        self.pods = pods
        self.ready = ready
        self.rate = rate
        self.burst = burst
        self.bucket = TokenBucket(rate, burst)
        self.calls: Counter[str] = Counter()
        self.rejected = 0
        self.dropped = 0  # watchers dropped for lagging
        self.broadcast_delay = 0.0
        self._server: aio.Server | None = None
        self._watchers: list[_Watcher] = []
        self._seen: dict[str, _Seen] | None = None  # uid -> last broadcast; None: not tracking
        self._refresh_pending = False
        # What changed since the last refresh, when the callers said (None: anything may have).
        self._dirty: list[tuple[str, str, core_v1_pb2.Pod | None]] | None = []
        # Told of every batch of events as it goes to the watchers (a benchmark's clock).
        self.on_broadcast: Callable[[list[bytes]], None] | None = None
        self.refusal: tuple[grpc.StatusCode, str] | None = None
        self.garbage: set[str] = set()  # methods answered with bytes that are not protobuf
        self.raw_pods: list[bytes] = []  # entries ListPods gives after the real pods
        self.endless: tuple[float, int] | None = None  # endless_snapshot(): (every, pad)
        self.mute = False  # mute(): new watches are accepted and sent nothing at all
        self.snapshot_delay = 0.0  # seconds a new watch waits for its snapshot (a busy kubelet)

    # -- lifecycle --

    async def start(self) -> None:
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self._handler(),))
        await serve_at(server, self.socket_path)
        self._server = server
        self.bucket = TokenBucket(self.rate, self.burst)
        self._seen = self._current() if self.broadcast_delay > 0 else None

    async def stop(self, *, remove_socket: bool = False) -> None:
        """Stop serving; the stale socket stays unless `remove_socket`. As upstream's broadcaster
        does when the kubelet stops, every watch is closed as a dropped one is: its buffered events,
        then RESOURCE_EXHAUSTED "watch client channel closed" (not counted in `dropped`)."""
        server, self._server = self._server, None
        for watcher in self._watchers:
            watcher.dropped = True
            watcher.wakeup.set()
        self._watchers.clear()
        self._seen = None
        if server is not None:
            # A moment for the streams to end in those words; a client not reading is cut off.
            await server.stop(grace=STOP_GRACE)
        if remove_socket:
            self.socket_path.unlink(missing_ok=True)

    @property
    def watchers(self) -> int:
        """How many watch streams are registered now."""
        return len(self._watchers)

    def delay_broadcasts(self, seconds: float) -> None:
        """Changes reach watchers `seconds` after they happen (0: on the next loop turn)."""
        self.broadcast_delay = seconds
        if seconds > 0 and self._seen is None and self._server is not None:
            self._seen = self._current()

    # -- faults --

    def refuse(self, code: grpc.StatusCode | None, details: str = "") -> None:
        """Answer every call with `code` and `details` from now on (None: serve again)."""
        self.refusal = None if code is None else (code, details)

    def stall(self) -> None:
        """Every watch open now stays open and gets no more events, as if the kubelet's
        broadcaster were stuck on it; ListPods, GetPod and new watches see every change."""
        for watcher in self._watchers:
            watcher.stalled = True

    def endless_snapshot(self, every: float | None = 0.0, pad: int = 0) -> None:
        """Each watch opened from now on sends an ADDED of a new pod (with `pad` bytes of
        annotation) every `every` seconds and never INITIAL_SYNC_COMPLETE (None: snapshots end)."""
        self.endless = None if every is None else (every, pad)

    def muted(self, on: bool = True) -> None:
        """Each watch opened from now on is accepted and then sent nothing, not even its snapshot
        (a kubelet hung before its first event); False: watches are served again."""
        self.mute = on

    def inject(self, kind: pods_pb2.EventType.ValueType, pod: bytes) -> None:
        """Send every watcher an event of `kind` whose pod is `pod`, whatever those bytes are."""
        self._broadcast([pods_pb2.WatchPodsEvent(type=kind, pod=pod).SerializeToString()])

    def answer_garbage(self, method: str) -> None:
        """Answer `method` (ListPods or GetPod) with bytes that are not protobuf at all."""
        if method not in ("ListPods", "GetPod"):
            raise ValueError(f"unknown method {method!r}; expected ListPods or GetPod")
        self.garbage.add(method)

    def add_raw_pods(self, *raws: bytes) -> None:
        """ListPods' answer stays protobuf but also carries these entries as pods, whatever they are."""
        self.raw_pods.extend(raws)

    # -- changes --

    def changed(self, pods: Iterable[tuple[str, str, core_v1_pb2.Pod | None]] | None = None) -> None:
        """Something on the node changed: its pods' events go out on the next loop turn. `pods`
        names what changed, (namespace, name, the pod now or None: gone), when the caller knows:
        then only those are encoded again (a benchmark's 10,000-pod node); None: any pod may have."""
        if self._seen is None:
            return
        if pods is None:
            self._dirty = None
        elif self._dirty is not None:
            self._dirty.extend(pods)
        if self._refresh_pending:
            return
        self._refresh_pending = True
        asyncio.get_running_loop().call_soon(self._refresh)

    def _current(self) -> dict[str, _Seen]:
        dirty, self._dirty = self._dirty, []
        if dirty is not None and self._seen is not None:
            now = dict(self._seen)
            for namespace, name, pod in dirty:
                for uid in [u for u, seen in now.items() if (seen.namespace, seen.name) == (namespace, name)]:
                    del now[uid]
                if pod is not None:
                    now[pod.metadata.uid] = _Seen(namespace, name, pod.SerializeToString())
            return now
        return {
            p.metadata.uid: _Seen(p.metadata.namespace, p.metadata.name, p.SerializeToString())
            for p in self.pods()
        }

    def _refresh(self) -> None:
        self._refresh_pending = False
        if self._seen is None:
            return
        before, now = self._seen, self._current()
        self._seen = now
        events: list[bytes] = []
        for uid in sorted(now):
            old = before.get(uid)
            if old is None or old.encoded != now[uid].encoded:
                kind = ADDED if old is None else MODIFIED
                events.append(pods_pb2.WatchPodsEvent(type=kind, pod=now[uid].encoded).SerializeToString())
        for uid in sorted(set(before) - set(now)):
            gone = deleted_pod(before[uid].namespace, before[uid].name, uid).SerializeToString()
            events.append(pods_pb2.WatchPodsEvent(type=DELETED, pod=gone).SerializeToString())
        if not events:
            return
        if self.broadcast_delay > 0:
            asyncio.get_running_loop().call_later(self.broadcast_delay, self._broadcast, events)
        else:
            self._broadcast(events)

    def _broadcast(self, events: list[bytes]) -> None:
        if self.on_broadcast is not None:
            self.on_broadcast(events)
        for event in events:
            for watcher in list(self._watchers):
                if not watcher.offer(event):
                    watcher.dropped = True
                    watcher.wakeup.set()
                    self._watchers.remove(watcher)
                    self.dropped += 1

    # -- the wire --

    def _handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ListPods": grpc.unary_unary_rpc_method_handler(self._list_pods),
                "GetPod": grpc.unary_unary_rpc_method_handler(self._get_pod),
                "WatchPods": grpc.unary_stream_rpc_method_handler(self._watch_pods),
            },
        )

    async def _admit(self, method: str, context: aio.ServicerContext[bytes, bytes], *, limited: bool) -> None:
        if self.refusal is not None:  # before anything: gRPC itself answers for a missing service
            await context.abort(*self.refusal)
        if limited and not self.bucket.take():
            self.rejected += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)
        if not self.ready():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, NOT_READY)
        self.calls[method] += 1

    def _sorted(self) -> list[core_v1_pb2.Pod]:
        return sorted(self.pods(), key=lambda p: p.metadata.uid)

    async def _list_pods(self, _request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        await self._admit("ListPods", context, limited=True)
        if "ListPods" in self.garbage:
            return GARBAGE
        pods = [p.SerializeToString() for p in self._sorted()] + self.raw_pods
        return pods_pb2.ListPodsResponse(pods=pods).SerializeToString()

    async def _get_pod(self, request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        await self._admit("GetPod", context, limited=True)
        if "GetPod" in self.garbage:
            return GARBAGE
        uid = pods_pb2.GetPodRequest.FromString(request).podUID
        for pod in self.pods():
            if pod.metadata.uid == uid:
                return pods_pb2.GetPodResponse(pod=pod.SerializeToString()).SerializeToString()
        await context.abort(grpc.StatusCode.NOT_FOUND, f"pod with UID {uid} not found")
        raise AssertionError("unreachable")  # abort raises

    async def _watch_pods(
        self, _request: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        await self._admit("WatchPods", context, limited=False)
        if self.mute:
            await asyncio.Event().wait()  # until the client gives up (the call is cancelled)
        if self.endless is not None:
            async for event in _endless(*self.endless):
                yield event
        if self.snapshot_delay > 0:
            await asyncio.sleep(self.snapshot_delay)
        watcher = _Watcher()
        if self._seen is None:
            self._seen = self._current()
        self._watchers.append(watcher)
        try:
            for pod in self._sorted():
                yield pods_pb2.WatchPodsEvent(type=ADDED, pod=pod.SerializeToString()).SerializeToString()
            yield pods_pb2.WatchPodsEvent(type=pods_pb2.INITIAL_SYNC_COMPLETE).SerializeToString()
            while True:
                while not watcher.events:
                    if watcher.dropped:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, DROPPED)
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                yield watcher.events.popleft()
        finally:
            if watcher in self._watchers:
                self._watchers.remove(watcher)


async def _endless(every: float, pad: int) -> AsyncIterator[bytes]:
    """ADDED events of new pods, `every` seconds apart, for ever."""
    for i in itertools.count():
        meta = meta_v1_pb2.ObjectMeta(name=f"endless-{i}", namespace="endless", uid=f"endless-{i:09}")
        if pad:
            meta.annotations["pad"] = "x" * pad
        pod = core_v1_pb2.Pod(metadata=meta).SerializeToString()
        yield pods_pb2.WatchPodsEvent(type=ADDED, pod=pod).SerializeToString()
        await asyncio.sleep(every)
