"""What the sections share to drive a real Agent against the simulated kubelet: its settings, an
awaitable record of its events and answered re-queries, and a fake kubelet in a process of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testkit.changes import Changes
from testkit.processes import fake_kubelet_process
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
    "kubelet_process",
    "run_agent",
    "settings_for",
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


class Watch(Changes):
    """Awaitable record of an agent's events and successful queries: `until(predicate, timeout)`
    checks again after each one."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.events: list[tuple[float, Event]] = []
        self.successes: list[float] = []
        self.cycles: list[tuple[float, frozenset[str]]] = []  # each re-query's end and its reasons
        agent.subscribe(self._on_event)
        agent.subscribe_cycles(self._on_cycle)
        self.agent = agent
        self._last_success: float | None = None

    def _on_event(self, event: Event) -> None:
        self.events.append((time.monotonic(), event))
        self.notify()

    def _on_cycle(self, reasons: frozenset[str]) -> None:
        self.cycles.append((time.monotonic(), reasons))
        last = self.agent.reactor.last_success  # moves on every answered re-query
        if last is not None and last != self._last_success:
            self._last_success = last
            self.successes.append(last)
        self.notify()

    def reasons_at(self, at: float) -> frozenset[str]:
        """The reasons of the re-query whose events were stored at `at` (the first to end then or
        after: its observers run once its events are stored)."""
        return next((r for t, r in self.cycles if t >= at), frozenset())

    def saw(self, kind: Kind, since: int) -> bool:
        """Whether an event of `kind` came after the first `since` events."""
        return any(e.kind == kind for _, e in self.events[since:])


async def run_agent(agent: Agent) -> asyncio.Task[None]:
    return asyncio.create_task(agent.run())


async def stop_agent(agent: Agent, task: asyncio.Task[None]) -> None:
    agent.stop.set()
    await asyncio.wait_for(task, 20)


async def watched_agent(root: Path, **settings: Any) -> tuple[FakeKubelet, Agent, Watch, asyncio.Task[None]]:
    """A started fake kubelet (limit high enough not to be measured) and an agent that has answered
    (`settings`: its [watch] settings other than the defaults)."""
    fake = FakeKubelet(root / "kubelet", default_node(), rate=1000, burst=100)
    await fake.start()
    agent = Agent(settings_for(root, fake, **settings))
    watch = Watch(agent)
    task = await run_agent(agent)
    await watch.until(lambda: bool(watch.successes), 20)
    return fake, agent, watch, task


@contextmanager
def kubelet_process(root: Path, *, node: str = "default", shuffle: bool = True) -> Iterator[Path]:
    """`python -m watcher fake-kubelet` in a process of its own, its rate limit out of the way, for
    the block; its socket."""
    with fake_kubelet_process(root, node=node, shuffle=shuffle, rate=1_000_000, burst=1_000_000):
        yield root / "pod-resources" / "kubelet.sock"
