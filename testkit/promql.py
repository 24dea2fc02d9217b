"""PromQL in the shipped files (alerts, dashboard) against the real thing: promtool parses it, and the
metric names it selects are ones a running agent exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from testkit.agent import make_settings, running_agent
from testkit.tools import tool
from watcher.sim.fake_kubelet import FakeKubelet

__all__ = [
    "PROMETHEUS_METRICS",
    "PROMQL_WORDS",
    "metric_names",
    "promtool",
    "sample_names",
    "scrape_running_agent",
]

# What PromQL itself spells; every other word in an expression is a metric name.
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset"}
# Prometheus' own series, not the agent's.
PROMETHEUS_METRICS = {"up"}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS...`; fails the test under CI (and skips it elsewhere) if promtool is missing."""
    return subprocess.run(
        [tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: what is left once strings, label matchers, ranges,
    grouping clauses, functions, keywords and numbers are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b[a-zA-Z_]\w*\s*\(", "(", expr)  # functions and aggregations
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*\b", expr))
    return words - PROMQL_WORDS


async def scrape_running_agent(tmp: Path) -> str:
    """/metrics of an agent watching the built-in fake node, once its audit sink has delivered (so
    the per-sink series exist too). `tmp` must be short (unix socket paths)."""
    fake = FakeKubelet(tmp / "kubelet", seed=1)
    async with fake, running_agent(make_settings(tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        # deliveries_total has a series once a sink delivered: wait for the audit sink's first.
        await run.recorder.until(lambda: run.agent.metrics.value("deliveries_total", result="delivered") > 0)
        await run.recorder.until(lambda: run.agent.http is not None and run.agent.http.bound_port is not None)
        assert run.agent.http is not None
        url = f"http://127.0.0.1:{run.agent.http.bound_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            return await response.text()


def sample_names(text: str) -> set[str]:
    """Every sample name in a Prometheus text exposition (`_total`, `_bucket`, ... included)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}
