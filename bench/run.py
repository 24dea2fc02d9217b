"""`make bench`: measure the speed claims side by side and write BENCHMARKS.md (bench/report.py).

Every figure comes from this run, on this machine. Sections (their --only names):
  1. reconnect: reconnection after a kubelet restart, ours vs a plain grpc.aio channel polled every 100 ms
  2. change: a device health flip until the event is committed (state-file triggers vs timer)
  3. steady: the agent's whole CPU share at steady state, a real `python -m watcher run` over
     PRW_BENCH_STEADY_S seconds (default 300) (bench/steady.py); unchanged: CPU time per unchanged
     cycle on a large node, ours vs a bare client, and where the decode's time goes (for reference)
  4. changed: changed re-query (decode, hash, diff, events) on that node
  5. memory: RSS after start and after many unchanged cycles
  6. delivery: events/s through the outbox to a local webhook; change-to-receipt
  7. storm (and change): calls per minute at steady state; the largest 1 s burst in a trigger storm
  8. warmup: kubelet restarts with a realistic warm-up
  9. scale = nodes (changed cycles, RSS and bytes written at 250 to ~450,000 pods: bench/scale.py),
     ack (ack cost as a queue grows), audit (the audit log under a 30,000-event burst), drain (a
     webhook's queue after its receiver's outage) (bench/queues.py)
 10. fleet: 1,000 and 10,000 simulated nodes' events into a real 3-node NATS JetStream cluster
     through the nats sink's publishing code (latency, consumer lag, a burst, sustained capacity,
     the stream leader killed mid-load), beside the same load through the webhook sink into one
     receiver (bench/fleet.py)

    .venv/bin/python bench/run.py [--quick] [--only NAMES] [--list] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# watcher first: it silences gRPC's C-core, which reads its settings at import.
import watcher  # noqa: F401, I001

import grpc
from grpc import aio

from bench import fleet
from bench.cycles import agent_for_cycles
from bench.queues import bench_ack, bench_audit, bench_drain
from bench.receiver import Receiver, serve
from bench.report import report
from bench.scale import FIT, ScaleSize, bench_scale
from bench.steady import bench_steady, steady_seconds
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


async def bench_delivery(n_events: int, n_flips: int) -> dict[str, Any]:
    from watcher.delivery.dispatcher import Dispatcher
    from watcher.sinks.webhook import WebhookSink

    receiver = Receiver()
    runner, port = await serve(receiver)
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


# --- the run ---


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of everything: the full run (`make bench`) or a smoke run (--quick)."""

    reconnect: dict[float, int]
    triggers: int
    timer: int
    steady_calls_window: float
    unchanged_cycles: int
    memory_cycles: int
    delivery_events: int
    flips: int
    storm: int
    warmups: int
    changed_rounds: int
    decode_rounds: int
    steady_s: float
    sizes: tuple[ScaleSize, ...]
    ack_depths: tuple[int, ...]
    ack_reps: int
    audit_events: int
    audit_spread_s: float
    fleet: fleet.FleetPlan


FULL = Plan(
    reconnect={1.0: 10, 10.0: 3, 30.0: 2},
    triggers=40,
    timer=3,
    steady_calls_window=45.0,
    unchanged_cycles=600,
    memory_cycles=100_000,
    delivery_events=10_000,
    flips=30,
    storm=1000,
    warmups=10,
    changed_rounds=300,
    decode_rounds=300,
    steady_s=steady_seconds(300.0),
    sizes=(
        ScaleSize(250, cycles=200),
        ScaleSize(2_500, cycles=100),
        ScaleSize(10_000, cycles=100),
        # The first full decode of ~450,000 pods takes minutes on a slow agent: no warm-up there.
        ScaleSize(FIT, cycles=10, warmup=0),
    ),
    ack_depths=(10, 10_000, 100_000),
    ack_reps=30,
    audit_events=30_000,
    audit_spread_s=12.0,
    fleet=fleet.FULL,
)

QUICK = Plan(
    reconnect={1.0: 3, 10.0: 1},
    triggers=10,
    timer=1,
    steady_calls_window=10.0,
    unchanged_cycles=30,
    memory_cycles=2000,
    delivery_events=2000,
    flips=10,
    storm=300,
    warmups=3,
    changed_rounds=100,
    decode_rounds=50,
    steady_s=steady_seconds(60.0),
    sizes=(
        ScaleSize(250, cycles=20),
        ScaleSize(2_500, cycles=20),
        ScaleSize(10_000, cycles=10, budget_s=20.0),
    ),
    ack_depths=(10, 10_000, 100_000),
    ack_reps=10,
    audit_events=3_000,
    audit_spread_s=1.2,
    fleet=fleet.QUICK,
)


async def _unchanged_and_decode(plan: Plan) -> dict[str, Any]:
    return {**await bench_unchanged(plan.unchanged_cycles), **bench_decode_profile(plan.decode_rounds)}


async def _sync(result: dict[str, Any]) -> dict[str, Any]:
    return result


def steps(plan: Plan) -> dict[str, Callable[[], Awaitable[dict[str, Any]]]]:
    """Every section by name, in the order `make bench` runs them (one after the other: on a
    2-core machine, two at once would measure each other)."""
    return {
        "reconnect": lambda: bench_reconnect(plan.reconnect),
        "change": lambda: bench_change_to_event(plan.triggers, plan.timer, plan.steady_calls_window),
        "steady": lambda: bench_steady(plan.steady_s),
        "unchanged": lambda: _unchanged_and_decode(plan),
        "memory": lambda: bench_memory(plan.memory_cycles),
        "delivery": lambda: bench_delivery(plan.delivery_events, plan.flips),
        "storm": lambda: bench_storm(plan.storm),
        "warmup": lambda: bench_warmup(plan.warmups, plan.flips),
        "changed": lambda: _sync(bench_changed(plan.changed_rounds)),
        "nodes": lambda: bench_scale(plan.sizes),
        "ack": lambda: _sync(bench_ack(plan.ack_depths, plan.ack_reps)),
        "audit": lambda: bench_audit(plan.audit_events, plan.audit_spread_s),
        "drain": lambda: bench_drain(),
        "fleet": lambda: fleet.bench_fleet(plan.fleet),
    }


# Names that stand for several sections.
GROUPS = {"scale": ("nodes", "ack", "audit", "drain")}


def chosen(only: str | None, names: Sequence[str]) -> list[str]:
    """The sections `--only` asks for (comma-separated names or groups), in run order."""
    if only is None:
        return list(names)
    wanted: set[str] = set()
    for name in only.split(","):
        name = name.strip()
        if name not in names and name not in GROUPS:
            raise SystemExit(f"--only: no section {name!r}; one of {', '.join([*names, *GROUPS])}")
        wanted.update(GROUPS.get(name, (name,)))
    return [n for n in names if n in wanted]


async def main_async(plan: Plan, names: Sequence[str]) -> dict[str, Any]:
    configure_logging("error", "json")
    results: dict[str, Any] = {}
    every = steps(plan)
    for name in names:
        t0 = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        results.update(await every[name]())
        print(f"bench: {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (a smoke run, not for the record)"
    )
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="run only these sections (comma-separated; see --list) and print their report "
        "(to BENCHMARKS.md only with --output)",
    )
    parser.add_argument("--list", action="store_true", help="name the sections and groups, then exit")
    parser.add_argument("--output", type=Path, help="where the report goes (default: BENCHMARKS.md)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.list:
        print("sections:", ", ".join(steps(plan)))
        print("groups:", "; ".join(f"{g} = {', '.join(n)}" for g, n in GROUPS.items()))
        return
    names = chosen(args.only, list(steps(plan)))
    output = args.output if args.output is not None or args.only else ROOT / "BENCHMARKS.md"
    started = datetime.now(UTC)
    t0 = time.monotonic()
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    results = asyncio.run(main_async(plan, names))
    results["quick"] = args.quick
    command = (
        "bench/run.py" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    )
    text = report(results, started, time.monotonic() - t0, command)
    if output is None:
        print(text)
    else:
        output.write_text(text)
        print(f"bench: wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
