"""The watch loop: notice every real change on the node at once, report it exactly once.

Data flow: socket/state-file watches and a jittered timer fire a Trigger ->
one re-query (rate-limited) -> raw-bytes fast path -> inventory -> diff ->
events -> sinks -> persisted state. The loop is sequential on purpose: a
cycle's events are delivered before the state moves past them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from watcher import errors
from watcher.backoff import Backoff
from watcher.changes import Change, Kind, Severity
from watcher.client import PodResourcesClient
from watcher.diffing import diff, inventory_summary
from watcher.events import Event, envelope, new_cycle_id
from watcher.inventory import Inventory, build
from watcher.kubeletapi.v1 import api_pb2
from watcher.ratelimit import RateLimiter
from watcher.running import supervise
from watcher.settings import Settings
from watcher.sinks import Sink
from watcher.state import SavedState, load_state, save_state
from watcher.triggers import Trigger
from watcher.watching import DirectoryWatch, FileIdentity, SocketState, probe_socket

__all__ = ["Agent", "AgentStats", "STATE_FILE_NAMES"]

log = structlog.get_logger("watcher.agent")

# Kubelet state files that are rewritten (temp + rename) when the inventory changes.
STATE_FILE_NAMES = ("cpu_manager_state", "memory_manager_state")
CHECKPOINT_NAME = "kubelet_internal_checkpoint"

# What List-only mode cannot see, said in the api.degraded event.
LOST_IN_LIST_ONLY = [
    "device hot-plug, unplug and health changes",
    "free capacity per resource and NUMA node",
    "allocatable CPU and memory changes",
    "devices allocated to pods but failed or vanished",
]


@dataclass
class AgentStats:
    """Counters for tests, the demo and (later) metrics."""

    cycles: int = 0
    queries_ok: int = 0
    queries_failed: int = 0
    rate_limited: int = 0
    fast_path: int = 0
    parsed: int = 0
    reconnects: int = 0
    events: int = 0
    last_success: float | None = None  # time.monotonic()
    last_reconnect_latency: float | None = None  # socket change seen -> first successful query


@dataclass
class _Health:
    failing_since: float | None = None
    last_error: str | None = None
    last_error_kind: str | None = None
    unreachable_reported: bool = False
    attempt: int = 0
    retry_at: float | None = None


class Agent:
    """Runs the watch loop under the supervisor until `stop` is set."""

    def __init__(
        self,
        settings: Settings,
        sinks: Sequence[Sink],
        *,
        stop: asyncio.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.sinks = list(sinks)
        self.stop = stop if stop is not None else asyncio.Event()
        self.rng = rng if rng is not None else random.Random()
        self.socket_path = settings.kubelet.socket
        self.client = PodResourcesClient(
            str(self.socket_path),
            timeout=settings.kubelet.timeout,
            max_receive_bytes=settings.kubelet.max_receive_bytes,
        )
        self.trigger = Trigger()
        # Two RPCs make one re-query: let them go together, hold the sustained rate.
        self.limiter = RateLimiter(settings.watch.max_rpc_rate, burst=2)
        self.rate_backoff = Backoff(base=0.2, cap=10.0, rng=self.rng)
        self.retry_backoff = Backoff(base=0.5, cap=min(10.0, settings.watch.interval), rng=self.rng)
        self.stats = AgentStats()
        self.observers: list[Callable[[Event], None]] = []
        self.cycle_observers: list[Callable[[frozenset[str]], None]] = []
        self.log = log.bind(node=settings.node, socket=str(self.socket_path))

        self.seq = 0
        self.inventory: Inventory | None = None
        self.socket_identity: FileIdentity | None = None
        self._last_raw: tuple[bytes | None, bytes] | None = None
        self._started_reported = False
        self._ever_connected = False
        self._degraded: str | None = None  # why allocatable is unavailable
        self._degraded_reported = False
        self._health = _Health()
        self._next_periodic = 0.0
        self._socket_changed_at: float | None = None
        self._socket_seen: SocketState | None = None
        self._said_not_a_socket: FileIdentity | None = None

    # -- public --

    def subscribe(self, observer: Callable[[Event], None]) -> None:
        """Call `observer` with every event after the sinks took it."""
        self.observers.append(observer)

    def subscribe_cycles(self, observer: Callable[[frozenset[str]], None]) -> None:
        """Call `observer` with the cycle's trigger reasons after every re-query, successful or not."""
        self.cycle_observers.append(observer)

    async def run(self) -> None:
        structlog.contextvars.bind_contextvars(node=self.settings.node)
        saved = load_state(self.settings.state_dir)
        self._restore(saved)
        tasks: dict[str, Callable[[], Any]] = {
            "query-loop": self._query_loop,
            "socket-watch": self._watch_socket,
        }
        if self.settings.watch.state_file_triggers:
            tasks.update(self._state_file_watches())
        self.log.info(
            "watcher starting",
            state_dir=str(self.settings.state_dir),
            seq=self.seq,
            baseline="saved" if self.inventory is not None else "none",
            tasks=sorted(tasks),
        )
        try:
            await supervise(tasks, stop=self.stop, grace=5.0)
        finally:
            await self.client.close()
            for sink in self.sinks:
                await sink.close()
            self.log.info("watcher stopped", seq=self.seq)

    # -- state --

    def _restore(self, saved: SavedState) -> None:
        self.seq = saved.seq
        self.inventory = saved.inventory
        self.socket_identity = saved.socket
        if saved.node is not None and saved.node != self.settings.node:
            self.log.warning(
                "saved state belongs to another node: taking a fresh baseline",
                saved_node=saved.node,
            )
            self.inventory = None
            self.socket_identity = None

    def _save(self) -> None:
        save_state(
            self.settings.state_dir,
            SavedState(
                seq=self.seq, inventory=self.inventory, socket=self.socket_identity, node=self.settings.node
            ),
        )

    # -- watches --

    async def _watch_socket(self) -> None:
        name = self.socket_path.name
        watch = DirectoryWatch(
            self.socket_path.parent,
            lambda n: n == name,
            stop=self.stop,
            force_polling=self.settings.watch.force_polling,
            poll_delay_ms=round(self.settings.watch.poll_interval * 1000),
            name="socket",
        )
        self._socket_seen = probe_socket(self.socket_path)
        async for _ in watch.batches():
            now = probe_socket(self.socket_path)
            before, self._socket_seen = self._socket_seen, now
            if now.identity is not None and not now.is_socket:
                if self._said_not_a_socket != now.identity:
                    self._said_not_a_socket = now.identity
                    self.log.error(
                        "socket path exists but is not a socket; still watching",
                        hint="mount the kubelet's pod-resources DIRECTORY, not the socket file",
                    )
                continue
            if now.present and (before is None or before.identity != now.identity):
                # Appeared or replaced: query at once on a fresh channel.
                self._socket_changed_at = time.monotonic()
                self.trigger.fire("socket", urgent=True)
            elif not now.present and before is not None and before.present:
                self.log.warning("kubelet socket vanished; waiting for it to come back")

    def _state_file_watches(self) -> dict[str, Callable[[], Any]]:
        root = self.settings.kubelet.root_dir
        plan: dict[str, tuple[Path, Callable[[str], bool]]] = {}
        plugins = root / "device-plugins"
        if plugins.is_dir():
            plan["state-watch:device-plugins"] = (
                plugins,
                lambda n: n == CHECKPOINT_NAME or n.endswith(".sock"),
            )
        if any((root / n).exists() for n in STATE_FILE_NAMES):
            plan["state-watch:root"] = (root, lambda n: n in STATE_FILE_NAMES)
        if not plan:
            self.log.info("no kubelet state files found; state-file triggers off", root_dir=str(root))
        tasks: dict[str, Callable[[], Any]] = {}
        for task_name, (directory, match) in plan.items():
            tasks[task_name] = self._make_state_watch(task_name, directory, match)
        return tasks

    def _make_state_watch(
        self, name: str, directory: Path, match: Callable[[str], bool]
    ) -> Callable[[], Any]:
        async def watch_state_files() -> None:
            watch = DirectoryWatch(
                directory,
                match,
                stop=self.stop,
                force_polling=self.settings.watch.force_polling,
                poll_delay_ms=round(self.settings.watch.poll_interval * 1000),
                name=name,
            )
            async for names in watch.batches():
                if names:
                    self.trigger.fire("state-file:" + ",".join(sorted(names)))

        return watch_state_files

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
        return min(deadlines)

    async def _query_loop(self) -> None:
        self.trigger.fire("startup", urgent=True)
        while not self.stop.is_set():
            reasons = await self._next_trigger()
            if self.stop.is_set():
                return
            now = time.monotonic()
            due = bool(reasons) or now >= self._next_periodic
            h = self._health
            if h.retry_at is not None and now >= h.retry_at:
                due = True
            if due:
                await self._cycle(reasons or frozenset({"timer"}))
            elif h.failing_since is not None and not h.unreachable_reported:
                await self._maybe_unreachable(new_cycle_id())

    async def _next_trigger(self) -> frozenset[str]:
        stop_wait = asyncio.ensure_future(self.stop.wait())
        trigger_wait = asyncio.ensure_future(self.trigger.wait(self._wake_at(), self.settings.watch.debounce))
        try:
            await asyncio.wait([stop_wait, trigger_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            if not trigger_wait.done():
                trigger_wait.cancel()
            await asyncio.gather(stop_wait, trigger_wait, return_exceptions=True)
        if trigger_wait.cancelled() or trigger_wait.exception() is not None:
            return frozenset()
        return trigger_wait.result()

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
        try:
            await self._query_cycle(reasons)
        finally:
            self.stats.cycles += 1
            for observer in self.cycle_observers:
                observer(reasons)

    async def _query_cycle(self, reasons: frozenset[str]) -> None:
        cycle = new_cycle_id()
        lifecycle: list[Change] = []
        now = time.monotonic()
        sock = probe_socket(self.socket_path)
        if sock.present and sock.identity != self.socket_identity:
            if self.socket_identity is not None:
                lifecycle.append(self._restarted_change(reasons))
            self.socket_identity = sock.identity
            # A replaced kubelet may have been upgraded: ask for everything again.
            self._degraded = None
            await self.client.reconnect()
            self.stats.reconnects += 1
            self._socket_changed_at = self._socket_changed_at or now

        try:
            alloc_raw, list_raw = await self._query()
        except errors.RateLimitedError:
            self.stats.rate_limited += 1
            h = self._health
            delay = self.rate_backoff.delay(h.attempt)
            h.attempt += 1
            h.retry_at = time.monotonic() + delay
            self.log.warning(
                "kubelet rate-limited us; backing off", attempt=h.attempt, delay_s=round(delay, 3)
            )
            self._schedule_periodic(time.monotonic())
            await self._emit(lifecycle, cycle)
            return
        except errors.KubeletError as err:
            await self._failed(err, lifecycle, cycle)
            return

        # Success.
        self.stats.queries_ok += 1
        done_at = time.monotonic()
        self.stats.last_success = done_at
        if self._socket_changed_at is not None:
            self.stats.last_reconnect_latency = done_at - self._socket_changed_at
            self._socket_changed_at = None
        h = self._health
        if h.unreachable_reported:
            down_for = done_at - (h.failing_since or done_at)
            lifecycle.append(
                Change(
                    Kind.KUBELET_REACHABLE,
                    Severity.INFO,
                    f"kubelet reachable again after {down_for:.1f} s",
                    {"down_seconds": round(down_for, 3), "socket": str(self.socket_path)},
                )
            )
        elif h.failing_since is not None or h.attempt:
            self.log.info("kubelet answering again", after_attempts=h.attempt)
        if self._started_reported and not self._ever_connected:
            lifecycle.append(
                Change(
                    Kind.KUBELET_CONNECTED,
                    Severity.INFO,
                    f"connected to the kubelet at {self.socket_path}",
                    {"socket": str(self.socket_path)},
                )
            )
        self._ever_connected = True
        self._health = _Health()
        self._schedule_periodic(done_at)

        if alloc_raw is not None and self._degraded_reported:
            self._degraded_reported = False
            self.log.info("GetAllocatableResources available again: full inventory restored")
        if self._degraded is not None and alloc_raw is None and not self._degraded_reported:
            lifecycle.append(
                Change(
                    Kind.API_DEGRADED,
                    Severity.WARNING,
                    "GetAllocatableResources unavailable: watching allocations only (List-only mode)",
                    {
                        "method": "GetAllocatableResources",
                        "reason": self._degraded,
                        "lost": LOST_IN_LIST_ONLY,
                    },
                )
            )
            self._degraded_reported = True

        before = self.inventory
        changes: tuple[Change, ...] = ()
        raw = (alloc_raw, list_raw)
        if raw == self._last_raw and before is not None:
            self.stats.fast_path += 1
            after = before
        else:
            self.stats.parsed += 1
            after = build(
                api_pb2.AllocatableResourcesResponse.FromString(alloc_raw) if alloc_raw is not None else None,
                api_pb2.ListPodResourcesResponse.FromString(list_raw),
            )
            if before is not None and after.content_hash == before.content_hash:
                after = before  # a reordering, not a change
            elif before is not None:
                changes = diff(before, after)
            self._last_raw = raw
        if not self._started_reported:
            lifecycle.insert(0, self._started_change(after, before, len(changes)))
        self.inventory = after
        await self._emit([*lifecycle, *changes], cycle, before, after)

    def _restarted_change(self, reasons: frozenset[str]) -> Change:
        return Change(
            Kind.KUBELET_RESTARTED,
            Severity.INFO,
            f"kubelet restarted: socket {self.socket_path} was replaced",
            {
                "socket": str(self.socket_path),
                "seen_by": "directory watch" if "socket" in reasons else "identity check",
            },
        )

    def _started_change(self, inv: Inventory | None, saved: Inventory | None, changed: int) -> Change:
        self._started_reported = True
        summary = inventory_summary(inv) if inv is not None else None
        details: dict[str, Any] = {
            "baseline": "saved" if saved is not None else "fresh",
            "changes_since_last_run": changed,
            "kubelet": {"reachable": inv is not None, "error": self._health.last_error},
            "inventory": summary,
        }
        if summary is not None:
            text = f"watching {summary['pods']} pods, " + ", ".join(
                f"{n} {res}" for res, n in summary["devices"].items()
            )
        else:
            text = f"watcher started; kubelet not reachable yet ({self._health.last_error})"
        return Change(Kind.WATCHER_STARTED, Severity.INFO, text.rstrip(", "), details)

    async def _failed(self, err: errors.KubeletError, lifecycle: list[Change], cycle: str) -> None:
        self.stats.queries_failed += 1
        h = self._health
        now = time.monotonic()
        first = h.failing_since is None
        if first:
            h.failing_since = now
        if first or type(err).__name__ != h.last_error_kind:
            self.log.warning(
                "kubelet query failed; will retry", error=str(err), error_kind=type(err).__name__
            )
        h.last_error = str(err)
        h.last_error_kind = type(err).__name__
        delay = self.retry_backoff.delay(h.attempt)
        h.attempt += 1
        h.retry_at = now + delay
        self._schedule_periodic(now)
        if isinstance(err, errors.KubeletUnavailableError | errors.DeadlineExceededError):
            # The channel may be wedged on a dead peer; dial afresh next time.
            await self.client.reconnect()
        if not self._started_reported:
            lifecycle.insert(0, self._started_change(None, self.inventory, 0))
        await self._emit(lifecycle, cycle)
        await self._maybe_unreachable(cycle)

    async def _maybe_unreachable(self, cycle: str) -> None:
        h = self._health
        if h.failing_since is None or h.unreachable_reported:
            return
        down_for = time.monotonic() - h.failing_since
        if down_for < self.settings.kubelet.unreachable_grace:
            return
        h.unreachable_reported = True
        await self._emit(
            [
                Change(
                    Kind.KUBELET_UNREACHABLE,
                    Severity.CRITICAL,
                    f"kubelet unreachable for {down_for:.0f} s: {h.last_error}",
                    {
                        "socket": str(self.socket_path),
                        "down_seconds": round(down_for, 3),
                        "error": h.last_error,
                    },
                )
            ],
            cycle,
        )

    async def _emit(
        self,
        changes: Sequence[Change],
        cycle: str,
        before: Inventory | None = None,
        after: Inventory | None = None,
    ) -> None:
        if not changes and after is None:
            return
        before_hash = before.content_hash if before is not None else None
        after_hash = (
            after.content_hash
            if after is not None
            else (self.inventory.content_hash if self.inventory else None)
        )
        events = []
        for change in changes:
            self.seq += 1
            events.append(
                envelope(
                    change,
                    seq=self.seq,
                    node=self.settings.node,
                    cycle=cycle,
                    before=before_hash,
                    after=after_hash,
                )
            )
        for sink in self.sinks:
            try:
                await sink.send(events)
            except Exception as err:  # one sink's failure must not stop the others
                self.log.error("sink failed", sink=sink.name, error=repr(err), events=len(events))
        for event in events:
            self.stats.events += 1
            self.log.info(
                "event emitted",
                kind=str(event.kind),
                seq=event.seq,
                severity=str(event.severity),
                summary=event.summary,
            )
            for observer in self.observers:
                observer(event)
        # Only now may the state move past these events.
        self._save()
