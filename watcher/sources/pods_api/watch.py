"""PodsWatch: the agent's one watch of the kubelet's Pods API, kept up until the agent stops.

The stream has no resume: every (re)connect starts with a snapshot (one ADDED per pod, then
INITIAL_SYNC_COMPLETE), and any event may come twice. So the snapshot is buffered, within bounds
(`watcher.sources.pods_api.snapshot`), and only what differs from the index held is reported
(resync=True); a live event is an upsert by uid, and reports something only if the pod differs from
what is held in what a cycle acts on (`watcher.sources.pods_api.changes`: labels and owner alone are
not). While live, a periodic ListPods checks that the stream still delivers
(`watcher.sources.pods_api.resync`). The index is the watch's alone.

States, and what the agent does in each (`on_state` is told of every change, the log once):
off (not started), absent (no socket, or nobody answers on it: the directory is watched and the
watch connects when a socket appears), denied (the socket refuses us: retried on the backoff),
disabled (the kubelet refuses the API with any code: retried on the backoff and at once when the
socket is replaced), initializing (the kubelet's warm-up: retried shortly), syncing (reading a
snapshot), capped (a snapshot went past its bounds: retried on a slow backoff), watching (live).
In every state but watching the agent works from pod-resources alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from pathlib import Path

import structlog

from watcher import errors, heap
from watcher.backoff import Backoff
from watcher.kubelet.identity import FileIdentity, is_replacement, probe_socket
from watcher.kubelet.watching import DirectoryWatches, Subscription
from watcher.sources.pods_api.changes import PodChange
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.resync import CATCH_UP, DEFAULT_RESYNC_INTERVAL, StreamCheck
from watcher.sources.pods_api.snapshot import DEFAULT_MAX_SECONDS, SnapshotBounds
from watcher.sources.pods_api.stream import PodStream
from watcher.supervision import Scope, StoppedError, sleep_or_stop, unless_stopped, wait_any

__all__ = [
    "DEFAULT_RESYNC_INTERVAL",
    "DEFAULT_SNAPSHOT_TIMEOUT",
    "PodChange",
    "PodsWatch",
    "STATES",
    "SnapshotBounds",
]

# The longest the agent's first look waits for the Pods API's first snapshot (milliseconds for a
# node's pods; a kubelet that is not serving it says so at once: absent, disabled, initializing).
FIRST_LOOK_WAIT = 5.0

log = structlog.get_logger("watcher.sources.pods_api.watch")

STATES = ("off", "absent", "denied", "disabled", "initializing", "syncing", "capped", "watching")
_INITIALIZING_CAP = 1.0  # the warm-up lasts seconds: retry within a second, not the backoff's cap
_DROPS_APART = 10.0  # a second drop sooner than this waits out the backoff before reconnecting
_FALLBACK = "the agent works from pod-resources alone"
DEFAULT_SNAPSHOT_TIMEOUT = DEFAULT_MAX_SECONDS  # [pods] snapshot_timeout's default


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
        bounds: SnapshotBounds | None = None,
        resync_interval: float = DEFAULT_RESYNC_INTERVAL,
        catch_up: float = CATCH_UP,
        rng: random.Random | None = None,
    ) -> None:
        self.socket = socket
        # The agent's one directory watch; without one given, this watch runs its own.
        self._own_watches = watches is None
        self.watches = watches if watches is not None else DirectoryWatches(stop=stop, step_ms=10)
        self.backoff = backoff
        self.stop = stop
        self.on_changes = on_changes
        self.on_state = on_state
        self.timeout = timeout
        bounds = bounds if bounds is not None else SnapshotBounds()
        check = (
            StreamCheck(
                socket,
                interval=resync_interval,
                timeout=timeout,
                max_bytes=bounds.bytes,
                catch_up=catch_up,
                rng=rng,
            )
            if resync_interval > 0  # 0: never
            else None
        )
        self.stream = PodStream(
            socket,
            labels=labels,
            timeout=timeout,
            bounds=bounds,
            # Through the attribute: whoever replaces `on_changes` later is told from then on.
            on_changes=lambda changes, resync: self.on_changes(changes, resync),
            check=check,
        )
        self.index = self.stream.index  # one object for the watch's life
        self.decode_warnings = self.stream.decode_warnings
        self.flood_warnings = self.stream.flood_warnings
        self.state = "off"
        self.detail = ""
        self.attempts = 0  # streams tried
        self.connects = 0  # streams the kubelet answered
        self._attempt = 0
        self._capped = 0  # snapshots given up in a row (their own, slower backoff)
        self._last_drop = -_DROPS_APART
        self._troubles: set[type[BaseException]] = set()  # logged since the last "watching"
        self._stable = "off"  # the last state but syncing: what was last logged
        self._tried: FileIdentity | None = None  # the socket the last stream was opened on
        self._drop: tuple[FileIdentity | None] | None = None  # a closed stream's socket, until explained
        self._sub: Subscription | None = None
        self._settled = asyncio.Event()  # a lasting state (neither off nor syncing) was reached

    @property
    def events(self) -> int:
        """Events read, over every stream."""
        return self.stream.events

    async def settled(self) -> None:
        """Until the watch first reached a lasting state (watching, or one saying the API is not
        there) or FIRST_LOOK_WAIT s passed: the agent's first look waits for it, so that what
        changed while no agent ran (its pod replaced, a rolling update) names each pod's uid and
        owner as every later change does."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), FIRST_LOOK_WAIT)

    # -- states --

    def _set_state(self, state: str, detail: str) -> None:
        self.detail = detail
        if state == self.state:
            return
        self.state = state
        if state not in ("off", "syncing"):
            self._settled.set()
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
        elif state == "capped":
            log.warning(f"the Pods API's snapshot went past its bounds; {_FALLBACK} for now", detail=detail)
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
            except errors.SnapshotBoundError as err:
                delay = self._capped_delay()
                self._set_state("capped", f"{err} (next try within {delay:.0f} s)")
                await self._wait_for_socket(within=delay)  # a restarted kubelet is tried at once
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

    def _capped_delay(self) -> float:
        # Half the ceiling at least: a snapshot given up costs up to a bound's worth of reading,
        # so a kubelet that keeps going past one is never re-read back to back.
        retry, self._capped = self.stream.bounds.retry, self._capped + 1
        return (retry.ceiling(self._capped - 1) + retry.delay(self._capped - 1)) / 2

    async def _session(self) -> None:
        """One stream: connect, snapshot, live events, until it ends (always with an exception)."""
        self.attempts += 1
        self._tried = probe_socket(self.socket).identity
        scope = Scope(self.stop)
        guard = asyncio.create_task(self._guard(self._tried, scope))
        try:
            async with PodsApiClient(str(self.socket), timeout=self.timeout) as client:
                await unless_stopped(scope, self._read(client.watch(), scope))
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

    async def _read(self, stream: AsyncGenerator[tuple[int, bytes], None], scope: Scope) -> None:
        def answered() -> None:
            self.connects += 1
            self._drop_explained(answered=True)
            self._set_state("syncing", f"reading the Pods API's snapshot on {self.socket}")

        def synced() -> None:
            heap.settle("the Pods API's snapshot")  # every pod read afresh: watcher.heap
            self._attempt = self._capped = 0
            self._set_state("watching", f"watching the Pods API on {self.socket}")

        await self.stream.read(stream, reconnect=scope.set, answered=answered, synced=synced)
