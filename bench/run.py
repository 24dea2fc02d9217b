"""`make bench`: measure the speed claims side by side and write BENCHMARKS.md.

Every figure comes from this run, on this machine. Sections:
  1. reconnection after a kubelet restart: ours vs a plain grpc.aio channel polled every 100 ms
  2. change to event: a device health flip until the event is committed (state-file triggers vs timer)
  3. unchanged re-query CPU time per cycle on a large node: ours vs a bare client
  4. changed re-query (normalize, hash, diff, events) on that node
  5. memory: RSS after start and after many unchanged cycles
  6. delivery: events/s through the outbox to a local webhook; change-to-receipt
  7. kubelet friendliness: calls per minute at steady state; the largest 1 s burst in a trigger storm

    .venv/bin/python bench/run.py [--quick] [--output BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# watcher first: it silences gRPC's C-core, which reads its settings at import.
from watcher import __version__  # noqa: I001

import grpc
from aiohttp import web
from grpc import aio

from bench.cycles import agent_for_cycles
from watcher.app import Agent
from watcher.cycle.reactor import gc_paused
from watcher.model.changes import Change, Kind, Severity
from watcher.kubelet.decoding import Decoder
from watcher.model.diff import diff
from watcher.model.events import Event, envelope
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node, large_node
from watcher.sim.fake_plugins import Warmup
from watcher.model.build import build
from watcher.kubeletapi.v1 import api_pb2, views_pb2
from watcher.ops.logs import configure_logging
from watcher.store.store import Store
from watcher.secrets import Secret
from watcher.settings import (
    HttpSettings,
    KubeletSettings,
    Settings,
    WatchSettings,
)
from watcher.sinks.webhook import WebhookSinkSettings

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
ALLOC = "/v1.PodResourcesLister/GetAllocatableResources"
LIST = "/v1.PodResourcesLister/List"


def pct(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p99 of few samples is their maximum)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


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

    async def until(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


async def _watched_agent(root: Path) -> tuple[FakeKubelet, Agent, Watch, asyncio.Task[None]]:
    """A started fake kubelet (limit high enough not to be measured) and an agent that has answered."""
    fake = FakeKubelet(root / "kubelet", default_node(), rate=1000, burst=100)
    await fake.start()
    agent = Agent(settings_for(root, fake))
    watch = Watch(agent)
    task = await _run_agent(agent)
    await watch.until(lambda: bool(watch.successes), 20)
    return fake, agent, watch, task


async def _run_agent(agent: Agent) -> asyncio.Task[None]:
    return asyncio.create_task(agent.run())


async def _stop(agent: Agent, task: asyncio.Task[None]) -> None:
    agent.stop.set()
    await asyncio.wait_for(task, 20)


# --- 1. reconnection ---


async def bench_reconnect(plan: dict[float, int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="prw-b1-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake, agent, watch, task = await _watched_agent(root)
        # The baseline: a plain channel with gRPC's default reconnect backoff, polled every 100 ms.
        channel = aio.insecure_channel(f"unix://{fake.socket_path}")
        call = channel.unary_unary(ALLOC)
        plain_ok: list[float] = []

        async def poll() -> None:
            while True:
                try:
                    await call(b"", timeout=1.0)
                    plain_ok.append(time.monotonic())
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.1)

        poller = asyncio.create_task(poll())
        results: dict[float, dict[str, list[float]]] = {}
        try:
            for downtime, reps in plan.items():
                ours: list[float] = []
                plain: list[float] = []
                for _ in range(reps):
                    await fake.stop()
                    await asyncio.sleep(downtime)
                    await fake.start()
                    t0 = fake.started_at
                    assert t0 is not None
                    await watch.until(lambda t0=t0: any(s > t0 for s in watch.successes), 30)
                    ours.append(min(s for s in watch.successes if s > t0) - t0)
                    async with asyncio.timeout(200):
                        while not any(s > t0 for s in plain_ok):
                            await asyncio.sleep(0.05)
                    plain.append(min(s for s in plain_ok if s > t0) - t0)
                    await asyncio.sleep(1.5)  # let both settle before the next restart
                results[downtime] = {"ours": ours, "plain": plain}
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await channel.close()
            await _stop(agent, task)
            await fake.stop(remove_socket=True)
    return {"reconnect": results}


# --- 2. change to event, and 7. calls per minute at steady state ---


async def bench_change_to_event(n_trigger: int, n_timer: int, steady_window: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, n in (("state-file triggers", n_trigger), ("timer only (interval 30 s)", n_timer)):
        with tempfile.TemporaryDirectory(prefix="prw-b2-", dir="/tmp") as tmp:
            root = Path(tmp)
            fake = FakeKubelet(root / "kubelet", default_node())
            await fake.start()
            triggers = mode.startswith("state")
            agent = Agent(settings_for(root, fake, state_file_triggers=triggers))
            watch = Watch(agent)
            task = await _run_agent(agent)
            await watch.until(lambda: bool(watch.events), 20)
            gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
            lat: list[float] = []
            calls_before, t_start = len(fake.call_times), time.monotonic()
            for i in range(n):
                # Spaced so that our own RPC cap (5/s) is not what is measured.
                await asyncio.sleep(1.0 if triggers else 0.0)
                mark = len(watch.events)
                t0 = time.monotonic()
                if i % 2 == 0:
                    fake.make_unhealthy(GPU, gpu)
                else:
                    fake.heal(GPU, gpu)
                want = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
                await watch.until(lambda m=mark, w=want: any(e.kind == w for _, e in watch.events[m:]), 60)
                lat.append(next(t for t, e in watch.events[mark:] if e.kind == want) - t0)
            if not triggers:
                # Steady state with default settings: just watch how often we call.
                calls_before, t_start = len(fake.call_times), time.monotonic()
                await asyncio.sleep(steady_window)
                calls = len(fake.call_times) - calls_before
                out["steady_calls_per_min"] = calls / (time.monotonic() - t_start) * 60
                out["steady_window_s"] = steady_window
            out[mode] = lat
            await _stop(agent, task)
            await fake.stop(remove_socket=True)
    return {"change_to_event": out}


# --- 8. the kubelet's warm-up ---


async def bench_warmup(restarts: int, flips: int) -> dict[str, Any]:
    """Restarts whose plugins re-register over 0.5-2 s (and pods reappear over 0.5 s): from the
    restart to the agent's settled report, beside the floor (the last plugin back); events that
    were not the restart (false alarms); and a health flip of a NIC while the GPUs' plugin is away."""
    out: dict[str, Any] = {"floor": [], "settled": [], "false_alarms": 0, "flip": []}
    with tempfile.TemporaryDirectory(prefix="prw-b8-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake = FakeKubelet(root / "kubelet", default_node(), seed=8)
        await fake.start()
        agent = Agent(settings_for(root, fake))
        watch = Watch(agent)
        task = await _run_agent(agent)
        await watch.until(lambda: bool(watch.events), 20)
        fake.plugins.warmup = Warmup(plugin_delay=(0.5, 2.0), pods_delay=(0.0, 0.5))
        registered: list[float] = []
        fake.plugins.on_register = lambda _resource: registered.append(time.monotonic())
        for _ in range(restarts):
            mark = len(watch.events)
            registered.clear()
            t0 = time.monotonic()
            await fake.restart(downtime=0.1)
            await watch.until(
                lambda m=mark: any(e.kind == Kind.KUBELET_RESTARTED for _, e in watch.events[m:]), 30
            )
            await watch.until(lambda: not agent.settling.holding, 60)
            out["settled"].append(time.monotonic() - t0)
            await fake.plugins.wait_settled()
            out["floor"].append(max(registered) - t0)
            out["false_alarms"] += sum(1 for _, e in watch.events[mark:] if e.kind != Kind.KUBELET_RESTARTED)
            await asyncio.sleep(0.5)
        # A NIC's health flips while the GPUs' plugin is away (held): reported at once.
        fake.plugins.restart_plugin(GPU, downtime=None)
        await watch.until(lambda: GPU in agent.settling.held_resources(), 10)
        nic = sorted(i for r, i in fake.node.devices if r == NIC)[0]
        for i in range(flips):
            await asyncio.sleep(1.0)  # under our own RPC cap (5/s)
            mark = len(watch.events)
            want = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
            t0 = time.monotonic()
            fake.set_healthy(NIC, nic, healthy=i % 2 == 1)
            await watch.until(lambda m=mark, w=want: any(e.kind == w for _, e in watch.events[m:]), 30)
            out["flip"].append(next(t for t, e in watch.events[mark:] if e.kind == want) - t0)
        out["still_held"] = GPU in agent.settling.held_resources()
        await _stop(agent, task)
        await fake.stop(remove_socket=True)
    return {"warmup": out}


# --- 3. unchanged re-query CPU, 5. memory ---


def _start_fake(root: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
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


async def bench_unchanged(cycles: int, blocks: int = 10) -> dict[str, Any]:
    """CPU time per unchanged cycle, ours and the bare client's, in alternating blocks against
    the same kubelet process, so both sides see the same machine noise."""
    out: dict[str, Any] = {}
    per_block = max(1, cycles // blocks)
    for label, args in (
        ("large node, shuffled answers (as the kubelet sends them)", ()),
        ("large node, identical answers", ("--no-shuffle",)),
    ):
        with tempfile.TemporaryDirectory(prefix="prw-b3-", dir="/tmp") as tmp:
            root = Path(tmp)
            proc, sock = _start_fake(root, "--node", "large", *args)
            try:
                agent = await agent_for_cycles(sock, root / "state")
                reasons = frozenset({"bench"})
                await agent.requery(reasons)  # baseline inventory
                channel = aio.insecure_channel(
                    f"unix://{sock}", options=[("grpc.max_receive_message_length", 64 << 20)]
                )
                alloc, lst = channel.unary_unary(ALLOC), channel.unary_unary(LIST)
                await alloc(b""), await lst(b"")
                events = agent.metrics.value("events_total")
                decoded = dataclasses.replace(agent.decoder.stats)
                ours = bare = 0.0
                for _ in range(blocks):
                    c0 = time.process_time()
                    for _ in range(per_block):
                        await agent.requery(reasons)
                    ours += time.process_time() - c0
                    c0 = time.process_time()
                    for _ in range(per_block):
                        a, b = await asyncio.gather(alloc(b""), lst(b""))
                        api_pb2.AllocatableResourcesResponse.FromString(a)
                        api_pb2.ListPodResourcesResponse.FromString(b)
                    bare += time.process_time() - c0
                stats = agent.decoder.stats
                n = blocks * per_block
                assert agent.metrics.value("state_commit_failures_total") == 0, "cycles failed to commit"
                out[label] = {
                    "ours": ours / n,
                    "bare": bare / n,
                    "cycles": n,
                    "events": int(agent.metrics.value("events_total") - events),
                    "same_bytes": stats.same_bytes - decoded.same_bytes,
                    "reordered": stats.reordered - decoded.reordered,
                    "pods_rebuilt": stats.pods_rebuilt - decoded.pods_rebuilt,
                }
                await channel.close()
                await agent.close()
            finally:
                proc.terminate()
                proc.wait(10)
    return {"unchanged": out}


def bench_decode_profile(rounds: int) -> dict[str, Any]:
    """Where an unchanged, reordered cycle's decoding time goes (thread CPU time, medians), beside
    the bare client's parse of the same answers: the part of section 3 that is ours."""
    fake = FakeKubelet("/nonexistent", large_node(), seed=2)
    answers = [
        (fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString())
        for _ in range(rounds)
    ]
    decoder = Decoder()
    decoder.decode(*answers[0])

    def median_of(step: Callable[[bytes, bytes], object]) -> float:
        times = []
        for alloc, lst in answers:
            t0 = time.thread_time()
            step(alloc, lst)
            times.append(time.thread_time() - t0)
        return statistics.median(times)

    return {
        "decode_profile_n": rounds,
        "decode_profile": {
            "bare parse of both answers": median_of(
                lambda a, b: (
                    api_pb2.AllocatableResourcesResponse.FromString(a),
                    api_pb2.ListPodResourcesResponse.FromString(b),
                )
            ),
            "ours: the whole decode": median_of(decoder.decode),
            "- parse both answers as views": median_of(
                lambda a, b: (views_pb2.AllocatableView.FromString(a), views_pb2.ListChunks.FromString(b))
            ),
            "- per-pod view and signature, checked (250 pods)": median_of(
                lambda _a, b: decoder._unchanged(views_pb2.ListChunks.FromString(b))
            ),
            "floor of any order-free check: each pod's container entries sorted, nothing else": median_of(
                lambda _a, b: [sorted(p.containers) for p in views_pb2.ListView.FromString(b).pod_resources]
            ),
        },
    }


async def bench_memory(cycles: int) -> dict[str, Any]:
    """The agent's cycles in a process of their own (bench/cycles.py): its RSS, not ours."""
    with tempfile.TemporaryDirectory(prefix="prw-b5-", dir="/tmp") as tmp:
        root = Path(tmp)
        proc, sock = _start_fake(root, "--no-shuffle")
        try:
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
        finally:
            proc.terminate()
            proc.wait(10)
    data = json.loads(result.stdout)
    data["cycles"] = cycles
    return {"memory": data}


# --- 4. changed re-query ---


def bench_changed(rounds: int) -> dict[str, Any]:
    """The agent's path for a changed answer: decode (views, then only what changed), hash, diff
    and the events' envelopes. Every answer is freshly shuffled, as the kubelet sends it; the
    change alternates between a device's health (allocatable side) and a pod's allocation (List)."""
    fake = FakeKubelet("/nonexistent", large_node(), seed=1)
    decoder = Decoder()

    def answers() -> tuple[bytes, bytes]:
        return fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()

    prev, _ = decoder.decode(*answers())
    _ = prev.content_hash
    times: list[float] = []
    kinds: dict[str, int] = {}
    for i in range(rounds):
        if i % 2 == 0:
            fake.set_healthy("vendor1.example.com/dev", "dev-1-7", healthy=i % 4 != 0)
        elif i % 4 == 1:
            fake.allocate("ns-5", "pod-5", "c3", cpu_ids=[500])
        else:
            fake.node.pods[("ns-5", "pod-5")].container("c3").cpu_ids.discard(500)
        wire = answers()
        t0 = time.perf_counter()
        with gc_paused():  # as the agent does
            inv, _ = decoder.decode(*wire)
            _ = inv.content_hash
            changes = diff(prev, inv)
        for c in changes:
            envelope(
                c, seq=i, node="n", cycle="c", before=prev.content_hash, after=inv.content_hash
            ).to_json()
        times.append(time.perf_counter() - t0)
        assert changes, f"round {i}: the change was not seen"
        for c in changes:
            kinds[str(c.kind)] = kinds.get(str(c.kind), 0) + 1
        prev = inv
    # For the record: the old path, a full build of every answer, on the same answers.
    full: list[float] = []
    for _ in range(min(rounds, 50)):
        wire = answers()
        t0 = time.perf_counter()
        with gc_paused():
            inv = build(
                api_pb2.AllocatableResourcesResponse.FromString(wire[0]),
                api_pb2.ListPodResourcesResponse.FromString(wire[1]),
            )
            _ = inv.content_hash
        full.append(time.perf_counter() - t0)
    return {"changed": times, "changed_kinds": kinds, "full_build": full}


# --- 6. delivery ---


class _Receiver:
    def __init__(self) -> None:
        self.count = 0
        self.ids: dict[str, float] = {}
        self.done = asyncio.Event()
        self.want = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        now = time.monotonic()
        for item in body if isinstance(body, list) else [body]:
            self.ids.setdefault(item["id"], now)
        self.count = len(self.ids)
        if self.want and self.count >= self.want:
            self.done.set()
        return web.Response(status=204)


async def _serve(receiver: _Receiver) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]


async def bench_delivery(n_events: int, n_flips: int) -> dict[str, Any]:
    from watcher.delivery.dispatcher import Dispatcher
    from watcher.sinks.webhook import WebhookSink

    receiver = _Receiver()
    runner, port = await _serve(receiver)
    out: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="prw-b6-", dir="/tmp") as tmp:
            outbox = Store(Path(tmp) / "outbox.db")
            await outbox.open()
            hook = WebhookSinkSettings(
                name="hook",
                url=Secret(value=f"http://127.0.0.1:{port}/"),
                batch=True,
                max_batch=500,
                rate=1000,
            )
            stop = asyncio.Event()
            dispatcher = Dispatcher(outbox, [WebhookSink(hook, node="n")], stop=stop)
            await outbox.register(["hook"])
            task = asyncio.create_task(dispatcher.run())
            receiver.want = n_events
            change = Change(
                Kind.DEVICE_ADDED, Severity.INFO, "bench", {"resource": GPU, "device": "x", "numa": [0]}
            )
            t0 = time.monotonic()
            for start in range(0, n_events, 500):
                events = [
                    envelope(change, seq=s + 1, node="n", cycle=f"c{s // 50}", before=None, after=None)
                    for s in range(start, min(n_events, start + 500))
                ]
                await outbox.commit(events, dispatcher.queues(events), None)
                dispatcher.notify()
            await asyncio.wait_for(receiver.done.wait(), 120)
            out["throughput"] = n_events / (time.monotonic() - t0)
            stop.set()
            await task
            await dispatcher.close()
            await outbox.close()
        # Change to receipt, through the whole agent.
        receiver.ids.clear()
        receiver.want = 0
        with tempfile.TemporaryDirectory(prefix="prw-b6b-", dir="/tmp") as tmp:
            root = Path(tmp)
            fake = FakeKubelet(root / "kubelet", default_node())
            await fake.start()
            settings = dataclasses.replace(
                settings_for(root, fake),
                sinks=(
                    WebhookSinkSettings(
                        name="hook", url=Secret(value=f"http://127.0.0.1:{port}/"), rate=1000
                    ),
                ),
            )
            agent = Agent(settings)
            watch = Watch(agent)
            task = await _run_agent(agent)
            await watch.until(lambda: bool(watch.events), 20)
            gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
            lat = []
            for i in range(n_flips):
                await asyncio.sleep(1.0)
                mark = len(watch.events)
                t0 = time.monotonic()
                (fake.make_unhealthy if i % 2 == 0 else fake.heal)(GPU, gpu)
                want = Kind.DEVICE_REMOVED if i % 2 == 0 else Kind.DEVICE_ADDED
                await watch.until(lambda m=mark, w=want: any(e.kind == w for _, e in watch.events[m:]), 30)
                event_id = next(e.id for _, e in watch.events[mark:] if e.kind == want)
                async with asyncio.timeout(30):
                    while event_id not in receiver.ids:
                        await asyncio.sleep(0.002)
                lat.append(receiver.ids[event_id] - t0)
            out["change_to_receipt"] = lat
            await _stop(agent, task)
            await fake.stop(remove_socket=True)
    finally:
        await runner.cleanup()
    return {"delivery": out}


# --- 7. trigger storm ---


async def bench_storm(triggers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="prw-b7-", dir="/tmp") as tmp:
        root = Path(tmp)
        fake, agent, _, task = await _watched_agent(root)
        await asyncio.sleep(1.5)
        first = len(fake.call_times)
        checkpoint = fake.checkpoint_path
        t0 = time.monotonic()
        for i in range(triggers):
            # As the kubelet does: write a temp file, rename it over the checkpoint.
            tmp_file = checkpoint.with_name(f".storm-{i}")
            tmp_file.write_text(str(i))
            os.replace(tmp_file, checkpoint)
            if i % 50 == 0:
                await asyncio.sleep(max(0.0, t0 + (i + 1) / triggers - time.monotonic()))
        storm_s = time.monotonic() - t0
        await asyncio.sleep(3)
        times = list(fake.call_times)[first:]
        worst = 0
        j = 0
        for i, t in enumerate(times):
            while t - times[j] >= 1.0:
                j += 1
            worst = max(worst, i - j + 1)
        await _stop(agent, task)
        await fake.stop(remove_socket=True)
    return {
        "storm": {
            "triggers": triggers,
            "storm_s": storm_s,
            "calls": len(times),
            "max_per_1s": worst,
            "limit": agent.settings.watch.max_rpc_rate,
        }
    }


# --- report ---


def machine() -> str:
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({model}), {mem:.0f} GiB; "
        f"Python {platform.python_version()}, grpcio {grpc.__version__}, pod-resources-watcher {__version__}"
    )


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report(r: dict[str, Any], started: datetime, elapsed: float, quick: bool) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`bench/run.py{' --quick' if quick else ''}`) on {started:%Y-%m-%d %H:%M} UTC in {elapsed / 60:.1f} min.",
        f"Machine: {machine()}.",
        "Everything runs on this machine: the simulated kubelet (`watcher/sim/fake_kubelet.py`, real grpc.aio on a",
        "unix socket, shuffled answers, the kubelet's rate limiter) and loopback receivers. Percentiles are",
        "nearest-rank: with few samples p99 is the maximum.",
        "",
        "## 1. Reconnection after a kubelet restart",
        "",
        "From the new socket's rename into place to the first successful GetAllocatableResources. Ours: the",
        "agent (directory watch, fresh channel). Baseline, in the same run against the same restarts: a plain",
        "grpc.aio channel with default reconnect settings, polled every 100 ms.",
        "",
        "| downtime | n | ours p50 | ours p99 | plain p50 | plain p99 | plain / ours (p50) | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for downtime, res in r["reconnect"].items():
        ours, plain = res["ours"], res["plain"]
        ratio = statistics.median(plain) / max(statistics.median(ours), 1e-6)
        goal = pct(ours, 99) <= 0.05 and (downtime < 10 or ratio >= 100)
        lines.append(
            f"| {downtime:g} s | {len(ours)} | {ms(statistics.median(ours))} | {ms(pct(ours, 99))} | "
            f"{ms(statistics.median(plain))} | {ms(pct(plain, 99))} | {ratio:.0f}x | {verdict(goal)} |"
        )
    lines += [
        "",
        "Goal: ours p99 <= 50 ms at every downtime, and >= 100x faster than the plain channel at 10 s and 30 s.",
        "",
    ]
    c = r["change_to_event"]
    lines += [
        "## 2. Change to event",
        "",
        "A device health flip at the fake kubelet (which rewrites its checkpoint) until the event is committed to the outbox.",
        "",
        "| triggers | n | p50 | p99 | goal |",
        "|---|---|---|---|---|",
    ]
    for mode in ("state-file triggers", "timer only (interval 30 s)"):
        xs = c[mode]
        goal = verdict(pct(xs, 99) <= 0.1) if mode.startswith("state") else "(reference)"
        lines.append(f"| {mode} | {len(xs)} | {ms(statistics.median(xs))} | {ms(pct(xs, 99))} | {goal} |")
    lines += ["", "Goal: p99 <= 100 ms with state-file triggers.", ""]
    lines += [
        "## 3. Unchanged re-query",
        "",
        "CPU time of this process per cycle, the kubelet in another process. Ours: the agent's whole "
        "cycle (both RPCs, compare, decode the views, compare signatures); the bare client: both RPCs "
        "and a protobuf parse of each answer, nothing else. Measured in 10 alternating blocks against "
        "the same kubelet.",
        "",
        "| case | cycles | ours | bare client | ours / bare | goal | decoder outcomes |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, res in r["unchanged"].items():
        ratio = res["ours"] / res["bare"]
        outcomes = (
            f"{res['same_bytes']} same bytes, {res['reordered']} reordered, "
            f"{res['pods_rebuilt']} pods rebuilt"
        )
        lines.append(
            f"| {label} | {res['cycles']} | {ms(res['ours'])} | {ms(res['bare'])} | {ratio:.2f}x "
            f"| {verdict(ratio <= 1.0)} | {outcomes} |"
        )
    prof = r["decode_profile"]
    lines += [
        "",
        "Where the difference goes: decoding the same reordered large-node answers in this process "
        "(thread CPU time, median of "
        + str(r.get("decode_profile_n", 300))
        + "), beside the bare client's parse:",
        "",
        "| step | time |",
        "|---|---|",
        *(f"| {step} | {t * 1e3:.3f} ms |" for step, t in prof.items()),
        "",
        "With identical bytes the agent compares and stops, and costs what the bare client costs "
        "(less its parse). With reordered answers it must find out that nothing changed, which the "
        "bare client never does: its parse is one call into C. Ours is one C parse into views, then "
        "one short Python step per pod (sorting its entries' bytes); that per-pod step is what "
        "remains above the bare client. The last row is the least any order-free comparison can do "
        "in Python (take each pod's containers and sort them, nothing else): it alone costs more than "
        "the bare client's whole parse, so 1.0x cannot be reached with shuffled answers without "
        "compiled code, outside this project's stack.",
    ]
    lines += [
        "",
        "Goal: no more than 1.0x the bare client. Events emitted during these cycles: "
        + ", ".join(str(v["events"]) for v in r["unchanged"].values())
        + " (must be 0).",
        "",
    ]
    xs = r["changed"]
    full = r["full_build"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["changed_kinds"].items()))
    lines += [
        "## 4. Changed re-query",
        "",
        "Decode, hash, diff and build the events on the large node (512 CPUs, 8 NUMA nodes, 4 x 64 "
        "devices, 250 x 4 containers, 50 DRA claims), from freshly shuffled answers; the change "
        "alternates between a device's health and a pod's CPU allocation. Events: " + kinds + ".",
        "",
        "| path | n | p50 | p99 | goal |",
        "|---|---|---|---|---|",
        f"| the agent's (incremental decoder) | {len(xs)} | {ms(statistics.median(xs))} | {ms(pct(xs, 99))} | {verdict(pct(xs, 99) <= 0.02)} |",
        f"| for reference: a full build and hash of every answer | {len(full)} | {ms(statistics.median(full))} | {ms(pct(full, 99))} | |",
        "",
        "Goal: p99 <= 20 ms.",
        "",
    ]
    m = r["memory"]
    assert m["commit_failures"] == 0, "the memory section's cycles failed to commit"
    growth = m["end"] - m["start"]
    lines += [
        "## 5. Memory",
        "",
        f"RSS of the agent's process over {m['cycles']:,} unchanged cycles ({m['seconds']:.0f} s), the kubelet in another process.",
        "",
        "| after start | halfway | at the end | growth | goal |",
        "|---|---|---|---|---|",
        f"| {m['start']:.1f} MiB | {m['middle']:.1f} MiB | {m['end']:.1f} MiB | {growth:+.1f} MiB | {verdict(m['end'] <= 64 and growth <= 2)} |",
        "",
        "Goal: <= 64 MiB steady, growth <= 2 MiB.",
        "",
    ]
    d = r["delivery"]
    xs = d["change_to_receipt"]
    lines += [
        "## 6. Delivery",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| events/s through the outbox to a local webhook (batches of 500) | {d['throughput']:,.0f} | {verdict(d['throughput'] >= 2000)} |",
        f"| change to receipt, p50 (n={len(xs)}) | {ms(statistics.median(xs))} | |",
        f"| change to receipt, p99 | {ms(pct(xs, 99))} | {verdict(pct(xs, 99) <= 0.15)} |",
        "",
        "Goals: >= 2,000 events/s and p99 <= 150 ms.",
        "",
    ]
    s = r["storm"]
    steady = c["steady_calls_per_min"]
    lines += [
        "## 7. Kubelet friendliness",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| calls per minute at steady state, default settings (over {c['steady_window_s']:.0f} s) | {steady:.1f} | |",
        f"| largest number of calls in any 1 s window during {s['triggers']:,} checkpoint rewrites in {s['storm_s']:.1f} s | {s['max_per_1s']} (of {s['calls']} calls) | {verdict(s['max_per_1s'] <= s['limit'])} (limit {s['limit']:g}/s) |",
        "",
    ]
    w = r["warmup"]
    floor, settled, flip = w["floor"], w["settled"], w["flip"]
    lines += [
        "## 8. The kubelet's warm-up",
        "",
        "Kubelet restarts whose device plugins re-register 0.5-2 s later and whose pods reappear over 0.5 s, as",
        "a real kubelet's do. The floor is the last plugin back; the agent's settled report comes once every",
        "resource is back and the pod list has been stable for 2 s (its settling rule), so the net change is",
        "reported once. Then a NIC's health flips while the GPUs' device plugin is away (held).",
        "",
        "| measure | n | p50 | p99 | goal |",
        "|---|---|---|---|---|",
        f"| restart to plugins back (the floor) | {len(floor)} | {ms(statistics.median(floor))} | {ms(pct(floor, 99))} | |",
        f"| restart to settled report | {len(settled)} | {ms(statistics.median(settled))} | {ms(pct(settled, 99))} | "
        f"(settled / floor at p50: {statistics.median(settled) / max(statistics.median(floor), 1e-6):.2f}x) |",
        f"| events other than kubelet.restarted (false alarms) | {len(settled)} restarts | {w['false_alarms']} | | {verdict(w['false_alarms'] == 0)} (0) |",
        f"| health flip to event during another resource's warm-up | {len(flip)} | {ms(statistics.median(flip))} | {ms(pct(flip, 99))} | {verdict(pct(flip, 99) <= 0.1 and w['still_held'])} (p99 <= 100 ms, GPUs still held) |",
        "",
    ]
    return "\n".join(lines) + "\n"


async def main_async(quick: bool) -> dict[str, Any]:
    configure_logging("error", "json")
    results: dict[str, Any] = {}
    warmups = 3 if quick else 10
    if quick:
        plan, trig, timer, steady, cycles, mem, events, flips, storm = (
            {1.0: 3, 10.0: 1},
            10,
            1,
            10.0,
            30,
            2000,
            2000,
            10,
            300,
        )
    else:
        plan, trig, timer, steady, cycles, mem, events, flips, storm = (
            {1.0: 10, 10.0: 3, 30.0: 2},
            40,
            3,
            45.0,
            600,
            100_000,
            10_000,
            30,
            1000,
        )
    steps = [
        ("reconnection", lambda: bench_reconnect(plan)),
        ("change to event", lambda: bench_change_to_event(trig, timer, steady)),
        ("unchanged re-query", lambda: bench_unchanged(cycles)),
        ("memory", lambda: bench_memory(mem)),
        ("delivery", lambda: bench_delivery(events, flips)),
        ("trigger storm", lambda: bench_storm(storm)),
        ("warm-up", lambda: bench_warmup(warmups, flips)),
    ]
    for name, step in steps:
        t0 = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        results.update(await step())
        print(f"bench: {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print("bench: changed re-query ...", file=sys.stderr, flush=True)
    results.update(bench_changed(100 if quick else 300))
    results.update(bench_decode_profile(50 if quick else 300))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (a smoke run, not for the record)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    started = datetime.now(UTC)
    t0 = time.monotonic()
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    results = asyncio.run(main_async(args.quick))
    args.output.write_text(report(results, started, time.monotonic() - t0, args.quick))
    print(f"bench: wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
