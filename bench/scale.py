"""The scale section's node sizes: each measured by bench/scale_agent.py in a fresh process of
its own (its RSS is the agent's at that size alone), one after the other."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.scale_agent import import_floor_mib
from watcher.settings import KubeletSettings

__all__ = ["FIT", "NodeSize", "Scale", "ScaleSize", "bench_scale"]

HERE = Path(__file__).resolve().parent
# A size of `FIT` pods: the most whose List answer fits the default receive limit.
FIT = -1


@dataclass(frozen=True)
class ScaleSize:
    pods: int  # or FIT
    cycles: int
    warmup: int = 3
    budget_s: float = 60.0  # no more measured cycles after this long (two at least)


@dataclass(frozen=True)
class NodeSize:
    """One size's run of bench/scale_agent.py: per changed cycle, CPU and wall seconds and bytes
    written; RSS in MiB; the first full decode's seconds."""

    pods: int
    fit: bool  # the most pods whose List answer fits the receive limit
    list_bytes: int
    cpu: tuple[float, ...]
    wall: tuple[float, ...]
    written: tuple[int, ...]
    rss_steady_mib: float
    rss_peak_mib: float
    first_cycle_s: float


@dataclass(frozen=True)
class Scale:
    import_floor_mib: float
    max_receive_bytes: int
    sizes: tuple[NodeSize, ...]


async def bench_scale(sizes: Sequence[ScaleSize]) -> Scale:
    limit = KubeletSettings().max_receive_bytes  # the default, from the code
    out: list[NodeSize] = []
    for size in sizes:
        which = ["--fit", str(limit)] if size.pods == FIT else ["--pods", str(size.pods)]
        done = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                str(HERE / "scale_agent.py"),
                *which,
                "--cycles",
                str(size.cycles),
                "--warmup",
                str(size.warmup),
                "--budget-s",
                str(size.budget_s),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scale_agent.py {' '.join(which)} failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout)
        assert result["commit_failures"] == 0, f"{which}: the agent's cycles failed to commit"
        assert result["events"] >= len(result["cpu"]), f"{which}: a change was not reported"
        out.append(
            NodeSize(
                pods=result["pods"],
                fit=size.pods == FIT,
                list_bytes=result["list_bytes"],
                cpu=tuple(result["cpu"]),
                wall=tuple(result["wall"]),
                written=tuple(result["written"]),
                rss_steady_mib=result["rss_steady_mib"],
                rss_peak_mib=result["rss_peak_mib"],
                first_cycle_s=result["first_cycle_s"],
            )
        )
    return Scale(import_floor_mib(), limit, tuple(out))
