"""One sink's delivery worker: drains that sink's outbox queue, in seq order.

One retry policy for every sink: exponential backoff with full jitter and a
cap, `Retry-After` honoured when the receiver sends it, up to the sink's
`retry_after_max`; permanent failures go
to the dead-letter table, 410 disables the sink loudly. Each sink has its own
rate limit and its own task, so a slow or dead sink never delays another sink
or the watch loop.
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
from watcher.ratelimit import RateLimiter
from watcher.secrets import redact
from watcher.sinks.base import Outcome, Sink, route_of
from watcher.sinks.http import HttpSink
from watcher.sinks.registry import capabilities_of
from watcher.store.store import Store
from watcher.supervision import Scope, sleep_or_stop, wait_any

__all__ = ["SinkWorker", "DeliveryObserver"]

log = structlog.get_logger("watcher.delivery.worker")

# (sink name, result, events, seconds from event creation to delivery or failure)
DeliveryObserver = Callable[[str, str, Sequence[Event], float], None]
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
        # Paging sinks must see the end of every condition they started.
        caps = capabilities_of(s)
        self.route = route_of(
            s, resolutions=caps.pages, skip_flapping=caps.notifies, skip_incident_devices=caps.pages
        )
        self.limiter = RateLimiter(s.rate)
        # A sink that sends its own requests spends the rate on those, not on every event routed
        # to it (an end of condition it never opened costs nothing and must not delay a page).
        self._paced_by_sink = isinstance(sink, HttpSink)
        if isinstance(sink, HttpSink):
            sink.pace = self.limiter.acquire
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
        batches = s.group != "none" or bool(getattr(s, "batch", False))
        return s.max_batch if batches else 1

    async def _wait_for_work(self) -> None:
        self.wake.clear()
        await wait_any(self.stop, self.wake, within=IDLE_RECHECK_S)

    async def _next_batch(self) -> list[Event] | None:
        s = self.sink.settings
        first_seen: float | None = None
        failures = 0
        while not self.stop.is_set():
            try:
                events = await self.outbox.pending(self.name, self.batch_size)
                failures = 0
            except Exception as err:  # the outbox is being reopened, or its disk failed
                self.log.error("could not read the sink's queue; will retry", error=repr(err))
                self.on_outbox_error(err)
                await sleep_or_stop(self.stop, self.outbox_backoff.delay(failures))
                failures += 1
                continue
            if not events:
                first_seen = None
                await self._wait_for_work()
                continue
            if s.group == "cycle":
                return [e for e in events if e.cycle == events[0].cycle]
            if s.group == "window" and len(events) < self.batch_size:
                now = time.monotonic()
                first_seen = first_seen or now
                if now - first_seen < s.group_window:
                    await sleep_or_stop(self.stop, s.group_window - (now - first_seen))
                    continue
            return events
        return None

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
            batch = await self.outbox.pending(self.name, self.batch_size)
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

    async def _deliver(self, batch: list[Event], *, retry: bool = True) -> bool:
        """Deliver one batch, retrying while `retry` and not stopping; True when delivered."""
        seqs = [e.seq for e in batch]
        attempt = 0
        started = time.monotonic()
        while True:
            if not self._paced_by_sink:
                await self.limiter.acquire()
            try:
                outcome = await self.sink.deliver(batch)
            except Exception as err:  # a sink bug must not stop delivery to it, let alone the agent
                self.log.exception("sink raised; treating as a transient failure")
                outcome = Outcome(retry=True, error=redact(f"{type(err).__name__}: {err}"))
            if outcome.delivered:
                # Not recorded (stopping on a bad disk): it is sent again next time, same ids.
                await self._record("ack", self.outbox.ack, self.name, seqs)
                if attempt:
                    self.log.info("delivered after retrying", attempts=attempt + 1, events=len(batch))
                self._notify("delivered", batch, started)
                return True
            if outcome.gone:
                self.disabled = outcome.error
                await self._record("disable", self.outbox.set_disabled, self.name, outcome.error)
                self.log.error(
                    "receiver answered 410 Gone: sink DISABLED until the agent restarts or reloads; "
                    "its events stay queued (bounded). Fix the sink's URL.",
                    status=outcome.status,
                    error=outcome.error,
                    queued_from_seq=seqs[0],
                )
                self._notify("gone", batch, started)
                return False
            if not outcome.retry:
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
                return True
            if not retry or self.stop.is_set():
                self.log.warning(
                    "delivery failed while stopping; left queued", status=outcome.status, error=outcome.error
                )
                return False
            delay = self.backoff.delay(attempt)
            retry_after = self._retry_after(outcome)
            if retry_after is not None:
                delay = max(delay, retry_after)
            attempt += 1
            self.counts["retry"] += 1
            self.log.warning(
                "delivery failed; will retry",
                attempt=attempt,
                delay_s=round(delay, 3),
                retry_after=retry_after,
                status=outcome.status,
                error=outcome.error,
                events=len(batch),
            )
            await sleep_or_stop(self.stop, delay)
