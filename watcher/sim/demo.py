"""The demo: a simulated kubelet, the full watcher, and a scripted story, in well under 30 s.

Everything runs in this process on loopback and a temporary directory: the
fake kubelet (pod-resources, and the Pods API with the pods' owners and DRA
device health), the agent with a console sink, an audit-log file sink, a
signed CloudEvents webhook and a PagerDuty sink, both to a local receiver
that prints what it gets.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from aiohttp import web

from watcher.app import Agent
from watcher.model.events import Event
from watcher.ops.logs import configure_logging
from watcher.secrets import Secret
from watcher.settings import HttpSettings, KubeletSettings, LogSettings, Settings, WatchSettings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import (
    FakeClaim,
    FakeClaimDevice,
    FakeContainer,
    FakeNode,
    FakeOwner,
    FakePod,
    default_node,
)
from watcher.sim.fake_plugins import Warmup
from watcher.sinks.audit import verify_files
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.pagerduty import PagerDutySinkSettings
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.sinks.webhook import WebhookSinkSettings
from watcher.supervision import StoppedError, stop_on_signals, unless_stopped

__all__ = ["run_demo"]

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
# A GPU a DRA driver hands out through a ResourceClaim: its health is the driver's verdict, which
# only the holder's Pod status (the Pods API) shows, in the driver's own words.
DRA_DRIVER, DRA_POOL, DRA_GPU = "gpu.nvidia.com", "demo-node", "gpu-0"
DRA_MESSAGE = "critical XID 79 reported by NVML"
ROUTING_KEY = "demo" * 8  # PagerDuty's integration keys are 32 characters
STEP_TIMEOUT_S = 10.0
PAUSE_S = 0.7


class _Receiver:
    """A local endpoint that prints what it receives: the webhook's CloudEvents, and PagerDuty's
    Events API v2 triggers (the page's summary, which names who is hit first) and resolves."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.received = 0
        self.pages = 0
        self.resolves = 0
        app = web.Application()
        app.router.add_post("/events", self.handle)
        app.router.add_post("/v2/enqueue", self.page)
        self.runner = web.AppRunner(app, access_log=None)
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received += 1
        signed = "signed" if "webhook-signature" in request.headers else "unsigned"
        print(f"    webhook <- {body['type']} ({signed}, id {body['id'][:8]})", file=self.out, flush=True)
        return web.Response(status=204)

    async def page(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["event_action"] == "trigger":
            self.pages += 1
            print(f"    page    <- trigger: {body['payload']['summary']}", file=self.out, flush=True)
        else:
            self.resolves += 1
            print(f"    page    <- {body['event_action']} {body['dedup_key']}", file=self.out, flush=True)
        answer = {"status": "success", "message": "Event processed", "dedup_key": body["dedup_key"]}
        return web.json_response(answer, status=202)

    async def start(self) -> None:
        await self.runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self.runner, sock).start()

    async def stop(self) -> None:
        await self.runner.cleanup()


class _Story:
    def __init__(self, agent: Agent, out: TextIO) -> None:
        self.agent = agent
        self.out = out
        self.events: list[Event] = []
        self._changed = asyncio.Event()
        self.warmups = 0  # kubelet restarts that warmed up like a real kubelet's
        self.false_alarms = 0  # events during those that the story did not cause
        agent.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, kind: str, since: int) -> None:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while not any(e.kind == kind for e in self.events[since:]):
                self._changed.clear()
                await self._changed.wait()

    async def step(
        self,
        title: str,
        act: Callable[[], object],
        expect: str,
        *,
        warmup: FakeKubelet | None = None,
        caused: frozenset[str] = frozenset(),
    ) -> None:
        """Act, wait for the event the act causes; after a restart with `warmup`, also until the
        node has settled, counting any event but `expect` and `caused` as a false alarm."""
        print(f"\n== {title}", file=self.out, flush=True)
        mark = len(self.events)
        result = act()
        if asyncio.iscoroutine(result):
            await result
        await self.wait_for(expect, mark)
        if warmup is not None:
            await self._settled(warmup)
            self.warmups += 1
            self.false_alarms += sum(1 for e in self.events[mark:] if e.kind not in {expect, *caused})
        await _delivered(self.agent)
        # A breath between steps: readable, and the agent's RPC budget (5/s) refills.
        await asyncio.sleep(PAUSE_S)

    async def _settled(self, fake: FakeKubelet) -> None:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await fake.plugins.wait_settled()
            while self.agent.settling.holding:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the agent settles on its own clock: nothing to await
        print("    node settled: nothing the warm-up explains was reported", file=self.out, flush=True)


async def _delivered(agent: Agent) -> None:
    """Until every sink's queue is empty, so the story's output stays in order."""
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while any([(await agent.outbox.stats(n)).depth for n in agent.dispatcher.workers]):  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # the workers drain on their own schedule: nothing to await


def _demo_node() -> FakeNode:
    """The built-in node (Job ml/llm-pretrain's trainer-0 holds four device-plugin GPUs), plus a
    pod of Job ml/llm-finetune holding a GPU through a DRA claim, as a Job's pods get theirs from
    a ResourceClaimTemplate."""
    node = default_node()
    gpu = FakeClaimDevice(DRA_DRIVER, DRA_POOL, DRA_GPU, [f"nvidia.com/gpu={DRA_GPU}"])
    claim = FakeClaim("ml", "llm-finetune-0-gpu", [gpu], request="gpu")
    node.add_pod(
        FakePod(
            "ml",
            "llm-finetune-0-x7k2p",
            [FakeContainer("trainer", claims=[claim])],
            labels={"team": "research"},
            owners=[FakeOwner("Job", "llm-finetune", api_version="batch/v1")],
        )
    )
    return node


def _settings(root: Path, fake: FakeKubelet, receiver: _Receiver, audit: Path) -> Settings:
    secret = "whsec_" + base64.b64encode(random.randbytes(32)).decode()
    return Settings(
        node="demo-node",
        state_dir=root / "state",
        # The Pods API ([pods] api, on by default) is served under the same root_dir: the agent
        # watches it, so events name each pod's owner and a DRA device's health comes in.
        kubelet=KubeletSettings(socket=fake.socket_path, root_dir=root / "kubelet", unreachable_grace=10),
        watch=WatchSettings(interval=10),
        log=LogSettings(level="warning"),
        http=HttpSettings(listen="127.0.0.1:0"),
        sinks=(
            StdoutSinkSettings(name="console", format="text"),
            FileSinkSettings(name="audit", path=audit),
            WebhookSinkSettings(
                name="webhook",
                url=Secret(value=receiver.url("/events")),
                format="cloudevents",
                signing_secret=Secret(value=secret),
                rate=100,
            ),
            # Pages only: critical conditions, resolved at once (no hold-down) so the story shows both.
            PagerDutySinkSettings(
                name="pager",
                routing_key=Secret(value=ROUTING_KEY),
                endpoint=receiver.url("/v2/enqueue"),
                min_severity="critical",
                rate=100,
                resolve_hold_down=0,
            ),
        ),
    )


async def _play(story: _Story, fake: FakeKubelet, out: TextIO) -> None:
    """The scripted story, step by step."""
    await story.step(
        "Baseline: the watcher starts and takes the node's inventory", lambda: None, "watcher.started"
    )
    # From now on the kubelet comes back from a restart as a real one does: each device
    # plugin registers again after a second or two, List fills in.
    fake.plugins.warmup = Warmup(plugin_delay=(0.5, 2.0), pods_delay=(0.0, 0.5))
    fake.plugins.on_register = lambda resource: print(
        f"    device plugin for {resource} registered again", file=out, flush=True
    )
    await story.step(
        "A GPU is hot-plugged on NUMA node 1",
        lambda: fake.add_device(GPU, "GPU-hotplug-0", (1,)),
        "device.added",
    )
    trainer_gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    await story.step(
        "A GPU fails while allocated to ml/trainer-0",
        lambda: fake.make_unhealthy(GPU, trainer_gpu),
        "device.removed",
    )
    await story.step("The GPU heals", lambda: fake.heal(GPU, trainer_gpu), "device.added")
    await story.step(
        "A GPU held through a DRA claim fails: its driver reports it Unhealthy, in its own words",
        lambda: fake.dra.set_health(DRA_DRIVER, DRA_POOL, DRA_GPU, "Unhealthy", DRA_MESSAGE),
        "device.unhealthy",
    )
    await story.step(
        "The DRA driver reports the GPU Healthy again",
        lambda: fake.dra.set_health(DRA_DRIVER, DRA_POOL, DRA_GPU, "Healthy"),
        "device.healthy",
    )
    await story.step(
        "A pod allocates a NIC",
        lambda: fake.allocate("net", "edge-proxy-0", "proxy", devices={NIC: ["0000:86:02.2"]}),
        "allocation.added",
    )
    await story.step(
        "The kubelet restarts (socket replaced); its device plugins come back one by one",
        lambda: fake.restart(downtime=0.3),
        "kubelet.restarted",
        warmup=fake,
    )
    await story.step(
        "The kubelet restarts with fewer allocatable CPUs",
        lambda: fake.restart(cpu_ids=set(range(2, 64)) - {48, 49}),
        "cpu.removed",
        warmup=fake,
        caused=frozenset({"kubelet.restarted", "capacity.changed"}),
    )


async def run_demo(*, forever: bool = False, out: TextIO | None = None, seed: int | None = None) -> int:
    out = out if out is not None else sys.stdout
    configure_logging("warning", "console")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prw-demo-") as tmp:
        root = Path(tmp)
        fake = FakeKubelet(root / "kubelet", _demo_node(), seed=seed, node_name="demo-node")
        receiver = _Receiver(out)
        await receiver.start()
        audit = root / "state" / "audit.jsonl"
        settings = _settings(root, fake, receiver, audit)
        print(f"Simulated kubelet: {fake.socket_path}, its Pods API beside it", file=out)
        print(f"Sinks: console (below), audit log {audit},", file=out)
        print(
            f"       signed CloudEvents webhook and PagerDuty to a receiver on 127.0.0.1:{receiver.port}",
            file=out,
        )
        await fake.start()
        agent = Agent(settings)
        story = _Story(agent, out)
        task = asyncio.create_task(agent.run(), name="demo-agent")
        try:
            await _play(story, fake, out)
            await _delivered(agent)
            if forever:
                await _churn_until_interrupted(fake, random.Random(seed), out)
        finally:
            agent.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
            await fake.stop(remove_socket=True)
            await receiver.stop()
        _summary(agent, story, receiver, audit, time.monotonic() - started, out)
    return 0


async def _churn_until_interrupted(fake: FakeKubelet, rng: random.Random, out: TextIO) -> None:
    interrupted = asyncio.Event()
    with stop_on_signals(interrupted):
        # Said only once Ctrl-C is ours to handle.
        print("\n== Random churn until Ctrl-C", file=out, flush=True)
        with contextlib.suppress(StoppedError):
            await unless_stopped(interrupted, _churn(fake, rng))


async def _churn(fake: FakeKubelet, rng: random.Random) -> None:
    n = 0
    while True:
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        n += 1
        choice = rng.randrange(4)
        if choice == 0:
            fake.add_device(GPU, f"GPU-churn-{n}", (rng.randrange(2),))
        elif choice == 1:
            extra = [k for k in fake.node.devices if k[1].startswith("GPU-churn-")]
            if extra:
                fake.remove_device(*rng.choice(extra))
        elif choice == 2:
            fake.allocate("churn", f"job-{n}", "main", cpu_ids=[rng.randrange(64, 92)])
        else:
            await fake.restart(downtime=rng.uniform(0, 0.5))


def _summary(
    agent: Agent, story: _Story, receiver: _Receiver, audit: Path, elapsed: float, out: TextIO
) -> None:
    kinds = Counter(str(e.kind) for e in story.events)
    print("\n== Summary", file=out)
    print(
        f"events: {len(story.events)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})", file=out
    )
    for name, worker in sorted(agent.dispatcher.workers.items()):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(worker.counts.items())) or "nothing"
        print(f"deliveries to {name}: {counts}", file=out)
    print(f"webhook receiver got {receiver.received} signed CloudEvents", file=out)
    print(f"pages: {receiver.pages} triggered, {receiver.resolves} resolved", file=out)
    print(
        f"kubelet restarts with a warm-up: {story.warmups}, "
        f"absorbed with {story.false_alarms} false alarm(s)",
        file=out,
    )
    latency = agent.reactor.last_reconnect_latency
    if latency is not None:
        ms = latency * 1000
        print(
            f"reconnect after the last kubelet restart: {ms:.0f} ms from the new socket to an answer",
            file=out,
        )
    files = sorted(audit.parent.glob(audit.name + "*"))
    result = verify_files(files) if files else None
    if result is not None:
        gaps = f", {len(result.gaps)} gap record(s)" if result.gaps else ""
        verdict = f"intact{gaps}" if result.ok else f"BROKEN: {result.problem}"
        print(f"audit log: {verdict}, {result.records} records chained", file=out)
    print(f"demo finished in {elapsed:.1f} s", file=out)
