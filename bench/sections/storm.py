"""Section 7: kubelet friendliness. The largest 1 s burst of calls during a storm of checkpoint
rewrites, beside the calls per minute at steady state that section 2 measured."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.figures import verdict
from bench.harness import stop_agent, watched_agent
from bench.registry import Results, Section, part, section
from bench.sections.change import CHANGE

__all__ = ["STORM", "Storm", "bench_storm"]


@dataclass(frozen=True)
class Storm:
    triggers: int
    storm_s: float
    calls: int
    max_per_1s: int
    limit: float  # the agent's max_rpc_rate


async def bench_storm(triggers: int) -> Storm:
    with tempfile.TemporaryDirectory(prefix="prw-b7-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake, agent, _, task = await watched_agent(root)
        await asyncio.sleep(1.5)
        first = len(fake.call_times)
        checkpoint = fake.checkpoint_path
        t0 = time.monotonic()
        for i in range(triggers):
            # As the kubelet does: write a temp file, rename it over the checkpoint.
            tmp_file = checkpoint.with_name(f".storm-{i}")
            tmp_file.write_text(str(i))
            os.replace(tmp_file, checkpoint)
            if i % 50 == 0:
                await asyncio.sleep(max(0.0, t0 + (i + 1) / triggers - time.monotonic()))
        storm_s = time.monotonic() - t0
        await asyncio.sleep(3)
        times = list(fake.call_times)[first:]
        worst = 0
        j = 0
        for i, t in enumerate(times):
            while t - times[j] >= 1.0:
                j += 1
            worst = max(worst, i - j + 1)
        await stop_agent(agent, task)
        await fake.stop(remove_socket=True)
    return Storm(triggers, storm_s, len(times), worst, agent.settings.watch.max_rpc_rate)


STORM = section(
    Section(
        name="storm",
        title="the largest 1 s burst of calls in a trigger storm",
        order=70,
        full=1000,
        quick=300,
        run=bench_storm,
    )
)


@part((7, 0))
def render(results: Results) -> list[str]:
    c, s = results.get(CHANGE), results.get(STORM)
    if c is None and s is None:
        return []
    lines = ["## 7. Kubelet friendliness", "", "| measure | value | goal |", "|---|---|---|"]
    if c is not None:
        lines.append(
            f"| calls per minute at steady state, default settings (over {c.steady_window_s:.0f} s) | "
            f"{c.steady_calls_per_min:.1f} | |"
        )
    if s is not None:
        lines.append(
            f"| largest number of calls in any 1 s window during {s.triggers:,} checkpoint rewrites in "
            f"{s.storm_s:.1f} s | {s.max_per_1s} (of {s.calls} calls) | "
            f"{verdict(s.max_per_1s <= s.limit)} (limit {s.limit:g}/s) |"
        )
    return [*lines, ""]
