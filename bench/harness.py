"""What the sections share to drive a real Agent against the simulated kubelet: its settings, an
awaitable record of its events and answered re-queries, and a fake kubelet in a process of its own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watcher.app import Agent
from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.settings import HttpSettings, KubeletSettings, Settings, WatchSettings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node

__all__ = [
    "ALLOC",
    "GPU",
    "LIST",
    "NIC",
    "ROOT",
    "Watch",
    "run_agent",
    "settings_for",
    "start_fake",
    "stop_agent",
    "watched_agent",
]

ROOT = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
ALLOC = "/v1.PodResourcesLister/GetAllocatableResources"
LIST = "/v1.PodResourcesLister/List"


def settings_for(root: Path, fake: FakeKubelet, **watch: Any) -> Settings:
    return Settings(
        node="bench-node",
        state_dir=root / "state",
        kubelet=KubeletSettings(socket=fake.socket_path, root_dir=fake.root, unreachable_grace=120),
        watch=WatchSettings(**watch),
        http=HttpSettings(enabled=False),
        sinks=(),
    )


class Watch:
    """Awaitable record of an agent's events and successful queries."""

    def __init__(self, agent: Agent) -> None:
        self.events: list[tuple[float, Event]] = []
        self.successes: list[float] = []
        self._changed = asyncio.Event()
        agent.subscribe(self._on_event)
        agent.subscribe_cycles(self._on_cycle)
        self.agent = agent
        self._last_success: float | None = None

    def _on_event(self, event: Event) -> None:
        self.events.append((time.monotonic(), event))
        self._changed.set()

    def _on_cycle(self, _: frozenset[str]) -> None:
        last = self.agent.reactor.last_success  # moves on every answered re-query
        if last is not None and last != self._last_success:
            self._last_success = last
            self.successes.append(last)
        self._changed.set()

    def saw(self, kind: Kind, since: int) -> bool:
        """Whether an event of `kind` came after the first `since` events."""
        return any(e.kind == kind for _, e in self.events[since:])

    async def until(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


async def run_agent(agent: Agent) -> asyncio.Task[None]:
    return asyncio.create_task(agent.run())


async def stop_agent(agent: Agent, task: asyncio.Task[None]) -> None:
    agent.stop.set()
    await asyncio.wait_for(task, 20)


async def watched_agent(root: Path) -> tuple[FakeKubelet, Agent, Watch, asyncio.Task[None]]:
    """A started fake kubelet (limit high enough not to be measured) and an agent that has answered."""
    fake = FakeKubelet(root / "kubelet", default_node(), rate=1000, burst=100)
    await fake.start()
    agent = Agent(settings_for(root, fake))
    watch = Watch(agent)
    task = await run_agent(agent)
    await watch.until(lambda: bool(watch.successes), 20)
    return fake, agent, watch, task


def start_fake(root: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """`python -m watcher fake-kubelet` in a process of its own, its rate limit out of the way."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "watcher",
            "fake-kubelet",
            "--root",
            str(root),
            "--rate",
            "1000000",
            "--burst",
            "1000000",
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "serving" in line, line
    return proc, root / "pod-resources" / "kubelet.sock"
