"""Section 5: the agent's RSS after start, halfway and after many unchanged cycles, in a process
of its own (bench/cycles.py), the kubelet in another."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.figures import verdict
from bench.harness import ROOT, kubelet_process
from bench.registry import Results, Section, part, section

__all__ = ["MEMORY", "Memory", "bench_memory"]


@dataclass(frozen=True)
class Memory:
    """RSS in MiB at three points of `cycles` unchanged cycles that took `seconds`."""

    start: float
    middle: float
    end: float
    seconds: float
    events: float
    commit_failures: float
    cycles: int


async def bench_memory(cycles: int) -> Memory:
    """The agent's cycles in a process of their own (bench/cycles.py): its RSS, not ours."""
    with tempfile.TemporaryDirectory(prefix="prw-b5-", dir="/tmp") as tmp:
        root = Path(tmp)
        with kubelet_process(root, shuffle=False) as sock:
            result = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    str(ROOT / "bench" / "cycles.py"),
                    str(sock),
                    str(root / "state"),
                    str(cycles),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=1800,
            )
    return Memory(**json.loads(result.stdout), cycles=cycles)


MEMORY = section(
    Section(
        name="memory",
        title="RSS after start and after many unchanged cycles",
        order=50,
        full=100_000,
        quick=2000,
        run=bench_memory,
    )
)


@part((5, 0))
def render(results: Results) -> list[str]:
    m = results.get(MEMORY)
    if m is None:
        return []
    assert m.commit_failures == 0, "the memory section's cycles failed to commit"
    growth = m.end - m.start
    return [
        "## 5. Memory",
        "",
        f"RSS of the agent's process over {m.cycles:,} unchanged cycles ({m.seconds:.0f} s), the kubelet in another process.",
        "",
        "| after start | halfway | at the end | growth | goal |",
        "|---|---|---|---|---|",
        f"| {m.start:.1f} MiB | {m.middle:.1f} MiB | {m.end:.1f} MiB | {growth:+.1f} MiB | {verdict(m.end <= 64 and growth <= 2)} |",
        "",
        "Goal: <= 64 MiB steady, growth <= 2 MiB.",
        "",
    ]
