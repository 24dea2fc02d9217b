"""The reactor: one re-query, from a trigger to stored events.

trigger -> the socket's identity checked -> both RPCs (rate-limited) -> the decoder's fast path ->
inventory -> diff -> the kubelet's health machine -> the committer. A cycle works on a copy of the
committed `CycleState` and hands the copy to the committer; nothing is restored by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import structlog
from google.protobuf.message import DecodeError

from watcher import errors
from watcher.backoff import Backoff
from watcher.cycle.answers import gc_paused, inventory_from_answers
from watcher.cycle.asking import Replaced, query_answers, unless_replaced
from watcher.cycle.committer import Committer
from watcher.cycle.findings import conclude, eviction_wait, flap_rule, restarted, settle
from watcher.cycle.notifier import Notifier
from watcher.cycle.state import CycleState
from watcher.kubelet.client import PodResourcesClient
from watcher.kubelet.decoding import Decoder
from watcher.kubelet.health import ALLOCATABLE
from watcher.kubelet.identity import is_replacement, probe_socket, replaced_since
from watcher.model import lifecycle
from watcher.model.changes import Change
from watcher.model.events import new_cycle_id
from watcher.model.inventory import Inventory
from watcher.ops.metrics import Metrics
from watcher.ratelimit import RateLimiter
from watcher.settings import Settings
from watcher.sources.base import Source, merged
from watcher.sources.pods_api.reads import PodAnswers, PodKey, PodReads
from watcher.sources.pods_api.source import PodsApiSource
from watcher.supervision import StoppedError, unless_stopped

__all__ = ["Reactor", "CycleObserver"]

log = structlog.get_logger("watcher.cycle.reactor")

CycleObserver = Callable[[frozenset[str]], None]


def _client(settings: Settings) -> PodResourcesClient:
    k = settings.kubelet
    return PodResourcesClient(str(k.socket), timeout=k.timeout, max_receive_bytes=k.max_receive_bytes)


class Reactor:
    def __init__(
        self,
        settings: Settings,
        *,
        notifier: Notifier,
        committer: Committer,
        metrics: Metrics,
        rate_backoff: Backoff,
        retry_backoff: Backoff,
        stop: asyncio.Event,
        sources: Sequence[Source] = (),
    ) -> None:
        self.settings = settings
        self.notifier = notifier
        self.committer = committer
        self.metrics = metrics
        self.rate_backoff = rate_backoff
        self.retry_backoff = retry_backoff
        self.stop = stop
        self.client = _client(settings)
        self.limiter = RateLimiter(settings.watch.max_rpc_rate)
        self.decoder = Decoder()
        # What the agent reads besides pod-resources: each hands every cycle its evidence.
        self.sources = tuple(sources)
        # The Pods API's reads change how a cycle asks the kubelet (Get for the pods it named).
        self.pods_api = next((s for s in self.sources if isinstance(s, PodsApiSource)), None)
        self.pod_reads = self.pods_api.reads if self.pods_api is not None else PodReads(notifier.trigger)
        self.list_only: str | None = None  # why GetAllocatableResources is unavailable
        self.last_success: float | None = None  # monotonic
        self.last_reconnect_latency: float | None = None  # socket change seen -> first answer
        self.observers: list[CycleObserver] = []
        # Held by a re-query, the outbox's opening and a reload's client swap: a reload never
        # closes a channel under a call in flight, and no cycle commits to a half-open outbox.
        self.lock = asyncio.Lock()

    @property
    def socket_path(self) -> Path:
        return self.settings.kubelet.socket

    @property
    def log(self) -> structlog.stdlib.BoundLogger:
        return log.bind(socket=str(self.socket_path))  # type: ignore[no-any-return]

    # -- the loop --

    async def run(self) -> None:
        """Wait for a trigger or a deadline, re-query when one is due, until the stop flag."""
        with contextlib.suppress(StoppedError):
            for source in self.sources:  # e.g. the first look names pods' owners when the API can
                await unless_stopped(self.stop, source.first_look())
            self.notifier.trigger.fire("startup", urgent=True)
            while not self.stop.is_set():
                wait = self.notifier.trigger.wait(self._wake_at(), self.settings.watch.debounce)
                reasons = await unless_stopped(self.stop, wait)
                if self._due(reasons, time.monotonic()):
                    await unless_stopped(self.stop, self.requery(reasons or frozenset({"timer"})))
                elif self.committer.state.health.unreachable_at(self._grace) is not None:
                    async with self.lock:
                        await self._maybe_unreachable(new_cycle_id())

    def _settle_look(self, state: CycleState) -> float | None:
        # Settling looks again only while the kubelet answers: a down one is retried on the failure
        # backoff, and polls at a dead socket would spend the RPC budget its replacement's re-query needs.
        if state.health.failing:
            return None
        return state.settling.next_look(self.settings.kubelet.warmup_grace)

    @property
    def _unknown_grace(self) -> float:
        return self.settings.pods.health_unknown_grace

    @property
    def _grace(self) -> float:
        return self.settings.kubelet.unreachable_grace

    def _requery_deadlines(self) -> list[float]:
        """The moments a re-query falls due without a trigger: the one list both the wait and the
        check after it read, so the two cannot drift apart."""
        state = self.committer.state
        deadlines = [self.notifier.next_periodic]
        if state.health.retry_at is not None:
            deadlines.append(state.health.retry_at)
        if self.settings.watch.snapshot_interval > 0:
            deadlines.append(state.last_snapshot + self.settings.watch.snapshot_interval)
        if (look := self._settle_look(state)) is not None:
            deadlines.append(look)
        if (quiet := state.flaps.next_look(flap_rule(self.settings))) is not None:
            deadlines.append(quiet)
        if (due := state.evictions.next_look(eviction_wait(self.settings))) is not None:
            deadlines.append(due)  # an eviction told, its taint read or not
        if (due := state.resets.next_look(self.settings.watch.reset_hold_down)) is not None:
            deadlines.append(due)  # a heal held after a plugin's reset
        # An Unknown is timed only while the Pod status is read; an unheld story always.
        live = self.pods_api is not None and self.pods_api.live
        health, unheld = state.device_health, self.settings.pods.unheld_grace
        ends = state.rejections.next_look(self.settings.pods.rejections_window)
        if live and ends is not None:  # a rejecting node's incident ends when its window passes
            deadlines.append(ends)
        if (look := health.next_look(self._unknown_grace, unheld, verdicts=live)) is not None:
            deadlines.append(look)
        if self.notifier.follow_ups and not state.health.failing:  # a down kubelet: its backoff
            deadlines.append(self.notifier.follow_ups[0])
        return deadlines

    def _wake_at(self) -> float:
        # The unreachable report's moment wakes the loop too: to report the outage (see run), not re-query.
        wake = min(self._requery_deadlines())
        if (due := self.committer.state.health.unreachable_at(self._grace)) is not None:
            wake = min(wake, due)
        return wake

    def _due(self, reasons: frozenset[str], now: float) -> bool:
        return bool(reasons) or any(now >= deadline for deadline in self._requery_deadlines())

    async def requery(self, reasons: frozenset[str]) -> None:
        """One complete re-query, committed (or its failure recorded) before it returns."""
        async with self.lock:
            started = time.perf_counter()
            # This look serves every follow-up already due (see PLUGIN_FOLLOW_UPS).
            now = time.monotonic()
            self.notifier.follow_ups = [t for t in self.notifier.follow_ups if t > now]
            result = "failed"
            try:
                # The result is known before the commit: a commit cut short (at shutdown) does
                # not turn an answered re-query into a failed one.
                result, commit = await self._cycle(reasons)
                await commit()
            finally:
                self.metrics.requery_duration.observe(time.perf_counter() - started)
                self.metrics.requeries.labels(result).inc()
                if result != "superseded":  # a dropped answer says nothing of the kubelet
                    self.metrics.kubelet_up.set(1 if result in ("changed", "unchanged") else 0)
                    for observer in self.observers:
                        observer(reasons)

    async def swap_client(self, settings: Settings) -> None:
        """A reload changed the kubelet or watch settings: dial afresh (under the cycle lock)."""
        async with self.lock:
            await self.client.close()
            old = self.settings
            self.settings = settings
            self.client = _client(settings)
            self.limiter = RateLimiter(settings.watch.max_rpc_rate)
            if settings.kubelet.socket != old.kubelet.socket:
                # Another socket: a first sighting, not a restart.
                self.committer.state = dataclasses.replace(self.committer.state, socket=None)
            self.notifier.reconfigure(settings)

    # -- one cycle --

    async def _ask(
        self, reads: Mapping[PodKey, bool] | None
    ) -> tuple[PodAnswers | None, bytes | None, bytes | None]:
        """The pods the Pods API named, read alone (`reads`); or, if not or if that fails, List (and
        GetAllocatableResources): (read pods, allocatable bytes, List bytes)."""
        read = await self.pod_reads.read(self.client, self.limiter, reads) if reads is not None else None
        if read is not None:
            return read, None, None
        alloc_raw, list_raw = await self._query()
        return None, alloc_raw, list_raw

    async def _query(self) -> tuple[bytes | None, bytes]:
        """(allocatable bytes or None in List-only mode, List bytes)."""
        asked = self.list_only is None
        alloc, pods, not_served = await query_answers(self.client, self.limiter, with_allocatable=asked)
        self.list_only = not_served or self.list_only
        return alloc, pods

    async def _cycle(self, reasons: frozenset[str]) -> tuple[str, Callable[[], Awaitable[None]]]:
        """Query and compare: the cycle's result, and the step that commits what it found."""
        cycle = new_cycle_id()
        state = self.committer.state
        changes: list[Change] = []
        draft, took_name_events, was_restarted = await self._check_socket_identity(reasons, state, changes)
        commit = functools.partial(self._commit, changes, cycle, took_name_events=took_name_events)
        before = state.inventory
        if was_restarted:
            draft = dataclasses.replace(draft, settling=restarted(draft.settling, before))
        usable = before is not None and not was_restarted and not draft.health.failing
        reads = self.pod_reads.serve(reasons, usable=usable and not draft.settling.holding)
        replaced = functools.partial(self.notifier.until_replaced, draft.socket)
        try:
            asked = await unless_replaced(self._ask(reads), replaced)
            if isinstance(asked, Replaced) or (
                not was_restarted and replaced_since(draft.socket, self.socket_path)
            ):
                # Replaced while we asked (probed absent or old): the answer may be the new kubelet's
                # warm-up with its restart unseen. Drop it; the next cycle sees the restart first.
                self.notifier.trigger.fire("replaced-while-asking", urgent=True)
                return "superseded", functools.partial(commit, draft)
            read, alloc_raw, list_raw = asked
        except errors.RateLimitedError:
            now = time.monotonic()
            delay = self.rate_backoff.delay(draft.health.attempt)
            draft = dataclasses.replace(draft, health=draft.health.rate_limited(now, delay))
            self.notifier.schedule_periodic(now)
            self.log.warning(
                "kubelet rate-limited us; backing off", attempt=draft.health.attempt, delay_s=round(delay, 3)
            )
            return "rate_limited", functools.partial(commit, draft)
        except errors.ResponseTooLargeError as err:  # answered: no outage, so no kubelet.unreachable
            return "too_large", functools.partial(commit, self._too_large(err, draft, changes))
        except errors.KubeletError as err:
            failed = await self._failed(err, type(err).__name__, draft, changes)
            return "failed", functools.partial(self._commit_failure, commit, failed, cycle)

        repaired: list[str] = []
        with gc_paused():
            if read is not None:
                assert before is not None
                answer, list_only = before.with_pods(read), self.list_only is not None
            else:
                assert list_raw is not None
                list_only = alloc_raw is None
                try:
                    answer, repaired = inventory_from_answers(self.decoder, before, alloc_raw, list_raw)
                except DecodeError as err:
                    failed = await self._failed(err, "DecodeError", draft, changes)
                    return "failed", functools.partial(self._commit_failure, commit, failed, cycle)
                # The answers are decoded: their bytes (the largest thing a cycle holds) go now,
                # not when the cycle ends, so they are not alive with the diff and the commit.
                del alloc_raw, list_raw
            settling, held, after = settle(self.settings, draft.settling, before, answer)
            draft = self._answered(draft, changes, list_only=list_only)  # lifecycle changes first
            if set(repaired) - draft.invalid_text:  # once, until an answer comes without any
                changes.append(lifecycle.invalid_text(repaired))
            if read is None:  # a List says whether any text still needs repair; a Get, not of all
                draft = dataclasses.replace(
                    draft, invalid_text=draft.invalid_text | set(repaired) if repaired else frozenset()
                )
            changes.extend(held)
            draft = dataclasses.replace(draft, settling=settling)
            evidence = merged([source.evidence(after) for source in self.sources])
            draft = conclude(self.settings, draft, changes, cycle, before, after, evidence)
        result = "changed" if after is not before else "unchanged"
        return result, functools.partial(commit, draft, before=before, baseline=before is None)

    async def _check_socket_identity(
        self, reasons: frozenset[str], draft: CycleState, changes: list[Change]
    ) -> tuple[CycleState, bool, bool]:
        """The draft with the socket now seen, whether the directory's name events were taken,
        and whether the kubelet restarted."""
        sock = probe_socket(self.socket_path)
        if not sock.present or sock.identity is None or sock.identity == draft.socket:
            return draft, False, False
        name_events, self.notifier.name_events = self.notifier.name_events, False
        old = draft.socket
        draft = dataclasses.replace(draft, socket=sock.identity)
        if old is not None and not is_replacement(old, sock.identity, name_events=name_events):
            return draft, name_events, False  # the same socket, its metadata touched (chmod, relabel)
        if old is not None:
            seen_by = "directory watch" if "socket" in reasons else "identity check"
            changes.append(lifecycle.restarted(self.socket_path, seen_by=seen_by))
        # A replaced kubelet may have been upgraded: ask for everything again, at once (its rate
        # limit is its own, fresh: the old one's calls do not count against it).
        self.list_only = None
        if old is not None:
            self.limiter.forget()
        await self.client.reconnect()
        self.metrics.reconnects.inc()
        self.notifier.socket_changed_at = self.notifier.socket_changed_at or time.monotonic()
        return draft, name_events, old is not None

    def _answered(self, draft: CycleState, changes: list[Change], *, list_only: bool) -> CycleState:
        now = time.monotonic()
        self.metrics.last_success.set(time.time())
        self.last_success = now
        if self.notifier.socket_changed_at is not None:
            self.last_reconnect_latency = now - self.notifier.socket_changed_at
            self.notifier.socket_changed_at = None
        h = draft.health
        if h.failing and not h.unreachable_reported:
            self.log.info("kubelet answering again", after_attempts=h.attempt)
        health, more = h.answered(
            now,
            self.socket_path,
            started_reported=self.committer.state.started_reported,
            list_only_reason=self.list_only if list_only else None,
        )
        if ALLOCATABLE in h.degraded_reported and ALLOCATABLE not in health.degraded_reported:
            self.log.info("GetAllocatableResources available again: full inventory restored")
        changes.extend(more)
        self.notifier.schedule_periodic(now)
        return dataclasses.replace(draft, health=health)

    async def _commit(
        self,
        changes: list[Change],
        cycle: str,
        draft: CycleState,
        *,
        took_name_events: bool,
        before: Inventory | None = None,
        baseline: bool = False,
    ) -> None:
        if not await self.committer.commit(changes, cycle, draft, before=before, baseline=baseline):
            # The restart these name events showed is reported again next time.
            self.notifier.name_events = self.notifier.name_events or took_name_events

    async def _commit_failure(
        self, commit: Callable[[CycleState], Awaitable[None]], draft: CycleState, cycle: str
    ) -> None:
        await commit(draft)
        await self._maybe_unreachable(cycle)

    async def _failed(
        self, err: Exception, kind: str, draft: CycleState, changes: list[Change]
    ) -> CycleState:
        now = time.monotonic()
        h = draft.health
        if kind != h.last_error_kind:
            self.log.warning("kubelet query failed; will retry", error=str(err), error_kind=kind)
        delay = self.retry_backoff.delay(h.attempt)
        self.notifier.schedule_periodic(now)
        health, more = h.failed(
            now,
            str(err),
            kind,
            retry_delay=delay,
            list_disabled=isinstance(err, errors.MethodDisabledError | errors.MethodNotImplementedError),
            next_periodic=self.notifier.next_periodic,
        )
        changes.extend(more)
        if isinstance(err, errors.KubeletUnavailableError | errors.DeadlineExceededError):
            # The channel may be wedged on a dead peer; dial afresh next time.
            await self.client.reconnect()
        return dataclasses.replace(draft, health=health)

    def _too_large(
        self, err: errors.ResponseTooLargeError, draft: CycleState, changes: list[Change]
    ) -> CycleState:
        now = time.monotonic()
        if draft.health.last_error_kind != "ResponseTooLargeError":
            self.log.warning("kubelet answer over the receive limit; will retry", error=str(err))
        self.notifier.schedule_periodic(now)
        health, more = draft.health.too_large(
            now,
            self.socket_path,
            method=err.method or "List",
            error=str(err),
            limit=self.settings.kubelet.max_receive_bytes,
            retry_delay=self.retry_backoff.delay(draft.health.attempt),
        )
        changes.extend(more)
        return dataclasses.replace(draft, health=health)

    async def _maybe_unreachable(self, cycle: str) -> None:
        """`kubelet.unreachable` once the failures outlast the grace (the caller holds the lock)."""
        state = self.committer.state
        health, change = state.health.unreachable(time.monotonic(), self._grace, self.socket_path)
        if change is not None:
            await self.committer.commit([change], cycle, dataclasses.replace(state, health=health))
