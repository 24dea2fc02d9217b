"""Run N unchanged re-query cycles of a real Agent in this (otherwise idle) process and print
its RSS after start (with its anonymous and file-backed parts), halfway and at the end as JSON.
Used by the memory section (bench/sections/memory.py), so the figure is the agent's own
footprint, not the benchmark harness's.

    python bench/cycles.py SOCKET STATE_DIR CYCLES
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from watcher.app import Agent
from watcher.ops.logs import configure_logging
from watcher.settings import HttpSettings, KubeletSettings, Settings, WatchSettings

__all__ = ["agent_for_cycles", "rss_mib"]


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    return _status_mib("VmRSS")


async def agent_for_cycles(sock: Path, state: Path, root: Path | None = None, **kubelet: Any) -> Agent:
    """An Agent whose cycles a benchmark drives directly, without its own rate cap; `root`: the
    kubelet's root directory (by default the socket's grandparent), `kubelet`: more of its settings."""
    settings = Settings(
        node="bench-node",
        state_dir=state,
        kubelet=KubeletSettings(socket=sock, root_dir=root or sock.parent.parent, **kubelet),
        watch=WatchSettings(max_rpc_rate=50),
        http=HttpSettings(enabled=False),
        sinks=(),
    )
    agent = Agent(settings)
    agent.reactor.limiter.capacity = 10**9  # measure the cycle, not our own rate cap
    # As agent.run() does: open the outbox and restore the state, so commits are accepted.
    if not await agent.open():
        raise SystemExit(f"cannot open the outbox in {state}")
    return agent


async def main(sock: Path, state: Path, cycles: int) -> dict[str, float]:
    configure_logging("error", "json")  # stdout carries the result alone
    agent = await agent_for_cycles(sock, state)
    reasons = frozenset({"bench"})
    for _ in range(100):
        await agent.requery(reasons)
    # RSS is the process's own memory (anonymous: heap, objects) and the pages of the files it
    # maps (shared libraries' code), which depend on how the page cache holds those files.
    out = {"start": rss_mib(), "start_anon": _status_mib("RssAnon"), "start_file": _status_mib("RssFile")}
    t0 = time.monotonic()
    for i in range(cycles):
        await agent.requery(reasons)
        if i == cycles // 2:
            out["middle"] = rss_mib()
    out["seconds"] = time.monotonic() - t0
    out["end"] = rss_mib()
    out["events"] = agent.metrics.value("events_total")
    out["commit_failures"] = agent.metrics.value("state_commit_failures_total")
    await agent.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))))
