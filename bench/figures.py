"""How BENCHMARKS.md writes a figure: percentiles, durations, sizes, verdicts."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["dur", "mib", "ms", "pct", "p50_p99", "rerun", "verdict"]


def pct(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p99 of few samples is their maximum)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def dur(x: float) -> str:
    """Milliseconds under a second, seconds from there."""
    return ms(x) if x < 1 else f"{x:.2f} s"


def p50_p99(xs: Sequence[float]) -> str:
    """Two table cells: the samples' median and p99, in milliseconds."""
    return f"{ms(statistics.median(xs))} | {ms(pct(xs, 99))}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def rerun(only: str) -> str:
    return f"Re-run this section alone: `.venv/bin/python bench/run.py --only {only}` (prints it; `--output FILE` writes it)."
