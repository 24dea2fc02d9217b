"""Section 1: reconnection after a kubelet restart, the agent beside a plain grpc.aio channel
polled every 100 ms, against the same restarts."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from bench.figures import ms, pct, verdict
from bench.harness import ALLOC, stop_agent, watched_agent
from bench.registry import Results, Section, part, section
from testkit.waiting import wait_until

__all__ = ["RECONNECT", "Reconnect", "Recovery", "bench_reconnect"]


@dataclass(frozen=True)
class Recovery:
    """Seconds from each restart to the first answered call: ours, and the plain channel's."""

    ours: tuple[float, ...]
    plain: tuple[float, ...]


@dataclass(frozen=True)
class Reconnect:
    by_downtime: dict[float, Recovery]  # downtime (s) -> its restarts


async def bench_reconnect(plan: dict[float, int], **settings: float) -> Reconnect:
    """`settings`: the agent's [watch] settings other than the defaults (the idle curve's steps)."""
    with tempfile.TemporaryDirectory(prefix="prw-b1-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake, agent, watch, task = await watched_agent(root, **settings)
        # The baseline: a plain channel with gRPC's default reconnect backoff, polled every 100 ms.
        channel = aio.insecure_channel(f"unix://{fake.socket_path}")
        call: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(ALLOC)
        plain_ok: list[float] = []

        async def poll() -> None:
            while True:
                try:
                    await call(b"", timeout=1.0)
                    plain_ok.append(time.monotonic())
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.1)

        poller = asyncio.create_task(poll())
        results: dict[float, Recovery] = {}
        try:
            for downtime, reps in plan.items():
                ours: list[float] = []
                plain: list[float] = []
                for _ in range(reps):
                    await fake.stop()
                    await asyncio.sleep(downtime)
                    await fake.start()
                    t0 = fake.started_at
                    assert t0 is not None
                    await watch.until(lambda: any(s > t0 for s in watch.successes), 30)
                    ours.append(min(s for s in watch.successes if s > t0) - t0)
                    await wait_until(
                        lambda: any(s > t0 for s in plain_ok), 200, what="the plain channel answered"
                    )
                    plain.append(min(s for s in plain_ok if s > t0) - t0)
                    await asyncio.sleep(1.5)  # let both settle before the next restart
                results[downtime] = Recovery(tuple(ours), tuple(plain))
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await channel.close()
            await stop_agent(agent, task)
            await fake.stop(remove_socket=True)
    return Reconnect(results)


RECONNECT = section(
    Section(
        name="reconnect",
        title="reconnection after a kubelet restart, ours vs a plain grpc.aio channel",
        order=10,
        full={1.0: 10, 10.0: 3, 30.0: 2},
        quick={1.0: 3, 10.0: 1},
        run=bench_reconnect,
    )
)


@part((1, 0))
def render(results: Results) -> list[str]:
    r = results.get(RECONNECT)
    if r is None:
        return []
    lines = [
        "## 1. Reconnection after a kubelet restart",
        "",
        "From the new socket's rename into place to the first successful GetAllocatableResources. Ours: the",
        "agent (directory watch, fresh channel). Baseline, in the same run against the same restarts: a plain",
        "grpc.aio channel with default reconnect settings, polled every 100 ms.",
        "",
        "| downtime | n | ours p50 | ours p99 | plain p50 | plain p99 | plain / ours (p50) | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for downtime, res in r.by_downtime.items():
        ours, plain = res.ours, res.plain
        ratio = statistics.median(plain) / max(statistics.median(ours), 1e-6)
        goal = pct(ours, 99) <= 0.05 and (downtime < 10 or ratio >= 100)
        lines.append(
            f"| {downtime:g} s | {len(ours)} | {ms(statistics.median(ours))} | {ms(pct(ours, 99))} | "
            f"{ms(statistics.median(plain))} | {ms(pct(plain, 99))} | {ratio:.0f}x | {verdict(goal)} |"
        )
    return [
        *lines,
        "",
        "Goal: ours p99 <= 50 ms at every downtime, and >= 100x faster than the plain channel at 10 s and 30 s.",
        "",
    ]
