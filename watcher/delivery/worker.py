"""One sink's delivery worker: drains that sink's outbox queue, in seq order.

One retry policy for every sink: exponential backoff with full jitter and a
cap, `Retry-After` honoured when the receiver sends it, up to the sink's
`retry_after_max`; permanent failures go
to the dead-letter table, 410 disables the sink loudly. Each sink has its own
rate limit and its own task, so a slow or dead sink never delays another sink
or the watch loop.

The worker also applies its sink's caps (`enforce_caps`): every drop is counted
and logged with its seq range, and a sink that records gaps (the audit log) is
handed each gap, in seq order, before the events after it. While a batch is
being delivered the queue's caps wait (it is the oldest; whether it goes is
known once the attempt ends) and are applied when it is done with. After a
failed attempt the batch is released and taken afresh after the backoff, so a
blocked sink's queue still loses its oldest events first, and what was dropped
meanwhile is never sent.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import structlog

from watcher.backoff import Backoff
from watcher.model.events import Event
from watcher.model.gaps import Gap
from watcher.ratelimit import RateLimiter
from watcher.secrets import redact
from watcher.sinks.base import GapRecorder, Outcome, Sink, route_of
from watcher.sinks.http import HttpSink
from watcher.sinks.registry import capabilities_of
from watcher.store.outbox import Caps, Dropped
from watcher.store.store import Store
from watcher.supervision import Scope, sleep_or_stop, wait_any

__all__ = ["SinkWorker", "DeliveryObserver"]

log = structlog.get_logger("watcher.delivery.worker")

# (sink name, result, events, seconds from event creation to delivery or failure)
DeliveryObserver = Callable[[str, str, Sequence[Event], float], None]
# What a worker hands its sink at once: events, or a gap its stream must record.
Batch = list[Event] | Gap
IDLE_RECHECK_S = 5.0
OUTBOX_RETRY_CAP_S = 2.0  # the longest a worker waits to try a failing outbox again


class SinkWorker:
    def __init__(
        self,
        sink: Sink,
        outbox: Store,
        *,
        stop: Scope,
        rng: random.Random,
        observers: list[DeliveryObserver],
    ) -> None:
        self.sink = sink
        self.name = sink.name
        self.outbox = outbox
        self.stop = stop
        s = sink.settings
        # Paging sinks (and Slack, which says "recovered") must see the end of every condition
        # they started.
        caps = capabilities_of(s)
        self.route = route_of(
            s,
            resolutions=caps.pages or caps.resolves,
            skip_flapping=caps.notifies,
            skip_incident_devices=caps.pages and not caps.each_device,
        )
        self._batches = caps.batches
        # A sink that records gaps in its own stream is handed them; others only count and log.
        self.gaps: GapRecorder | None = sink if isinstance(sink, GapRecorder) else None
        self.caps = Caps(s.max_queue, s.max_age, s.max_dead_letters, s.max_dead_letter_age)
        self._caps_deferred = False  # the caps waited for a batch in flight: apply them after it
        self.limiter = RateLimiter(s.rate)
        # A sink that sends its own requests spends the rate on those, not on every event routed
        # to it (an end of condition it never opened costs nothing and must not delay a page).
        self._paced_by_sink = isinstance(sink, HttpSink)
        if isinstance(sink, HttpSink):
            sink.limiter = self.limiter
        self.backoff = Backoff(base=0.5, cap=s.retry_max_delay, rng=rng)
        # Outbox trouble is ours, not the receiver's: retry it briskly, whatever the sink's cap.
        self.outbox_backoff = Backoff(base=0.2, cap=OUTBOX_RETRY_CAP_S, rng=rng)
        self.on_outbox_error: Callable[[Exception], None] = lambda _err: None
        self.wake = asyncio.Event()
        self.disabled: str | None = None
        self.counts: Counter[str] = Counter()
        self.observers = observers
        self.log = log.bind(sink=self.name, sink_type=getattr(s, "type", "?"))

    @property
    def batch_size(self) -> int:
        s = self.sink.settings
        batches = self._batches or s.group != "none" or bool(getattr(s, "batch", False))
        return s.max_batch if batches else 1

    async def _wait_for_work(self) -> None:
        self.wake.clear()
        await wait_any(self.stop, self.wake, within=IDLE_RECHECK_S)

    async def _take(self) -> Batch:
        """The next gap, or the oldest queued events (one re-query's, with group = "cycle")."""
        got = await self.outbox.take(self.name, self.batch_size, gaps=self.gaps is not None)
        if isinstance(got, list) and got and self.sink.settings.group == "cycle":
            return [e for e in got if e.cycle == got[0].cycle]
        return got

    async def _next_batch(self) -> Batch | None:
        s = self.sink.settings
        first_seen: float | None = None
        failures = 0
        while not self.stop.is_set():
            try:
                batch = await self._take()
                failures = 0
            except Exception as err:  # the outbox is being reopened, or its disk failed
                self.log.error("could not read the sink's queue; will retry", error=repr(err))
                self.on_outbox_error(err)
                await sleep_or_stop(self.stop, self.outbox_backoff.delay(failures))
                failures += 1
                continue
            if isinstance(batch, Gap):
                return batch
            if not batch:
                first_seen = None
                await self._wait_for_work()
                continue
            if s.group == "window" and len(batch) < self.batch_size:
                now = time.monotonic()
                first_seen = first_seen or now
                if now - first_seen < s.group_window:
                    await self._release()  # gathering is not delivering: the caps need not wait
                    await sleep_or_stop(self.stop, s.group_window - (now - first_seen))
                    continue
            return batch
        return None

    async def enforce_caps(self) -> list[Dropped]:
        """Apply the sink's caps to what the outbox holds for it; count and log every drop with
        its seq range (a gap-recording sink's stream gets a gap too). Raises if the outbox does."""
        enforced = await self.outbox.enforce_caps(self.name, self.caps, gaps=self.gaps is not None)
        self._caps_deferred = enforced.deferred
        drops = enforced.dropped
        for drop in drops:
            if drop.dead_letters:
                self.counts["dead_letters_dropped"] += drop.count
                self.log.warning(
                    "dead letters over their cap: dropped the oldest",
                    reason=drop.reason,
                    dropped=drop.count,
                    first_seq=drop.first,
                    last_seq=drop.last,
                    max_dead_letters=self.caps.max_dead_letters,
                    max_dead_letter_age_s=self.caps.max_dead_letter_age,
                )
            else:
                self.counts["dropped"] += drop.count
                self.log.warning(
                    "sink queue over its cap: dropped the oldest events",
                    reason=drop.reason,
                    dropped=drop.count,
                    first_seq=drop.first,
                    last_seq=drop.last,
                    max_queue=self.caps.max_queue,
                    max_age_s=self.caps.max_age,
                    gap_recorded=self.gaps is not None,
                )
        return drops

    async def _deferred_caps(self) -> None:
        """The caps that waited for the batch just done with (logs, never raises: the next
        commit applies them anyway)."""
        if not self._caps_deferred:
            return
        try:
            await self.enforce_caps()
        except Exception as err:
            self.log.error("could not enforce the sink's queue caps; will retry", error=repr(err))

    async def _release(self) -> None:
        """The batch in hand goes back to being the queue's (a failed attempt); the caps that
        waited for it apply now."""
        await self.outbox.release(self.name)
        await self._deferred_caps()

    async def _record(self, what: str, fn: Callable[..., Awaitable[None]], *args: object) -> bool:
        """Write a delivery's outcome to the outbox, retrying while the disk refuses (full,
        read-only): the worker must outlive a bad disk. False if stopped before it could."""
        attempt = 0
        while True:
            try:
                await fn(*args)
                return True
            except Exception as err:  # sqlite3.Error, OSError: the state directory is in trouble
                self.on_outbox_error(err)
                delay = self.outbox_backoff.delay(attempt)
                attempt += 1
                self.log.error(
                    "could not record a delivery in the outbox; will retry",
                    what=what,
                    error=repr(err),
                    attempt=attempt,
                    hint="is the state directory full or read-only?",
                )
                if self.stop.is_set():
                    return False
                await sleep_or_stop(self.stop, delay)

    async def run(self) -> None:
        await self._record("enable", self.outbox.set_disabled, self.name, None)
        while not self.stop.is_set():
            if self.disabled is not None:
                await self.stop.wait()
                return
            batch = await self._next_batch()
            if batch is None:
                break
            await self._deliver(batch)
        await self._drain()

    async def _drain(self) -> None:
        """On shutdown, hand over what is queued while the receiver takes it, without retrying:
        what is left stays in the outbox for the next run."""
        while self.disabled is None:
            batch = await self._take()
            if not batch or not await self._deliver(batch, retry=False):
                return

    def _notify(self, result: str, batch: Sequence[Event], started: float) -> None:
        self.counts[result] += len(batch)
        for observer in self.observers:
            observer(self.name, result, batch, time.monotonic() - started)

    def _retry_after(self, outcome: Outcome) -> float | None:
        """The receiver's Retry-After, cut to the sink's `retry_after_max`: one answer of
        `Retry-After: 99999999999` must not stall the sink until the agent restarts."""
        asked = outcome.retry_after
        if asked is None or math.isnan(asked):
            return None
        cap = self.sink.settings.retry_after_max
        if asked <= cap:
            return max(0.0, asked)
        self.log.warning(
            "receiver asked to wait longer than retry_after_max; waiting that long instead",
            retry_after_asked=f"{asked:g}",  # a string: inf is no JSON number
            retry_after_max=cap,
            status=outcome.status,
        )
        return cap

    async def _send(self, batch: Batch) -> Outcome:
        try:
            if isinstance(batch, Gap):
                assert self.gaps is not None
                return await self.gaps.record_gap(batch)
            return await self.sink.deliver(batch)
        except Exception as err:  # a sink bug must not stop delivery to it, let alone the agent
            self.log.exception("sink raised; treating as a transient failure")
            return Outcome(retry=True, error=redact(f"{type(err).__name__}: {err}"))

    async def _retake(self, batch: Batch) -> Batch:
        """After a backoff: what is next now (the caps may have dropped some of `batch`, and a gap
        come first); `batch` itself if the outbox cannot say."""
        try:
            return await self._take()
        except Exception as err:
            self.log.error("could not read the sink's queue; retrying the same batch", error=repr(err))
            self.on_outbox_error(err)
            return batch

    async def _split(self, batch: list[Event], outcome: Outcome, started: float) -> list[Event]:
        """Acknowledge the events the sink delivered before it failed (`outcome.done`); what the
        failure concerns: the event after them alone when it is permanent, else all the rest."""
        assert outcome.done is not None
        done = min(max(outcome.done, 0), len(batch) - 1)
        if done:
            await self._record("ack", self.outbox.ack, self.name, [e.seq for e in batch[:done]])
            self._notify("delivered", batch[:done], started)
        rest = batch[done:]
        return rest if outcome.retry or outcome.gone else rest[:1]

    async def _deliver(self, batch: Batch, *, retry: bool = True) -> bool:
        """Deliver one batch (or record one gap), retrying while `retry` and not stopping; True
        when it is done with (delivered, dead-lettered, or all of it dropped meanwhile)."""
        attempt = 0
        started = time.monotonic()
        while True:
            if not self._paced_by_sink:
                await self.limiter.acquire()
            outcome = await self._send(batch)
            if outcome.delivered:
                await self._delivered(batch, attempt, started)
                return True
            if outcome.done is not None and not isinstance(batch, Gap):
                batch = await self._split(batch, outcome, started)
            if outcome.gone:
                await self._gone(batch, outcome, started)
                return False
            if not outcome.retry:
                await self._refused(batch, outcome, started)
                return True
            if not retry or self.stop.is_set():
                await self._release()
                self.log.warning(
                    "delivery failed while stopping; left queued", status=outcome.status, error=outcome.error
                )
                return False
            await self._back_off(batch, outcome, attempt)
            attempt += 1
            batch = await self._retake(batch)
            if not batch:
                return True  # all of it was dropped meanwhile (counted, logged)

    async def _delivered(self, batch: Batch, attempt: int, started: float) -> None:
        """The outbox acknowledges what the sink took (a gap: that the stream recorded it)."""
        # Not recorded (stopping on a bad disk): it is sent again next time, same ids.
        if isinstance(batch, Gap):
            await self._record("gap", self.outbox.gap_recorded, self.name, batch)
            self.log.warning(
                "recorded a gap in the sink's stream: events its caps dropped",
                first_seq=batch.first,
                last_seq=batch.last,
                dropped=batch.count,
                reasons=list(batch.reasons),
            )
            return
        await self._record("ack", self.outbox.ack, self.name, [e.seq for e in batch])
        await self._deferred_caps()
        if attempt:
            self.log.info("delivered after retrying", attempts=attempt + 1, events=len(batch))
        self._notify("delivered", batch, started)

    async def _gone(self, batch: Batch, outcome: Outcome, started: float) -> None:
        """410: the sink is disabled until a restart or reload; its queue stays."""
        self.disabled = outcome.error
        await self._release()  # bounded by the caps like the rest of its queue
        await self._record("disable", self.outbox.set_disabled, self.name, outcome.error)
        self.log.error(
            "receiver answered 410 Gone: sink DISABLED until the agent restarts or reloads; "
            "its events stay queued (bounded). Fix the sink's URL.",
            status=outcome.status,
            error=outcome.error,
            queued_from_seq=batch.first if isinstance(batch, Gap) else batch[0].seq,
        )
        self._notify("gone", [] if isinstance(batch, Gap) else batch, started)

    async def _refused(self, batch: Batch, outcome: Outcome, started: float) -> None:
        """A permanent failure: the events are dead-lettered (a gap is only let go)."""
        if isinstance(batch, Gap):
            # Nothing to dead-letter: the drop itself was counted and logged.
            await self._record("gap", self.outbox.gap_recorded, self.name, batch)
            self.log.error(
                "the sink refused to record a gap for good; its drop stays counted and logged",
                first_seq=batch.first,
                last_seq=batch.last,
                status=outcome.status,
                error=outcome.error,
            )
            return
        seqs = [e.seq for e in batch]
        await self._record(
            "dead letter", self.outbox.dead_letter, self.name, seqs, outcome.status, outcome.error
        )
        self.log.error(
            "permanent failure: events dead-lettered; see `pod-resources-watcher outbox list`",
            status=outcome.status,
            error=outcome.error,
            seqs=seqs,
        )
        self._notify("dead_letter", batch, started)
        try:
            await self.enforce_caps()  # the dead letters' cap, at once
        except Exception as err:  # the next commit enforces it again
            self.log.error("could not enforce the dead letters' cap; will retry", error=repr(err))

    async def _back_off(self, batch: Batch, outcome: Outcome, attempt: int) -> None:
        """Wait before attempt `attempt + 1`: the backoff, or longer if the receiver asked."""
        delay = self.backoff.delay(attempt)
        retry_after = self._retry_after(outcome)
        if retry_after is not None:
            delay = max(delay, retry_after)
        self.counts["retry"] += 1
        self.log.warning(
            "delivery failed; will retry",
            attempt=attempt + 1,
            delay_s=round(delay, 3),
            retry_after=retry_after,
            status=outcome.status,
            error=outcome.error,
            events=0 if isinstance(batch, Gap) else len(batch),
        )
        # While it waits, the batch is the queue's like any other event: the caps may drop it.
        await self._release()
        await sleep_or_stop(self.stop, delay)
