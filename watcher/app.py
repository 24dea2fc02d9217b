"""The watch loop: notice every real change on the node at once, report it exactly once.

Data flow: socket/state-file watches and a jittered timer fire a Trigger ->
one re-query (rate-limited) -> raw-bytes fast path -> inventory -> diff ->
events, committed to the outbox in one transaction with the new state ->
sink workers deliver them. A cycle's events are durable before the state
moves past them; delivery never holds up the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog
from google.protobuf.message import DecodeError

from watcher import errors
from watcher.backoff import Backoff
from watcher.cycle.state import SavedState, state_from_json, state_to_json
from watcher.delivery.dispatcher import Dispatcher
from watcher.kubelet.client import PodResourcesClient
from watcher.kubelet.decoding import Decoder, Outcome
from watcher.kubelet.identity import FileIdentity, SocketState, is_replacement, probe_socket
from watcher.kubelet.triggers import Trigger
from watcher.kubelet.watching import DirectoryWatch
from watcher.model import lifecycle
from watcher.model.changes import LIFECYCLE_KINDS, Change, Severity
from watcher.model.diff import diff
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.model.inventory import Inventory
from watcher.ops.http import Health, HttpServer
from watcher.ops.metrics import Metrics
from watcher.ratelimit import RateLimiter
from watcher.settings import Settings, parse_listen
from watcher.sinks.base import Sink
from watcher.sinks.registry import build_sinks
from watcher.store.outbox import OUTBOX_FILE, Outbox, OutboxUnavailableError
from watcher.supervision import sleep_or_stop, supervise

__all__ = ["Agent", "AgentStats", "STATE_FILE_NAMES"]

log = structlog.get_logger("watcher.app")
T = TypeVar("T")

# Kubelet state files that are rewritten (temp + rename) when the inventory changes.
STATE_FILE_NAMES = ("cpu_manager_state", "memory_manager_state")
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
SHUTDOWN_GRACE_S = 5.0


@dataclass
class AgentStats:
    """Counters for tests, the demo and the metrics."""

    cycles: int = 0
    queries_ok: int = 0
    queries_failed: int = 0
    rate_limited: int = 0
    fast_path: int = 0
    parsed: int = 0
    reconnects: int = 0
    events: int = 0
    commit_failures: int = 0
    last_success: float | None = None  # time.monotonic()
    last_reconnect_latency: float | None = None  # socket change seen -> first successful query


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Defer the cyclic garbage collector while an inventory is built and diffed.

    The model makes no reference cycles (frozen records, tuples), so nothing is
    lost by waiting; what is won is the p99: a full collection landing in the
    middle of a large node's thousands of fresh objects doubled a cycle's time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Generation:
    """Stops the watches of one configuration: set by the agent's stop, or retired by a reload."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._retired = asyncio.Event()

    def is_set(self) -> bool:
        return self._stop.is_set() or self._retired.is_set()

    def retire(self) -> None:
        self._retired.set()

    # watchfiles sets its stop event when a watch is cancelled: that retires this one.
    set = retire

    async def wait(self) -> bool:
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._retired.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return True


@dataclass
class _Health:
    failing_since: float | None = None
    last_error: str | None = None
    last_error_kind: str | None = None
    unreachable_reported: bool = False
    attempt: int = 0
    retry_at: float | None = None


class Agent:
    """Runs the watch loop and the sinks' workers under one supervisor until `stop` is set."""

    def __init__(
        self,
        settings: Settings,
        *,
        sinks: Sequence[Sink] | None = None,
        stop: asyncio.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.stop = stop if stop is not None else asyncio.Event()
        self.rng = rng if rng is not None else random.Random()
        self.socket_path = settings.kubelet.socket
        self.outbox = Outbox(settings.state_dir / OUTBOX_FILE)
        sinks = (
            list(sinks)
            if sinks is not None
            else build_sinks(
                settings.sinks, node=settings.node, state_dir=settings.state_dir, store=self.outbox
            )
        )
        self.dispatcher = Dispatcher(self.outbox, sinks, stop=self.stop, rng=self.rng)
        self.client = PodResourcesClient(
            str(self.socket_path),
            timeout=settings.kubelet.timeout,
            max_receive_bytes=settings.kubelet.max_receive_bytes,
        )
        self.trigger = Trigger()
        self.limiter = RateLimiter(settings.watch.max_rpc_rate)
        self.rate_backoff = Backoff(base=0.2, cap=10.0, rng=self.rng)
        self.retry_backoff = Backoff(base=0.5, cap=min(10.0, settings.watch.interval), rng=self.rng)
        self.stats = AgentStats()
        self.observers: list[Callable[[Event], None]] = []
        self.cycle_observers: list[Callable[[frozenset[str]], None]] = []
        self.log = log.bind(socket=str(self.socket_path))

        self.seq = 0
        self.inventory: Inventory | None = None
        self.socket_identity: FileIdentity | None = None
        self.decoder = Decoder()
        self._commit_error: str | None = None  # the last failure to store events and state
        self._commit_failures = 0  # in a row, for the retry backoff
        self.outbox_ready = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._open_error: str | None = None  # why the outbox could not be opened, until it is
        self.dispatcher.on_outbox_error = self._outbox_trouble
        self._started_reported = False
        self._ever_connected = False
        self._degraded: str | None = None  # why GetAllocatableResources is unavailable
        self._degraded_reported: set[str] = set()
        self._health = _Health()
        self._next_periodic = 0.0
        self._socket_changed_at: float | None = None
        self._socket_seen: SocketState | None = None
        self._name_events = False  # the directory said the socket's name was replaced
        self._said_not_a_socket: FileIdentity | None = None
        self._watch_generation = _Generation(self.stop)
        # Held by a re-query and by a reload's client swap: a reload never closes a channel
        # under a call in flight.
        self._cycle_lock = asyncio.Lock()
        self._supervised: dict[str, asyncio.Task[None]] = {}
        self._last_snapshot = time.monotonic()
        self._cycle_result = "failed"
        self._uncommitted: tuple[Any, ...] = ()
        self.metrics = Metrics()
        self.http: HttpServer | None = None
        self.dispatcher.observers.append(self._on_delivery)

    # -- public --

    def subscribe(self, observer: Callable[[Event], None]) -> None:
        """Call `observer` with every event once it is durably queued."""
        self.observers.append(observer)

    def subscribe_cycles(self, observer: Callable[[frozenset[str]], None]) -> None:
        """Call `observer` with the cycle's trigger reasons after every re-query, successful or not."""
        self.cycle_observers.append(observer)

    async def run(self) -> None:
        structlog.contextvars.bind_contextvars(node=self.settings.node)
        try:
            tasks: dict[str, Callable[[], Awaitable[None]]] = {
                "query-loop": self._query_loop,
                "socket-watch": self._watch_socket,
                "state-watch": self._watch_state_files,
                "delivery": self._deliver_once_open,
            }
            if not await self._open_outbox(first=True):
                tasks["outbox-open"] = self._open_outbox_later
            if self.settings.http.enabled:
                host, port = parse_listen(self.settings.http.listen)
                self.http = HttpServer(self, host, port)
                tasks["http"] = self.http.serve(self.stop)
            self.log.info(
                "watcher starting",
                state_dir=str(self.settings.state_dir),
                seq=self.seq,
                baseline="saved" if self.inventory is not None else "none",
                sinks=sorted(self.dispatcher.workers),
                tasks=sorted(tasks),
            )
            await supervise(tasks, stop=self.stop, grace=SHUTDOWN_GRACE_S, on_start=self._supervised.update)
        finally:
            for close in (self.client.close, self.dispatcher.close, self.outbox.close):
                try:
                    await close()
                except Exception as err:  # one failing close must not skip the others
                    self.log.error("error while shutting down", error=repr(err))
            self.log.info("watcher stopped", seq=self.seq)

    # -- the outbox: events and state --

    async def _open_outbox(self, *, first: bool = False) -> bool:
        """Open the outbox and restore the saved state; False (said loudly) if the disk refuses."""
        # Under the cycle lock: no cycle may commit to a database whose saved state has not
        # been read back yet, nor diff from a baseline that is being replaced.
        async with self._cycle_lock:
            return await self._open_outbox_locked(first=first)

    async def _open_outbox_locked(self, *, first: bool) -> bool:
        try:
            await self.outbox.open()
            await self.outbox.register(self.dispatcher.workers)
            saved = await self._stored_state()
        except Exception as err:  # sqlite3.Error, OSError: full, read-only, missing
            with contextlib.suppress(Exception):
                await self.outbox.disconnect()  # half open: start clean next time
            self._storage_failed(err)
            self._open_error = self._commit_error
            if first:
                self.log.error(
                    "cannot open the outbox: watching anyway, but nothing is emitted until it can be "
                    "written; retrying (check the state directory: full, read-only, wrong owner?)",
                    state_dir=str(self.settings.state_dir),
                    error=repr(err),
                )
            return False
        self._restore(saved)
        if not first:
            self.log.info("outbox open: events flow again", state_dir=str(self.settings.state_dir))
            self._storage_ok()
            self.trigger.fire("outbox", urgent=True)
        self.outbox_ready.set()
        return True

    def _storage_failed(self, err: BaseException) -> None:
        self._commit_error = f"{type(err).__name__}: {err}"
        self.metrics.state_writable.set(0)

    def _storage_ok(self) -> None:
        self._commit_error = None
        self._commit_failures = 0
        self.metrics.state_writable.set(1)

    async def _stored_state(self) -> SavedState:
        """The state the outbox holds, as of its last commit."""
        saved, max_seq = await self.outbox.load_state(), await self.outbox.max_seq()
        return state_from_json(saved, min_seq=max_seq, lost=self.outbox.recovered_from_corruption)

    async def _database_is_ahead(self) -> bool:
        """After a reopen: did a commit that reported failure reach the disk after all (an
        fsync error, a remount)? Then continue from what the database holds: the events it
        stored are delivered from there, and numbering them again would lose later ones."""
        saved = await self._stored_state()
        if saved.seq <= self.seq:
            return False
        self.log.warning(
            "the outbox holds events from a commit reported as failed: continuing from them",
            stored_seq=saved.seq,
            seq=self.seq,
        )
        self._restore(saved)
        self._storage_ok()
        self.dispatcher.notify()
        self.trigger.fire("outbox", urgent=True)  # diff the current answer against it
        return True

    def _outbox_trouble(self, err: Exception) -> None:
        """A sink worker could not use the outbox. On a quiet node no commit would find out:
        say so, and make the next cycle reopen it (a commit with nothing new, if need be)."""
        if self._commit_error is not None or not self.outbox_ready.is_set():
            return
        self._storage_failed(err)
        self.log.error(
            "the outbox failed under a sink: reopening it at the next cycle",
            state_dir=str(self.settings.state_dir),
            error=repr(err),
        )
        self.trigger.fire("outbox")

    async def _open_outbox_later(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            await sleep_or_stop(self.stop, self.retry_backoff.delay(attempt))
            attempt += 1
            if not self.stop.is_set() and await self._open_outbox():
                break
        await self.stop.wait()  # a supervised task ends with the agent

    async def _deliver_once_open(self) -> None:
        # The sinks read their queues from the outbox: nothing to do before it is open.
        ready, stop = asyncio.ensure_future(self.outbox_ready.wait()), asyncio.ensure_future(self.stop.wait())
        await asyncio.wait((ready, stop), return_when=asyncio.FIRST_COMPLETED)
        for waiter in (ready, stop):
            waiter.cancel()
        await asyncio.gather(ready, stop, return_exceptions=True)
        if not self.stop.is_set():
            await self.dispatcher.run()

    # -- status (the HTTP endpoints) --

    def liveness(self) -> Health:
        dead = sorted(name for name, task in self._supervised.items() if task.done())
        details: dict[str, Any] = {
            "tasks": {n: ("done" if t.done() else "running") for n, t in self._supervised.items()}
        }
        if dead:
            return Health(False, f"supervised task(s) ended: {', '.join(dead)}", details)
        return Health(True, "event loop responsive, all tasks alive", details)

    def readiness(self) -> Health:
        h = self._health
        last = self.stats.last_success
        age = None if last is None else time.monotonic() - last
        details: dict[str, Any] = {
            "kubelet_reachable": self._ever_connected and h.failing_since is None,
            "last_success_age_s": None if age is None else round(age, 3),
            "seq": self.seq,
        }
        if self._commit_error is not None:
            where = self.settings.state_dir
            return Health(False, f"cannot store events and state in {where}: {self._commit_error}", details)
        if age is None:
            return Health(
                False, f"the kubelet has not answered yet ({h.last_error or 'no query yet'})", details
            )
        if h.failing_since is not None:
            return Health(False, f"the kubelet is not answering: {h.last_error}", details)
        if age > self.settings.http.ready_stale_after:
            return Health(False, f"the last successful re-query is {age:.0f} s old", details)
        return Health(True, "kubelet reachable, inventory fresh", details)

    def inventory_document(self) -> dict[str, Any] | None:
        inv = self.inventory
        if inv is None:
            return None
        return {
            "node": self.settings.node,
            "seq": self.seq,
            "hash": inv.content_hash,
            "inventory": inv.canonical,
            "derived": inv.derived(),
        }

    async def metrics_text(self) -> bytes:
        names = list(self.dispatcher.workers)  # a reload may change the dict while we await
        try:
            self.metrics.set_outbox({name: await self.outbox.stats(name) for name in names})
        except Exception as err:  # a failing state directory: /metrics must still say so
            self.log.debug("outbox figures unavailable", error=repr(err))
        return self.metrics.render()

    def _on_delivery(self, sink: str, result: str, events: Sequence[Event], _: float) -> None:
        self.metrics.deliveries.labels(sink, result).inc(len(events))
        if result == "delivered":
            now = datetime.now(UTC)
            for event in events:
                created = datetime.fromisoformat(event.time.replace("Z", "+00:00"))
                self.metrics.delivery_latency.labels(sink).observe(max(0.0, (now - created).total_seconds()))

    async def reload(self, settings: Settings) -> None:
        """Apply a new configuration: sinks and routes swap without losing queued events; a new
        socket path or kubelet root dir restarts the watches and reconnects."""
        if self.stop.is_set():
            return  # shutting down: nothing would run the new sinks
        async with self._reload_lock:  # two quick SIGHUPs apply one after the other
            await self._reload(settings)

    async def _reload(self, settings: Settings) -> None:
        old = self.settings
        if settings.state_dir != old.state_dir:
            self.log.warning(
                "state_dir changes need a restart; keeping the old one", state_dir=str(old.state_dir)
            )
            settings = dataclasses.replace(settings, state_dir=old.state_dir)
        if settings.node != old.node:
            self.log.warning("the node name changes only on restart; keeping it", node=old.node)
            settings = dataclasses.replace(settings, node=old.node)
        sinks = build_sinks(
            settings.sinks, node=settings.node, state_dir=settings.state_dir, store=self.outbox
        )
        self.settings = settings
        try:
            changed = await self.dispatcher.reload(sinks)
        finally:
            # The kubelet side applies whatever happened to the sinks.
            if settings.kubelet != old.kubelet or settings.watch != old.watch:
                async with self._cycle_lock:
                    await self._swap_client(settings, old)
        self.log.info("configuration reloaded", sinks_changed=changed, socket=str(self.socket_path))

    async def _swap_client(self, settings: Settings, old: Settings) -> None:
        await self.client.close()
        self.socket_path = settings.kubelet.socket
        self.client = PodResourcesClient(
            str(self.socket_path),
            timeout=settings.kubelet.timeout,
            max_receive_bytes=settings.kubelet.max_receive_bytes,
        )
        self.limiter = RateLimiter(settings.watch.max_rpc_rate)
        if settings.kubelet.socket != old.kubelet.socket:
            self.socket_identity = None  # another socket: a first sighting, not a restart
            self._socket_seen = None
        self._watch_generation.retire()
        self._watch_generation = _Generation(self.stop)
        self.trigger.fire("reload", urgent=True)

    # -- state --

    def _restore(self, saved: SavedState) -> None:
        self.seq = saved.seq
        self.inventory = saved.inventory
        self.socket_identity = saved.socket
        if saved.node is not None and saved.node != self.settings.node:
            self.log.warning(
                "saved state belongs to another node: taking a fresh baseline", saved_node=saved.node
            )
            self.inventory = None
            self.socket_identity = None

    def _state(self, seq: int, inventory: Inventory | None) -> SavedState:
        return SavedState(seq=seq, inventory=inventory, socket=self.socket_identity, node=self.settings.node)

    # -- watches --

    def _directory_watch(
        self, directory: Path, match: Callable[[str], bool], name: str, generation: _Generation
    ) -> DirectoryWatch:
        w = self.settings.watch
        return DirectoryWatch(
            directory,
            match,
            stop=generation,
            force_polling=w.force_polling,
            poll_delay_ms=round(w.poll_interval * 1000),
            # Ticks re-check the socket's identity; never more often than polling would.
            tick_s=max(1.0, w.poll_interval),
            name=name,
        )

    async def _watch_socket(self) -> None:
        while not self.stop.is_set():
            generation = self._watch_generation
            await self._watch_socket_once(generation)

    async def _watch_socket_once(self, generation: _Generation) -> None:
        path = self.socket_path
        name = path.name
        watch = self._directory_watch(path.parent, lambda n: n == name, "socket", generation)
        self._socket_seen = probe_socket(path)
        async for batch in watch.batches():
            if batch.get(name, set()) & {"added", "deleted"}:
                self._name_events = True
            now = probe_socket(path)
            before, self._socket_seen = self._socket_seen, now
            if now.identity is not None and not now.is_socket:
                if self._said_not_a_socket != now.identity:
                    self._said_not_a_socket = now.identity
                    self.log.error(
                        "socket path exists but is not a socket; still watching",
                        hint="mount the kubelet's pod-resources DIRECTORY, not the socket file",
                    )
                continue
            if not now.present:
                if before is not None and before.present:
                    self.log.warning("kubelet socket vanished; waiting for it to come back")
                continue
            assert now.identity is not None
            known = before.identity if before is not None and before.present else None
            if known is None or is_replacement(known, now.identity, name_events=self._name_events):
                # Appeared or replaced: query at once on a fresh channel.
                self._socket_changed_at = time.monotonic()
                self.trigger.fire("socket", urgent=True)

    async def _watch_state_files(self) -> None:
        """Re-query when the kubelet's checkpoint, CPU/memory state or plugin sockets change.

        Both directories are waited for if the kubelet has not created them yet.
        """
        while not self.stop.is_set():
            generation = self._watch_generation
            if not self.settings.watch.state_file_triggers:
                await generation.wait()
                continue
            root = self.settings.kubelet.root_dir
            plan = [
                (
                    root / "device-plugins",
                    lambda n: n == CHECKPOINT_NAME or n.endswith(".sock"),
                    "device-plugins",
                ),
                (root, lambda n: n in STATE_FILE_NAMES, "kubelet-root"),
            ]
            await asyncio.gather(*(self._watch_dir(d, m, n, generation) for d, m, n in plan))

    async def _watch_dir(
        self, directory: Path, match: Callable[[str], bool], name: str, generation: _Generation
    ) -> None:
        async for batch in self._directory_watch(directory, match, name, generation).batches():
            if batch:
                self.trigger.fire("state-file:" + ",".join(sorted(batch)))

    # -- the loop --

    def _schedule_periodic(self, now: float) -> None:
        w = self.settings.watch
        self._next_periodic = now + w.interval * (1 + self.rng.uniform(-w.jitter, w.jitter))

    def _wake_at(self) -> float:
        deadlines = [self._next_periodic]
        h = self._health
        if h.retry_at is not None:
            deadlines.append(h.retry_at)
        if h.failing_since is not None and not h.unreachable_reported:
            deadlines.append(h.failing_since + self.settings.kubelet.unreachable_grace)
        if self.settings.watch.snapshot_interval > 0:
            deadlines.append(self._last_snapshot + self.settings.watch.snapshot_interval)
        return min(deadlines)

    async def _until_stopped(self, work: Awaitable[T]) -> asyncio.Future[T] | None:
        """Run `work` unless `stop` comes first (then cancel it and return None): a hung call
        never holds up shutdown. A crash in `work` is re-raised for the supervisor."""
        task = asyncio.ensure_future(work)
        stop_wait = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(stop_wait, return_exceptions=True)
        if task.cancelled():
            await asyncio.gather(task, return_exceptions=True)
            return None
        task.result()
        return task

    async def _query_loop(self) -> None:
        self.trigger.fire("startup", urgent=True)
        while not self.stop.is_set():
            waited = await self._until_stopped(
                self.trigger.wait(self._wake_at(), self.settings.watch.debounce)
            )
            if waited is None:
                return
            reasons = waited.result()
            now = time.monotonic()
            h = self._health
            snapshot_every = self.settings.watch.snapshot_interval
            due = (
                bool(reasons)
                or now >= self._next_periodic
                or (h.retry_at is not None and now >= h.retry_at)
                or (snapshot_every > 0 and now >= self._last_snapshot + snapshot_every)
            )
            if due:
                if await self._until_stopped(self._cycle(reasons or frozenset({"timer"}))) is None:
                    return
            elif h.failing_since is not None and not h.unreachable_reported:
                await self._maybe_unreachable(new_cycle_id())

    async def _query(self) -> tuple[bytes | None, bytes]:
        """One re-query: (allocatable bytes or None in List-only mode, List bytes)."""
        calls = [self.client.list_raw]
        if self._degraded is None:
            calls.append(self.client.allocatable_raw)
        for _ in calls:
            await self.limiter.acquire()
        results = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
        pods, alloc = results[0], results[1] if len(results) > 1 else None
        if isinstance(alloc, errors.MethodDisabledError | errors.MethodNotImplementedError):
            self._degraded = str(alloc)
            alloc = None
        # List's failure says more about the kubelet than the other's: raise it first.
        for result in (pods, alloc):
            if isinstance(result, BaseException):
                raise result
        assert isinstance(pods, bytes)
        assert alloc is None or isinstance(alloc, bytes)
        return alloc, pods

    async def _cycle(self, reasons: frozenset[str]) -> None:
        async with self._cycle_lock:
            await self._locked_cycle(reasons)

    def _markers(self) -> tuple[Any, ...]:
        """What a cycle may move before its commit (the lifecycle bookkeeping)."""
        return (
            self.socket_identity,
            self._name_events,
            dataclasses.replace(self._health),
            set(self._degraded_reported),
            self._ever_connected,
            self._last_snapshot,
        )

    def _restore_markers(self, markers: tuple[Any, ...]) -> None:
        (
            self.socket_identity,
            self._name_events,
            self._health,
            self._degraded_reported,
            self._ever_connected,
            self._last_snapshot,  # a snapshot that was not stored is due again
        ) = markers

    async def _locked_cycle(self, reasons: frozenset[str]) -> None:
        self._uncommitted = self._markers()
        started = time.perf_counter()
        self._cycle_result = "failed"
        try:
            await self._query_cycle(reasons)
        finally:
            self.metrics.requery_duration.observe(time.perf_counter() - started)
            self.metrics.requeries.labels(self._cycle_result).inc()
            self.metrics.kubelet_up.set(1 if self._cycle_result in ("changed", "unchanged") else 0)
            self.stats.cycles += 1
            for observer in self.cycle_observers:
                observer(reasons)

    async def _check_socket_identity(self, reasons: frozenset[str], lifecycle_changes: list[Change]) -> None:
        sock = probe_socket(self.socket_path)
        if not sock.present or sock.identity is None or sock.identity == self.socket_identity:
            return
        name_events, self._name_events = self._name_events, False
        old = self.socket_identity
        self.socket_identity = sock.identity
        if old is not None and not is_replacement(old, sock.identity, name_events=name_events):
            return  # the same socket, its metadata touched (chmod, relabel)
        if old is not None:
            seen_by = "directory watch" if "socket" in reasons else "identity check"
            lifecycle_changes.append(lifecycle.restarted(self.socket_path, seen_by=seen_by))
        # A replaced kubelet may have been upgraded: ask for everything again.
        self._degraded = None
        await self.client.reconnect()
        self.stats.reconnects += 1
        self.metrics.reconnects.inc()
        self._socket_changed_at = self._socket_changed_at or time.monotonic()

    async def _query_cycle(self, reasons: frozenset[str]) -> None:
        cycle = new_cycle_id()
        changes: list[Change] = []
        await self._check_socket_identity(reasons, changes)
        try:
            alloc_raw, list_raw = await self._query()
        except errors.RateLimitedError:
            self._cycle_result = "rate_limited"
            self.stats.rate_limited += 1
            h = self._health
            delay = self.rate_backoff.delay(h.attempt)
            h.attempt += 1
            h.retry_at = time.monotonic() + delay
            self._schedule_periodic(time.monotonic())
            self.log.warning(
                "kubelet rate-limited us; backing off", attempt=h.attempt, delay_s=round(delay, 3)
            )
            await self._emit(changes, cycle, self.inventory)
            return
        except errors.KubeletError as err:
            await self._failed(err, type(err).__name__, changes, cycle)
            return

        before = self.inventory
        try:
            with gc_paused():
                after = self._inventory_from(alloc_raw, list_raw)
                diffs = diff(before, after) if before is not None and after is not before else ()
        except DecodeError as err:
            await self._failed(err, "DecodeError", changes, cycle)
            return
        self._succeeded(changes, alloc_raw)  # lifecycle changes come first
        changes.extend(diffs)
        self._cycle_result = "changed" if after is not before else "unchanged"
        interval = self.settings.watch.snapshot_interval
        now = time.monotonic()
        if interval > 0 and now - self._last_snapshot >= interval:
            self._last_snapshot = now
            changes.append(lifecycle.snapshot(after))
        await self._emit(changes, cycle, after, before=before, baseline=before is None)

    def _inventory_from(self, alloc_raw: bytes | None, list_raw: bytes) -> Inventory:
        before = self.inventory
        after, outcome = self.decoder.decode(alloc_raw, list_raw)
        if outcome is Outcome.SAME_BYTES:
            self.stats.fast_path += 1
        else:
            self.stats.parsed += 1
        if before is not None and after is not before and after.content_hash == before.content_hash:
            # The decoder compares with the last answer it decoded; ours may be older (a
            # restored state, a commit that failed) yet equal.
            return before
        return after

    def _succeeded(self, changes: list[Change], alloc_raw: bytes | None) -> None:
        now = time.monotonic()
        self.metrics.last_success.set(time.time())
        self.stats.queries_ok += 1
        self.stats.last_success = now
        if self._socket_changed_at is not None:
            self.stats.last_reconnect_latency = now - self._socket_changed_at
            self._socket_changed_at = None
        h = self._health
        if h.unreachable_reported:
            changes.append(lifecycle.reachable(self.socket_path, down_for=now - (h.failing_since or now)))
        elif h.failing_since is not None:
            self.log.info("kubelet answering again", after_attempts=h.attempt)
        if self._started_reported and not self._ever_connected:
            changes.append(lifecycle.connected(self.socket_path))
        self._ever_connected = True
        self._health = _Health()
        self._schedule_periodic(now)
        if alloc_raw is not None and "GetAllocatableResources" in self._degraded_reported:
            self._degraded_reported.discard("GetAllocatableResources")
            self.log.info("GetAllocatableResources available again: full inventory restored")
        if (
            self._degraded is not None
            and alloc_raw is None
            and "GetAllocatableResources" not in self._degraded_reported
        ):
            self._degraded_reported.add("GetAllocatableResources")
            changes.append(
                lifecycle.degraded(
                    "GetAllocatableResources", self._degraded, lost=lifecycle.LOST_IN_LIST_ONLY
                )
            )

    async def _failed(self, err: Exception, kind: str, changes: list[Change], cycle: str) -> None:
        self.stats.queries_failed += 1
        h = self._health
        now = time.monotonic()
        if h.failing_since is None:
            h.failing_since = now
        if kind != h.last_error_kind:
            self.log.warning("kubelet query failed; will retry", error=str(err), error_kind=kind)
        h.last_error, h.last_error_kind = str(err), kind
        delay = self.retry_backoff.delay(h.attempt)
        h.attempt += 1
        h.retry_at = now + delay
        self._schedule_periodic(now)
        if isinstance(err, errors.MethodDisabledError | errors.MethodNotImplementedError) and (
            "List" not in self._degraded_reported
        ):
            # Without List the watcher is blind; say so once, keep trying slowly.
            self._degraded_reported.add("List")
            changes.append(
                lifecycle.degraded("List", str(err), lost=["everything"], severity=Severity.CRITICAL)
            )
            h.retry_at = self._next_periodic
        if isinstance(err, errors.KubeletUnavailableError | errors.DeadlineExceededError):
            # The channel may be wedged on a dead peer; dial afresh next time.
            await self.client.reconnect()
        await self._emit(changes, cycle, self.inventory)
        await self._maybe_unreachable(cycle)

    async def _maybe_unreachable(self, cycle: str) -> None:
        h = self._health
        if h.failing_since is None or h.unreachable_reported:
            return
        self._uncommitted = self._markers()
        down_for = time.monotonic() - h.failing_since
        if down_for < self.settings.kubelet.unreachable_grace:
            return
        h.unreachable_reported = True
        change = lifecycle.unreachable(
            self.socket_path, down_for=down_for, error=h.last_error, kind=h.last_error_kind
        )
        await self._emit([change], cycle, self.inventory)

    async def _emit(
        self,
        changes: Sequence[Change],
        cycle: str,
        after: Inventory | None,
        *,
        before: Inventory | None = None,
        baseline: bool = False,
    ) -> None:
        """Commit the changes as events, with the new state, in one outbox transaction.

        Nothing moves (seq, inventory) unless the commit succeeds; a failed
        commit is logged and the next cycle diffs again from the old state.
        """
        changes = list(changes)
        if not self._started_reported:
            started = lifecycle.started(
                after if self._ever_connected else None,
                baseline="fresh" if baseline or self.inventory is None else "saved",
                changes=sum(1 for c in changes if c.kind not in LIFECYCLE_KINDS),
                error=self._health.last_error,
            )
            changes.insert(0, started)
        # After a failed commit, try again even with nothing new: that is how the agent
        # finds out the disk is back (and /readyz, the metrics and the sinks with it).
        state_moves = after is not self.inventory or bool(changes) or self._commit_error is not None
        if not state_moves:
            return
        previous = before if before is not None else self.inventory
        before_hash = previous.content_hash if previous is not None else None
        after_hash = after.content_hash if after is not None else None
        events = [
            envelope(
                c,
                seq=self.seq + i,
                node=self.settings.node,
                cycle=cycle,
                before=before_hash,
                after=after_hash,
            )
            for i, c in enumerate(changes, start=1)
        ]
        seq = self.seq + len(events)
        try:
            if not self.outbox_ready.is_set():
                raise OutboxUnavailableError(f"the outbox could not be opened: {self._open_error}")
            if self._commit_error is not None:
                await self.outbox.reopen()  # the last commit failed: the disk may be back
                if await self._database_is_ahead():
                    return
            await self.outbox.commit(
                events, self.dispatcher.queues(events), state_to_json(self._state(seq, after))
            )
        except Exception as err:  # disk full, read-only, corrupt: never crash, never advance
            self.log.error(
                "could not commit events and state; will retry next cycle (check the state directory)",
                state_dir=str(self.settings.state_dir),
                error=repr(err),
            )
            self._storage_failed(err)
            self.metrics.commit_failures.inc()
            self.stats.commit_failures += 1
            # The lifecycle events (restarted, unreachable, ...) must come again next time.
            self._restore_markers(self._uncommitted)
            # Its own count: the markers just put back the kubelet's, which is 0 here.
            self._health.retry_at = time.monotonic() + self.retry_backoff.delay(self._commit_failures)
            self._commit_failures += 1
            return
        self.seq = seq
        if self._commit_error is not None:
            self.log.info("events and state stored again", state_dir=str(self.settings.state_dir))
        self._storage_ok()
        if after is not None and after is not self.inventory:
            self.metrics.set_inventory(after)
        self.inventory = after
        self._started_reported = True
        self.dispatcher.notify()
        await self.dispatcher.enforce_caps()  # logs, never raises: the events are stored already
        for event in events:
            self.stats.events += 1
            self.metrics.events.labels(str(event.kind)).inc()
            self.log.info(
                "event",
                kind=str(event.kind),
                seq=event.seq,
                severity=str(event.severity),
                summary=event.summary,
            )
            for observer in self.observers:
                observer(event)
