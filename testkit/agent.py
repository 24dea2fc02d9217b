"""A running watcher against a running kubelet (the fake, or kubelet-lite), with events and
cycles to await."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import jsonschema  # type: ignore[import-untyped]  # the test extra's, untyped

from testkit.changes import Changes
from watcher.app import Agent
from watcher.model.events import Event, event_schema
from watcher.settings import HttpSettings, KubeletSettings, PodsSettings, Settings, WatchSettings
from watcher.settings_file import parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.file import FileSinkSettings
from watcher.sources.base import Source
from watcher.sources.pods_api.watch import PodChange

__all__ = [
    "AgentRun",
    "KubeletPaths",
    "Recorder",
    "Running",
    "agent_against",
    "make_settings",
    "running_agent",
    "with_config",
    "write_agent_config",
]

_VALIDATOR = jsonschema.Draft202012Validator(
    event_schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)


class Recorder:
    """Collects every event (validated against the shipped schema), counts cycles, and keeps what
    the Pods API watch reported (each pod change, once the agent has taken it)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.cycles = 0
        self.reasons: list[frozenset[str]] = []
        self.pod_changes: list[PodChange] = []
        self.task: asyncio.Task[None] | None = None
        self.changes = Changes()

    def on_event(self, event: Event) -> None:
        _VALIDATOR.validate(event.to_dict())
        self.events.append(event)
        self.changes.notify()

    def on_cycle(self, reasons: frozenset[str]) -> None:
        self.cycles += 1
        self.reasons.append(reasons)
        self.changes.notify()

    def on_pod_changes(self, changes: Sequence[PodChange], _resync: bool) -> None:
        self.pod_changes.extend(changes)
        self.changes.notify()

    def _still_running(self) -> None:
        if self.task is not None and self.task.done():
            self.task.result()  # the agent crashed: say how, not "timeout"
            raise AssertionError("the agent stopped while a test was waiting on it")

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        await self.changes.until(predicate, timeout, check=self._still_running)

    async def kinds_after(self, mark: int, count: int, timeout: float = 10.0) -> list[str]:
        """Wait until `count` events arrived after index `mark`; return their kinds."""
        await self.until(lambda: len(self.events) >= mark + count, timeout)
        return [str(e.kind) for e in self.events[mark:]]

    def kinds(self, since: int = 0) -> list[str]:
        return [str(e.kind) for e in self.events[since:]]


class KubeletPaths(Protocol):
    """Where a kubelet serves: the fake's and kubelet-lite's (testkit.kubelet_lite) alike."""

    @property
    def root(self) -> Path: ...

    @property
    def socket_path(self) -> Path: ...


@dataclasses.dataclass
class AgentRun:
    """A running agent and what it reported, whatever kubelet serves it."""

    agent: Agent
    recorder: Recorder
    task: asyncio.Task[None]
    _marks: int = dataclasses.field(default=0, init=False)

    def queries_ok(self) -> float:
        """Re-queries the kubelet answered (changed or not)."""
        m = self.agent.metrics
        return m.value("requeries_total", result="changed") + m.value("requeries_total", result="unchanged")

    async def readyz(self) -> dict[str, Any]:
        """GET /readyz from the agent's HTTP server, its JSON answer."""
        assert self.agent.http is not None
        assert self.agent.http.bound_port is not None
        url = f"http://127.0.0.1:{self.agent.http.bound_port}/readyz"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            body: dict[str, Any] = await response.json()
        return body

    async def released(self) -> None:
        """Until the agent holds nothing back (its warm-up holds end on the clock)."""
        await self.quiet_cycle()
        while self.agent.settling.holding:
            await asyncio.sleep(0.25)  # holds end on the clock (the pod list stable for a while)
            await self.quiet_cycle()

    async def pods_watching(self, timeout: float = 10.0) -> None:
        """Until the agent has started and its Pods API watch is live, then one complete re-query:
        from here a pod's change reaches the agent through the watch."""
        await self.recorder.kinds_after(0, 1, timeout)
        watch = self.agent.pods_watch
        assert watch is not None, "the Pods API watch is off in these settings"
        await self.recorder.until(lambda: watch.state == "watching", timeout)
        await self.quiet_cycle(timeout)

    async def quiet_cycle(self, timeout: float = 10.0) -> None:
        """Force one more complete re-query and wait for it: anything pending shows by then."""
        self._marks += 1
        mark = f"test-{self._marks}"
        self.agent.wake(mark)
        await self.recorder.until(lambda: any(mark in r for r in self.recorder.reasons), timeout)


@dataclasses.dataclass
class Running(AgentRun):
    """An agent against the fake kubelet, which the test scripts through `kubelet`."""

    kubelet: FakeKubelet = dataclasses.field(kw_only=True)

    async def add_devices(
        self, resource: str, devices: Iterable[tuple[str, tuple[int, ...]]], timeout: float = 10.0
    ) -> None:
        """Add each (device id, NUMA nodes) to the fake kubelet in turn, the next once the agent
        reported this one (device.added and the capacity change: two events)."""
        for device, numa in devices:
            mark = len(self.recorder.events)
            self.kubelet.add_device(resource, device, numa)
            await self.recorder.kinds_after(mark, 2, timeout)

    async def settled(self) -> None:
        """Until the fake kubelet's plugins and pods are all back and the agent holds nothing back."""
        await self.kubelet.plugins.wait_settled()
        await self.released()


def make_settings(root: Path, *, kubelet_root: Path | None = None, **overrides: Any) -> Settings:
    """The agent's settings for a test: state under `root`, the kubelet's root directory at
    `kubelet_root` (default root/kubelet, where the fake-kubelet fixtures put it)."""
    kubelet_dir = root / "kubelet" if kubelet_root is None else kubelet_root
    kubelet = KubeletSettings(
        socket=kubelet_dir / "pod-resources" / "kubelet.sock",
        root_dir=kubelet_dir,
        unreachable_grace=overrides.pop("unreachable_grace", 30.0),
    )
    watch = WatchSettings(
        interval=overrides.pop("interval", 3600.0),
        max_rpc_rate=overrides.pop("max_rpc_rate", 50.0),
        force_polling=overrides.pop("force_polling", False),
        poll_interval=overrides.pop("poll_interval", 0.1),
        state_file_triggers=overrides.pop("state_file_triggers", True),
        step=overrides.pop("step", WatchSettings.step),
    )
    http = HttpSettings(listen="127.0.0.1:0", enabled=overrides.pop("http", True))
    if "pods_api" in overrides:  # the Pods API watch on (the default) or off
        overrides["pods"] = PodsSettings(api=overrides.pop("pods_api"))
    return Settings(
        node=overrides.pop("node", "node-a"),
        http=http,
        state_dir=root / "state",
        kubelet=kubelet,
        watch=watch,
        sinks=(FileSinkSettings(path=root / "state" / "events.jsonl", name="audit"),),
        **overrides,
    )


def with_config(base: Settings, config: Mapping[str, Any]) -> Settings:
    """`base` with what `config` (a config.toml's tables, as TOML gives them) sets, checked as the
    agent's own config is: its sinks after base's; of its other tables only the keys
    it names, so a test's short intervals in `base` stay. A config with no [sinks] adds none (the
    parser's default stdout sink is not one the test asked for)."""
    parsed = parse_settings(dict(config))
    named = parsed.sinks if "sinks" in config else ()
    changes: dict[str, Any] = {"sinks": (*base.sinks, *named)}
    for section, table in config.items():
        if section == "sinks":
            continue
        if isinstance(table, Mapping):
            keys = {key: getattr(getattr(parsed, section), key) for key in table}
            changes[section] = dataclasses.replace(getattr(base, section), **keys)
        else:
            changes[section] = getattr(parsed, section)
    return dataclasses.replace(base, **changes)


@asynccontextmanager
async def _agent_task(
    settings: Settings, sources: Sequence[Source] = ()
) -> AsyncIterator[tuple[Agent, Recorder, asyncio.Task[None]]]:
    recorder = Recorder()
    agent = Agent(settings, sources=sources)
    agent.subscribe(recorder.on_event)
    agent.subscribe_cycles(recorder.on_cycle)
    # Deliveries wake waiters too, so a test can wait on what a sink received.
    agent.subscribe_deliveries(recorder.changes.notify)
    watch = agent.pods_watch
    if watch is not None:  # told after the agent took them: a test awaits what the watch read
        took = watch.on_changes

        def on_changes(changes: Sequence[PodChange], resync: bool) -> None:
            took(changes, resync)
            recorder.on_pod_changes(changes, resync)

        watch.on_changes = on_changes
        told = watch.on_state

        def on_state(state: str, detail: str) -> None:
            # A watch going live reports no event when its first snapshot has no pods (a real
            # kubelet's, initializing at first, often has none): wake the waiters all the same.
            if told is not None:
                told(state, detail)
            recorder.changes.notify()

        watch.on_state = on_state
    task = asyncio.create_task(agent.run(), name="agent-under-test")
    recorder.task = task
    task.add_done_callback(recorder.changes.notify)
    try:
        yield agent, recorder, task
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, timeout=15)


@asynccontextmanager
async def running_agent(
    settings: Settings, kubelet: FakeKubelet, sources: Sequence[Source] = ()
) -> AsyncIterator[Running]:
    """The agent against the fake kubelet `kubelet` (with `sources` beside those its settings ask for)."""
    async with _agent_task(settings, sources) as (agent, recorder, task):
        yield Running(agent, recorder, task, kubelet=kubelet)


@asynccontextmanager
async def agent_against(settings: Settings) -> AsyncIterator[AgentRun]:
    """The agent against whatever kubelet serves under `settings.kubelet` (e.g. kubelet-lite)."""
    async with _agent_task(settings) as (agent, recorder, task):
        yield AgentRun(agent, recorder, task)


def write_agent_config(
    path: Path,
    root: Path,
    kubelet: KubeletPaths,
    sinks: str,
    *,
    log_level: str = "warning",
    http: str = "",
    http_extra: str = "",
    watch_extra: str = "",
) -> Path:
    """A TOML config for the agent run as a process: state under `root`, the fake kubelet, an audit log
    at root/state/audit.jsonl, and `sinks` (more [sinks.NAME] tables). `http`: a listen address, or off;
    `http_extra` and `watch_extra`: more lines for those tables."""
    http_table = f'listen = "{http}"\n{http_extra}' if http else "enabled = false"
    path.write_text(
        f"""node = "node-a"
state_dir = "{root / "state"}"
[kubelet]
socket = "{kubelet.socket_path}"
root_dir = "{kubelet.root}"
[watch]
max_rpc_rate = 50
{watch_extra}
[log]
level = "{log_level}"
[http]
{http_table}
[sinks.audit]
type = "file"
path = "{root / "state" / "audit.jsonl"}"
{sinks}"""
    )
    return path
