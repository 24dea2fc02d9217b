"""Simulated nodes, each delivering its own queue as the agent's worker does (batches up to the
sink's max_batch, what is not done sent again after the worker's backoff), and the ledger of
when each event was made, sent, stored and received."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bench.fleet.plan import FleetPlan
from bench.fleet.script import Cycle, Script
from watcher.backoff import Backoff
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.sinks.base import BaseSinkSettings

__all__ = ["RETRY", "Fleet", "Ledger", "Send", "SimNode", "error_kind"]

# The worker's retry backoff (watcher/delivery/worker.py): full jitter from 0.5 s, doubling, up
# to the sinks' default retry_max_delay.
RETRY = Backoff(base=0.5, cap=BaseSinkSettings().retry_max_delay, rng=random.Random(17))


# A delivery: the events, in order -> (how many were stored, of them duplicates, the error).
Send = Callable[[Sequence[Event]], Awaitable[tuple[int, int, str]]]


class SimNode:
    def __init__(self, name: str, send: Send, step: int) -> None:
        self.name = name
        self.send = send
        self.seq = 0
        self.step = step
        self.queue: list[Event] = []
        self.task: asyncio.Task[None] | None = None

    def events(self, cycle: Cycle) -> list[Event]:
        cycle_id = new_cycle_id()
        out = []
        for change in cycle.changes:
            self.seq += 1
            out.append(
                envelope(
                    change,
                    seq=self.seq,
                    node=self.name,
                    cycle=cycle_id,
                    before=cycle.before,
                    after=cycle.after,
                )
            )
        return out


@dataclass
class Ledger:
    """Per event id (monotonic clock): made, first handed to its sink, stored, received."""

    created: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    stored: dict[str, float] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    abandoned: int = 0
    errors: Counter[str] = field(default_factory=Counter)


class Fleet:
    """Simulated nodes, each delivering its own queue as the agent's worker does."""

    def __init__(self, plan: FleetPlan, play: Script, ledger: Ledger, *, max_batch: int, seed: int) -> None:
        self.plan = plan
        self.script = play
        self.ledger = ledger
        self.max_batch = max_batch
        self.rng = random.Random(seed)
        self.nodes: list[SimNode] = []
        self.busy = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, name: str, send: Send) -> SimNode:
        node = SimNode(name, send, self.rng.randrange(len(self.script.steady)))
        self.nodes.append(node)
        return node

    def change(self, node: SimNode, cycle: Cycle | None = None) -> list[Event]:
        """`node` re-queried and found `cycle` (its next scripted step by default)."""
        if cycle is None:
            cycle = self.script.steady[node.step % len(self.script.steady)]
            node.step += 1
        events = node.events(cycle)
        now = time.monotonic()
        for e in events:
            self.ledger.created[e.id] = now
        node.queue.extend(events)
        if node.task is None:
            self.busy += 1
            self.idle.clear()
            node.task = asyncio.create_task(self._deliver(node))
        return events

    async def _deliver(self, node: SimNode) -> None:
        ledger = self.ledger
        attempt = 0
        give_up = time.monotonic() + self.plan.give_up_s
        try:
            while node.queue:
                batch = node.queue[: self.max_batch]
                now = time.monotonic()
                for e in batch:
                    ledger.sent.setdefault(e.id, now)
                done, _, error = await node.send(batch)
                now = time.monotonic()
                for e in batch[:done]:
                    ledger.stored[e.id] = now
                del node.queue[:done]
                if done == len(batch):
                    attempt = 0
                    continue
                ledger.errors[error_kind(error)] += 1
                if now >= give_up:
                    ledger.abandoned += len(node.queue)
                    node.queue.clear()
                    break
                ledger.retries += 1
                await asyncio.sleep(min(RETRY.delay(attempt), max(0.0, give_up - now)))
                attempt += 1
        finally:
            node.task = None
            self.busy -= 1
            if self.busy == 0:
                self.idle.set()

    async def play(self, events_per_s: float, seconds: float) -> list[str]:
        """Re-queries with changes at Poisson times over the fleet, `events_per_s` on average."""
        rate = events_per_s / self.script.mean_events
        ids: list[str] = []
        t0 = time.monotonic()
        due = t0
        while True:
            due += self.rng.expovariate(rate)
            if due >= t0 + seconds:
                break
            wait = due - time.monotonic()
            if wait > 0.001:
                await asyncio.sleep(wait)
            ids += [e.id for e in self.change(self.rng.choice(self.nodes))]
        await asyncio.sleep(max(0.0, t0 + seconds - time.monotonic()))
        return ids

    def burst(self, share: float) -> list[str]:
        """A share of the nodes each lose a GPU that a pod holds, at the same instant."""
        hit = self.rng.sample(self.nodes, max(1, round(share * len(self.nodes))))
        return [e.id for node in hit for e in self.change(node, self.script.burst)]

    async def settle(self) -> None:
        """Until every node's queue is delivered (or given up: each delivery is bounded)."""
        async with asyncio.timeout(self.plan.give_up_s + 30):
            await self.idle.wait()


def error_kind(error: str) -> str:
    """An error's kind for counting: up to its first ": " outside parentheses (the details after it
    vary from one attempt to the next)."""
    depth = 0
    for i, ch in enumerate(error):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and error.startswith(": ", i):
            return error[:i][:80]
    return error[:80] or "(none)"
