"""Section 6: events/s through the outbox to a local webhook, and a change's way through the
whole agent to the webhook's receipt."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from bench.figures import ms, pct, verdict
from bench.harness import GPU, Watch, run_agent, settings_for, stop_agent
from bench.receiver import Receiver
from bench.registry import Results, Section, part, section
from testkit.dispatching import open_outbox
from watcher.app import Agent
from watcher.delivery.dispatcher import Dispatcher
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import envelope
from watcher.secrets import Secret
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sinks.webhook import WebhookSink, WebhookSinkSettings

__all__ = ["DELIVERY", "Delivery", "DeliveryPlan", "bench_delivery"]


@dataclass(frozen=True)
class DeliveryPlan:
    events: int
    flips: int


@dataclass(frozen=True)
class Delivery:
    throughput: float  # events/s
    change_to_receipt: tuple[float, ...]  # seconds


async def _throughput(port: int, receiver: Receiver, n_events: int) -> float:
    with tempfile.TemporaryDirectory(prefix="prw-b6-", dir="/tmp") as tmp:
        async with open_outbox(Path(tmp) / "outbox.db") as outbox:
            hook = WebhookSinkSettings(
                name="hook",
                url=Secret(value=f"http://127.0.0.1:{port}/"),
                batch=True,
                max_batch=500,
                rate=1000,
            )
            stop = asyncio.Event()
            dispatcher = Dispatcher(outbox, [WebhookSink(hook, node="n")], stop=stop)
            await outbox.register(["hook"])
            task = asyncio.create_task(dispatcher.run())
            change = Change(
                Kind.DEVICE_ADDED, Severity.INFO, "bench", {"resource": GPU, "device": "x", "numa": [0]}
            )
            t0 = time.monotonic()
            for start in range(0, n_events, 500):
                events = [
                    envelope(change, seq=s + 1, node="n", cycle=f"c{s // 50}", before=None, after=None)
                    for s in range(start, min(n_events, start + 500))
                ]
                await outbox.commit(events, dispatcher.queues(events), None)
                dispatcher.notify()
            await receiver.until(lambda: receiver.count >= n_events, 120)
            throughput = n_events / (time.monotonic() - t0)
            stop.set()
            await task
            await dispatcher.close()
    return throughput


async def _change_to_receipt(port: int, receiver: Receiver, n_flips: int) -> list[float]:
    """Change to receipt, through the whole agent."""
    receiver.ids.clear()
    with tempfile.TemporaryDirectory(prefix="prw-b6b-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake = FakeKubelet(root / "kubelet", default_node())
        await fake.start()
        settings = dataclasses.replace(
            settings_for(root, fake),
            sinks=(
                WebhookSinkSettings(name="hook", url=Secret(value=f"http://127.0.0.1:{port}/"), rate=1000),
            ),
        )
        agent = Agent(settings)
        watch = Watch(agent)
        task = await run_agent(agent)
        await watch.until(lambda: bool(watch.events), 20)
        gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
        lat = []
        for i in range(n_flips):
            await asyncio.sleep(1.0)
            mark = len(watch.events)
            t0 = time.monotonic()
            (fake.make_unhealthy if i % 2 == 0 else fake.heal)(GPU, gpu)
            want = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
            await watch.until(lambda: watch.saw(want, mark), 30)
            event_id = next(e.id for _, e in watch.events[mark:] if e.kind == want)
            await receiver.until(lambda: event_id in receiver.ids, 30)
            lat.append(receiver.ids[event_id] - t0)
        await stop_agent(agent, task)
        await fake.stop(remove_socket=True)
    return lat


async def bench_delivery(n_events: int, n_flips: int) -> Delivery:
    receiver = Receiver()
    async with receiver.server() as server:
        throughput = await _throughput(server.port, receiver, n_events)
        latency = await _change_to_receipt(server.port, receiver, n_flips)
    return Delivery(throughput, tuple(latency))


def _run(plan: DeliveryPlan) -> Awaitable[Delivery]:
    return bench_delivery(plan.events, plan.flips)


DELIVERY = section(
    Section(
        name="delivery",
        title="events/s through the outbox to a local webhook; change to receipt",
        order=60,
        full=DeliveryPlan(events=10_000, flips=30),
        quick=DeliveryPlan(events=2000, flips=10),
        run=_run,
    )
)


@part((6, 0))
def render(results: Results) -> list[str]:
    d = results.get(DELIVERY)
    if d is None:
        return []
    xs = d.change_to_receipt
    return [
        "## 6. Delivery",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| events/s through the outbox to a local webhook (batches of 500) | {d.throughput:,.0f} | {verdict(d.throughput >= 2000)} |",
        f"| change to receipt, p50 (n={len(xs)}) | {ms(statistics.median(xs))} | |",
        f"| change to receipt, p99 | {ms(pct(xs, 99))} | {verdict(pct(xs, 99) <= 0.15)} |",
        "",
        "Goals: >= 2,000 events/s and p99 <= 150 ms.",
        "",
    ]
