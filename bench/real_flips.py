"""What bench/real_kubelet.py measures against each kubelet, the same way: an in-process agent with
default settings (the audit file sink, no HTTP server), a device's health flipped at its source
N times each way, each flip timed from the call that makes it to the agent's stored event (its
observers run once the event is committed to the outbox), and, where the kubelet has a Pods API,
a second client of it that stamps each pod event on arrival, to split a flip into the kubelet's
own part (to the pod's status changing on the Pods API) and ours (from there to the stored event).

The kubelet-lite and fake rounds here are the same flip at the stand-ins, in the same run, for the
side-by-side rows.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from bench.harness import GPU, Watch, run_agent, stop_agent
from testkit.changes import Changes
from testkit.kubelet_lite import KubeletLite
from testkit.peers import PEERS_BIN
from testkit.waiting import wait_until
from watcher import errors
from watcher.app import Agent
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.changes import Kind
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.events import Event
from watcher.settings import HttpSettings, KubeletSettings, Settings, pods_api_socket
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sinks.file import FileSinkSettings
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.decoding import pod_meta

__all__ = [
    "EVENT_S",
    "FlipSeries",
    "PodSightings",
    "agent_settings",
    "fake_round",
    "flip_series",
    "in_process_agent",
    "lite_round",
    "plugin_event",
    "quiet_cycle",
]

START_S = 60.0  # the agent's start on a busy 2-core machine (the first answer, the Pods API's snapshot)
EVENT_S = 30.0  # a flip's event: the kubelet's health paths take under a second; the slack is the machine's
SIGHT_S = 5.0  # the Pods API's view of a flip, once its event is stored: none within this is "not shown"


@dataclass(frozen=True)
class FlipSeries:
    """N flips one way: seconds from each flip to the stored event; to the pod's status changing on
    the Pods API (None: not shown there); and the trigger reasons of the re-query that stored it."""

    total: tuple[float, ...]
    kubelet: tuple[float | None, ...]
    reasons: tuple[str, ...]


def agent_settings(root: Path, node: str, kubelet_root: Path) -> Settings:
    """Defaults but for where the files are: the audit log as the one sink, the HTTP server off
    (nothing scrapes it here)."""
    return Settings(
        node=node,
        state_dir=root / "state",
        kubelet=KubeletSettings(
            socket=kubelet_root / "pod-resources" / "kubelet.sock", root_dir=kubelet_root
        ),
        http=HttpSettings(enabled=False),
        sinks=(FileSinkSettings(path=root / "state" / "audit.jsonl", name="audit"),),
    )


_MARKS = iter(range(1, 1 << 30))


async def quiet_cycle(agent: Agent, watch: Watch) -> None:
    """One more complete re-query, waited for: what was pending is stored by then."""
    mark = f"bench-{next(_MARKS)}"
    agent.wake(mark)
    await watch.until(lambda: any(mark in r for _, r in watch.cycles), EVENT_S)


@asynccontextmanager
async def in_process_agent(settings: Settings) -> AsyncIterator[tuple[Agent, Watch]]:
    """The agent running in this process; yields once it has started, its Pods API watch (if the
    kubelet has one) is live and its warm-up holds nothing back."""
    agent = Agent(settings)
    watch = Watch(agent)
    pods = agent.pods_watch
    if pods is not None and pods.on_state is not None:
        told = pods.on_state

        def on_state(state: str, detail: str) -> None:
            told(state, detail)
            watch.notify()

        pods.on_state = on_state
    task = await run_agent(agent)
    try:
        await watch.until(lambda: bool(watch.events), START_S)
        if pods is not None and pods_api_socket(settings).exists():
            await watch.until(lambda: pods.state == "watching", START_S)
        await quiet_cycle(agent, watch)
        # The warm-up's holds end on the clock (the pod list stable for a while): nothing to await.
        await wait_until(lambda: not agent.settling.holding, START_S, interval=0.25, what="warm-up over")
        await quiet_cycle(agent, watch)
        yield agent, watch
    finally:
        await stop_agent(agent, task)


class PodSightings:
    """A second client of the kubelet's Pods API: every pod event, decoded, stamped on arrival
    (time.monotonic(), the clock the agent's events are stamped on)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.seen: list[tuple[float, PodMeta]] = []
        self.changes = Changes()
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodSightings:
        self._task = asyncio.create_task(self._run(), name="bench-pod-sightings")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with PodsApiClient(str(self.socket), timeout=10.0) as client:
            try:
                async for kind, raw in client.watch():
                    at = time.monotonic()
                    if kind in (pods_pb2.DELETED, pods_pb2.INITIAL_SYNC_COMPLETE):
                        continue
                    try:
                        self.seen.append((at, pod_meta(raw, labels=())))
                    except errors.PodDecodeError:
                        continue
                    self.changes.notify()
            except errors.KubeletError as err:  # the split is then "not shown", the rest measured
                self.error = str(err)
                self.changes.notify()

    def first(self, since: float, match: Callable[[PodMeta], bool]) -> tuple[float, PodMeta] | None:
        return next(((at, m) for at, m in self.seen if at >= since and match(m)), None)

    async def when(self, since: float, match: Callable[[PodMeta], bool], timeout: float) -> float | None:
        """When a pod matching `match` was first seen at or after `since` (waiting up to
        `timeout` s for it), else None."""
        with suppress(TimeoutError):
            await self.changes.until(
                lambda: self.error is not None or self.first(since, match) is not None, timeout
            )
        hit = self.first(since, match)
        return None if hit is None else hit[0]


def _reasons(watch: Watch, at: float) -> str:
    return ",".join(sorted(watch.reasons_at(at))) or "none"


async def flip_series(
    agent: Agent,
    watch: Watch,
    n: int,
    flip: Callable[[bool], Awaitable[None]],
    stored: Callable[[Event, bool], bool],
    *,
    rng: random.Random,
    sightings: PodSightings | None = None,
    shown: Callable[[PodMeta, bool], bool] | None = None,
) -> dict[str, FlipSeries]:
    """`n` flips to unhealthy and `n` back, alternating: `flip(healthy)` makes one, `stored(event,
    healthy)` picks its event, `shown(pod, healthy)` (with `sightings`) its pod on the Pods API."""
    got: dict[bool, tuple[list[float], list[float | None], list[str]]] = {
        h: ([], [], []) for h in (False, True)
    }
    for k in range(2 * n):
        healthy = k % 2 == 1
        # Spaced so that our own RPC cap (5 calls in any second) is not what is measured, and at a
        # random moment of the directory watch's step (a fixed spacing would hit the same point).
        await asyncio.sleep(1.0 + rng.uniform(0.0, 0.5))
        mark = len(watch.events)
        t0 = time.monotonic()
        await flip(healthy)
        await watch.until(lambda: any(stored(e, healthy) for _, e in watch.events[mark:]), EVENT_S)
        at = next(t for t, e in watch.events[mark:] if stored(e, healthy))
        # The re-query's observers run once its events are stored: its reasons come just after.
        with suppress(TimeoutError):
            await watch.until(lambda: any(t >= at for t, _ in watch.cycles), 2.0)
        total, kubelet, reasons = got[healthy]
        total.append(at - t0)
        reasons.append(_reasons(watch, at))
        seen = None
        if sightings is not None and shown is not None:
            seen = await sightings.when(t0, lambda m: shown(m, healthy), SIGHT_S)
        kubelet.append(None if seen is None else seen - t0)
    await quiet_cycle(agent, watch)
    return {
        "unhealthy" if not h else "healthy": FlipSeries(tuple(t), tuple(k), tuple(r))
        for h, (t, k, r) in got.items()
    }


# --- the stand-ins, the same flip in the same run ---


def plugin_event(resource: str, device: str) -> Callable[[Event, bool], bool]:
    """A device plugin's device leaving allocatable (unhealthy) or joining it again: the kubelet's
    only word on it in pod-resources."""

    def stored(event: Event, healthy: bool) -> bool:
        want = Kind.DEVICE_ADDED if healthy else Kind.DEVICE_REMOVED
        return event.kind == want and (event.details.get("resource"), event.details.get("device")) == (
            resource,
            device,
        )

    return stored


async def lite_round(root: Path, resource: str, n: int, rng: random.Random) -> dict[str, FlipSeries]:
    """kubelet-lite (upstream's device manager and pod-resources server), our device plugin, one
    pod holding one of its two GPUs; that GPU flipped at the plugin."""
    lite = KubeletLite(
        PEERS_BIN / "kubelet-lite", PEERS_BIN / "device-plugin", root / "kubelet", numa_nodes=1
    )
    async with lite:
        plugin = await lite.add_plugin(resource, {"gpu0": [0], "gpu1": [0]})
        held = (await lite.admit("bench", "holder", {"main": {resource: 1}}))["main"][resource][0]
        settings = agent_settings(root / "agent", "bench-node", lite.root)
        async with in_process_agent(settings) as (agent, watch):
            return await flip_series(
                agent,
                watch,
                n,
                lambda healthy: plugin.set_healthy(held, healthy),
                plugin_event(resource, held),
                rng=rng,
            )


async def fake_round(root: Path, n: int, rng: random.Random) -> dict[str, FlipSeries]:
    """The fake kubelet in this process (it rewrites its checkpoint on a health change, as a
    kubelet does), section 2's node; the GPU a pod holds flipped."""
    fake = FakeKubelet(root / "kubelet", default_node())
    await fake.start()
    try:
        gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]

        async def flip(healthy: bool) -> None:
            fake.set_healthy(GPU, gpu, healthy)

        async with in_process_agent(agent_settings(root / "agent", "bench-node", fake.root)) as (
            agent,
            watch,
        ):
            return await flip_series(agent, watch, n, flip, plugin_event(GPU, gpu), rng=rng)
    finally:
        await fake.stop(remove_socket=True)
