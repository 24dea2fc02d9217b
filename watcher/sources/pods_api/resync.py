"""The live stream checked: every `[pods] resync_interval` one ListPods, compared with the index.

A kubelet that keeps the watch open but stops sending (a stuck broadcaster, a bug) would leave the
agent `watching` a node that has moved on: a device Unhealthy in the Pod status, never reported. The
stream has no heartbeat to miss, so the check asks the other way: one ListPods (one call a period
under the kubelet's shared 100/s limiter, on a channel of its own whose receive limit is a whole
node's, the snapshot's byte bound, not one pod's), each pod hashed and decoded only when its bytes
are not the index's (`watcher.sources.pods_api.snapshot.Digests`).

The answer and the stream race: a change made while ListPods runs may show in the answer before its
event arrives, or arrive before an answer that is already older. So a difference counts as missed
only when no live event touched that pod from the call's start to `catch_up` seconds after its
answer; the rest is the stream at work. What was missed is put in the index and told as a fresh
snapshot's differences are, one warning says how many, and the watch reconnects for a fresh stream.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from watcher import errors
from watcher.model.devicehealth.pods import PodIndex, PodMeta
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.snapshot import Digests, digest

__all__ = ["CATCH_UP", "DEFAULT_RESYNC_INTERVAL", "JITTER", "Listed", "StreamCheck", "listed"]

log = structlog.get_logger("watcher.sources.pods_api.watch")

# A stream that stopped is noticed within minutes, for one ListPods every five (1/30000 of the
# kubelet's shared 100/s).
DEFAULT_RESYNC_INTERVAL = 300.0
JITTER = 0.1  # each period is the interval +-10%, so a fleet's nodes do not list in step
CATCH_UP = 2.0  # seconds a live event may trail ListPods's answer (the broadcaster's lag) and count
YIELD_EVERY = 500  # pods compared between two turns of the event loop
GRPC_MAX = (1 << 31) - 1  # gRPC's receive limit is a signed 32-bit count

# uid -> the pod as ListPods shows it (None: not listed) and its bytes' digest (None: not listed).
Listed = dict[str, tuple[PodMeta | None, bytes | None]]


def _varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(view) and shift < 64:
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise errors.PodDecodeError("a ListPods answer is not protobuf (a varint runs off its end)")


def listed(raw: bytes) -> Iterator[memoryview]:
    """Each pod's bytes in a ListPodsResponse (`repeated bytes pods = 1`), as views of `raw`:
    protobuf's own parse would hold a second copy of a 10,000-pod node's tens of MiB."""
    view, at = memoryview(raw), 0
    while at < len(view):
        tag, at = _varint(view, at)
        wire = tag & 7
        if wire == 0:
            _, at = _varint(view, at)
            continue
        if wire == 2:
            size, at = _varint(view, at)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise errors.PodDecodeError(f"a ListPods answer is not protobuf (wire type {wire})")
        if at + size > len(view):
            raise errors.PodDecodeError("a ListPods answer is not protobuf (a field runs off its end)")
        if tag == (1 << 3 | 2):
            yield view[at : at + size]
        at += size


async def compare(
    raw: bytes, *, index: PodIndex, digests: Digests, decode: Callable[[bytes], PodMeta | None]
) -> Listed:
    """What a ListPods answer says differently from the index: pods whose bytes the index does
    not hold (decoded), and indexed pods it does not list."""
    seen: set[str] = set()
    found: Listed = {}
    for n, pod_bytes in enumerate(listed(raw), 1):
        if n % YIELD_EVERY == 0:
            # 10,000 pods of 4 KiB hash in about 0.1 s: the loop's other work (an event on its
            # way to a sink) gets its turn every few milliseconds. Live events meanwhile touch
            # what they change, which the caller leaves out.
            await asyncio.sleep(0)
        key = digest(pod_bytes)
        uid = digests.uid(key)
        if uid is None:
            pod = decode(bytes(pod_bytes))
            if pod is None:
                continue  # warned by `decode`; left out, as a snapshot leaves it out
            uid = pod.uid
            found[uid] = (pod, key)  # changed, or only its bytes did: `apply` tells them apart
        seen.add(uid)
    for uid in index.uids() - seen:
        found[uid] = (None, None)
    return found


class StreamCheck:
    """The periodic check of one live stream (`run`, cancelled when the stream ends)."""

    def __init__(
        self,
        socket: Path,
        *,
        interval: float,
        timeout: float,
        max_bytes: int,
        catch_up: float = CATCH_UP,
        rng: random.Random | None = None,
    ) -> None:
        self.socket = socket
        self.interval = interval
        self.timeout = timeout
        self.max_bytes = min(max_bytes, GRPC_MAX)
        self.catch_up = catch_up
        self.rng = rng if rng is not None else random.Random()
        self.checks = 0  # ListPods answers compared
        self.missed = 0  # pods found missed, in all
        self.explained = 0  # differences a live event explained (the answer and the stream racing)
        self._touched: set[str] | None = None  # uids live events touched during a check
        self._failed: set[type[BaseException]] = set()  # logged since the last answer

    def touched(self, uid: str) -> None:
        """A live event about `uid` arrived (the watch calls this for each)."""
        if self._touched is not None:
            self._touched.add(uid)

    def period(self) -> float:
        return self.interval * self.rng.uniform(1 - JITTER, 1 + JITTER)

    async def run(
        self,
        *,
        index: PodIndex,
        digests: Digests,
        decode: Callable[[bytes], PodMeta | None],
        apply: Callable[[Listed], int],
        reconnect: Callable[[], None],
    ) -> None:
        """Every period, compare; when `apply` says the stream missed pod changes, `reconnect`."""
        while True:
            await asyncio.sleep(self.period())
            found = await self._found(index=index, digests=digests, decode=decode)
            if not found:  # the same as what is held, or no answer
                continue
            missed = apply(found)
            if missed:
                self.missed += missed
                log.warning(
                    "the Pods API stream missed pod changes that ListPods shows: reported now; "
                    "reconnecting the watch",
                    missed=missed,
                    socket=str(self.socket),
                )
                reconnect()
                return

    async def _found(
        self, *, index: PodIndex, digests: Digests, decode: Callable[[bytes], PodMeta | None]
    ) -> Listed | None:
        """The differences no live event explains (None: ListPods failed, tried next period)."""
        self._touched = set()
        try:
            try:
                raw = await self._list()
                found = await compare(raw, index=index, digests=digests, decode=decode)
            except (errors.KubeletError, errors.PodDecodeError) as err:
                self._failure(err)
                return None
            del raw  # the node's whole answer: not kept through the wait
            self.checks += 1
            self._failed.clear()
            if found:
                await asyncio.sleep(self.catch_up)
            touched = self._touched
        finally:
            self._touched = None
        unexplained = {uid: pod for uid, pod in found.items() if uid not in touched}
        self.explained += len(found) - len(unexplained)
        return unexplained

    async def _list(self) -> bytes:
        async with PodsApiClient(
            str(self.socket), timeout=self.timeout, max_receive_bytes=self.max_bytes
        ) as c:
            return await c.list_raw()

    def _failure(self, err: BaseException) -> None:
        # Once per kind until an answer: a kubelet rate-limiting or refusing ListPods every period
        # says so once. The stream itself is what tells of a kubelet gone.
        if type(err) not in self._failed:
            self._failed.add(type(err))
            log.info(
                "the Pods API stream check could not list the pods; it tries again next period",
                error=str(err),
                socket=str(self.socket),
            )
