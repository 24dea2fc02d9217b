"""The consumer side: a durable pull consumer recording when each event first arrives, the
consumer lag sampled, a phase's figures, and the whole stream read back (lost, duplicated,
out of order)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Sequence

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.fleet.connections import quiet
from bench.fleet.nodes import Ledger
from bench.fleet.results import Arrivals, StreamCheck
from testkit.nats_cluster import NatsCluster
from testkit.waiting import wait_until

__all__ = ["LAG_EVERY", "PULL_EVERY", "Reader", "latency", "phase_row", "read_stream", "stream_check"]

LAG_EVERY = 0.25
PULL_EVERY = 0.02


class Reader:
    """A durable pull consumer that records when each event id first arrives.

    Pull requests (a batch each, expiring after a second) are kept topped up from its callback,
    so a message is recorded as it comes off the socket, not when a fetch returns. Each message
    is acknowledged on its own as it arrives (ack policy explicit): a delivery lost on the way
    (to a pull request of a connection that went down with its server) is delivered again after
    `ACK_WAIT`, where acknowledging "everything up to here" would have skipped it for good.
    """

    ACK_WAIT = 2.0

    BATCH = 1000
    EXPIRES = 1.0

    def __init__(self, nc: Client, stream: str, received: dict[str, float]) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=2)
        self.stream = stream
        self.durable = "fleet-reader"
        self.received = received
        self.deliveries = 0
        self.lag: list[tuple[float, int]] = []
        self._requests: deque[list[float]] = deque()  # [expires at, messages still due]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.js.add_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=self.durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.ACK_WAIT,
                deliver_policy=DeliverPolicy.ALL,
                # The burst must not wait on acknowledgements: every message may be outstanding.
                max_ack_pending=1_000_000,
            ),
        )
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)
        self._tasks = [asyncio.create_task(self._tick()), asyncio.create_task(self._sample())]

    def _due(self) -> float:
        return sum(r[1] for r in self._requests)

    async def _pull(self) -> None:
        if self._due() < self.BATCH / 2:
            self._requests.append([time.monotonic() + self.EXPIRES, self.BATCH])
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}",
                b'{"batch":%d,"expires":%d}' % (self.BATCH, int(self.EXPIRES * 1e9)),
                reply=self.inbox,
            )

    async def _on_msg(self, msg: Msg) -> None:
        now = time.monotonic()
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            # 408: a request expired; anything else (409: leadership change, too many waiting)
            # leaves our count of what is due unknown: start over.
            if status == "408" and self._requests:
                self._requests.popleft()
            else:
                self._requests.clear()
        else:
            assert msg.headers is not None
            self.received.setdefault(msg.headers["Nats-Msg-Id"], now)
            self.deliveries += 1
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await self.nc.publish(msg.reply, b"+ACK")
            if self._requests:
                self._requests[0][1] -= 1
                if self._requests[0][1] <= 0:
                    self._requests.popleft()
        with contextlib.suppress(nats.errors.Error):
            await self._pull()

    async def _tick(self) -> None:
        while True:
            now = time.monotonic()
            while self._requests and self._requests[0][0] + 0.2 < now:
                self._requests.popleft()  # expired without a word (its server went away)
            with contextlib.suppress(nats.errors.Error):
                await self._pull()
            await asyncio.sleep(PULL_EVERY)

    async def lag_now(self) -> int | None:
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
            last = (await self.js.stream_info(self.stream)).state.last_seq
        except (nats.errors.Error, TimeoutError):
            return None  # e.g. no leader this moment
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else None
        return int(last - (floor or 0))

    async def _sample(self) -> None:
        while True:
            lag = await self.lag_now()
            if lag is not None:
                self.lag.append((time.monotonic(), lag))
            await asyncio.sleep(LAG_EVERY)

    def max_lag(self, since: float, until: float) -> int:
        return max((lag for t, lag in self.lag if since <= t <= until), default=0)

    async def caught_up(self, ids: Sequence[str], timeout: float) -> None:
        """Until every one of `ids` arrived, or `timeout` passed: what did not arrive by then is
        counted lost, not raised."""
        waiting = list(reversed(ids))

        def arrived() -> bool:
            while waiting and waiting[-1] in self.received:  # each id looked up once it is in
                waiting.pop()
            return not waiting

        with contextlib.suppress(AssertionError):
            await wait_until(arrived, timeout, interval=0.005)

    async def settled(self, ids: Sequence[str]) -> None:
        """The nodes' start read and acknowledged, so that a phase's lag is its own."""
        await self.caught_up(ids, 30)
        await self.end_lag()

    async def end_lag(self) -> int | None:
        """The lag once everything was read: after an acknowledgement of the last message."""
        await asyncio.sleep(2 * PULL_EVERY)
        for _ in range(40):
            lag = await self.lag_now()
            if lag == 0:
                return 0
            await asyncio.sleep(0.05)
        return await self.lag_now()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(nats.errors.Error):
            await self.sub.unsubscribe()


def latency(ids: Sequence[str], ledger: Ledger) -> list[float]:
    return [ledger.received[i] - ledger.sent[i] for i in ids if i in ledger.received and i in ledger.sent]


def phase_row(ids: Sequence[str], ledger: Ledger, seconds: float | None, started: float) -> Arrivals:
    """A phase's figures: events, events/s (over `seconds`, or until its last arrival), latency."""
    got = [i for i in ids if i in ledger.received]
    last = max((ledger.received[i] for i in got), default=started)
    span = seconds if seconds is not None else max(last - started, 1e-6)
    return Arrivals(len(ids), len(got), len(got) / span, span, tuple(latency(ids, ledger)))


async def read_stream(cluster: NatsCluster, stream: str, timeout: float = 120) -> list[Msg]:
    """Every message the stream holds, in stream order, through an ephemeral consumer of its own
    (in memory, one replica, no acknowledgements); a fetch refused while that consumer is still
    being placed (503) or timing out is tried again, within `timeout`."""
    nc = await cluster.connect(error_cb=quiet)
    try:
        js = nc.jetstream(timeout=5)
        want = (await js.stream_info(stream)).state.messages
        sub = await js.pull_subscribe(
            "",
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1),
        )
        out: list[Msg] = []
        async with asyncio.timeout(timeout):
            while len(out) < want:
                try:
                    out.extend(await sub.fetch(min(500, want - len(out)), timeout=1))
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    await asyncio.sleep(0.1)
        return out
    finally:
        await nc.close()


async def stream_check(cluster: NatsCluster, stream: str, sent: Sequence[str]) -> StreamCheck:
    """Read the whole stream back: ids sent but absent, ids stored twice, a node's seq going back."""
    messages = await read_stream(cluster, stream)
    ids: Counter[str] = Counter()
    last: dict[str, int] = {}
    backwards = 0
    for m in messages:
        assert m.headers is not None
        ids[m.headers["Nats-Msg-Id"]] += 1
        node, seq = m.headers["Prw-Node"], int(m.headers["Prw-Seq"])
        backwards += seq < last.get(node, 0)
        last[node] = seq
    lost = [i for i in sent if i not in ids]
    twice = [i for i, n in ids.items() if n > 1]
    return StreamCheck(
        stored=len(messages),
        lost=len(lost),
        duplicated=sum(ids[i] - 1 for i in twice),
        out_of_order=backwards,
        examples={"lost": lost[:3], "duplicated": twice[:3]},
    )
