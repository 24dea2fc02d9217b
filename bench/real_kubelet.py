"""The agent on upstream's kubelet (issue 37): kube-testcluster (etcd, kube-apiserver),
kube-controllers (upstream's kube-scheduler, resourceclaim and Job controllers), and a RealNode
(upstream's whole kubelet on upstream's fake CRI) with our device plugin and upstream's DRA test
driver registered with it; then, in the same run, the same device flip at kubelet-lite and at the
fake kubelet (bench/real_flips.py).

On the real kubelet, with the agent in this process (default settings, the audit file sink):
  pods     N pods (one GPU each, bound by spec.nodeName) created one at a time through the API
           server: from the create call to allocation.added stored; to the pod's first event on
           the Pods API (a second client, bench/real_flips.PodSightings); the create call alone
  plugin   the GPU pod gpu-0 holds, flipped unhealthy and back N times each way at our device
           plugin: to device.removed / device.added stored, split at the pod's status changing on
           the Pods API (the kubelet's part, then ours)
  dra      a Job's pod whose claim (from a ResourceClaimTemplate, allocated by the real scheduler)
           holds a device of upstream's DRA test driver, flipped the same way at the driver: to
           device.unhealthy / device.healthy stored, split the same way
Then the agent as a process of its own (`python -m watcher run`, defaults, the audit file sink, the
HTTP server on loopback) watching that node with those N + 1 pods: its utime + stime
(/proc/PID/stat) over the idle window and its RSS at the window's end.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import Watch
from bench.real_flips import (
    EVENT_S,
    FlipSeries,
    PodSightings,
    agent_settings,
    fake_round,
    flip_series,
    in_process_agent,
    lite_round,
    plugin_event,
    quiet_cycle,
)
from bench.stamped import rss_mib
from bench.steady import SETTLE_S, cpu_seconds
from testkit.kube_controllers import start_kube_controllers
from testkit.kube_testcluster import start_kube_testcluster
from testkit.peer_process import terminate
from testkit.peers import PEERS_BIN
from testkit.ports import free_port
from testkit.real_dra import add_dra_driver, allocated_device, claim_job, claim_of, job_pod
from testkit.real_node import RealNode
from testkit.waiting import wait_until
from watcher.model.changes import Kind
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.events import Event
from watcher.sources.pods_api.client import PodsApiClient

__all__ = ["NEEDED", "Idle", "PodCreates", "RealKubeletPlan", "RealKubeletRun", "bench_real_kubelet"]

ROOT = Path(__file__).resolve().parent.parent
NEEDED = (
    "kube-testcluster",
    "kube-controllers",
    "kubelet",
    "fake-cri",
    "device-plugin",
    "dra-test-driver",
    "kubelet-lite",
)
GPU = "example.com/gpu"
NAMESPACE = "bench"
NODE = "bench-real"
DRA_TAG = "benchdra"  # the driver benchdra.test.example.com, its DeviceClass benchdra
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"


@dataclass(frozen=True)
class RealKubeletPlan:
    flips: int  # each way, per device kind, on the real kubelet
    pods: int  # GPU pods created (and left on the node for the idle window)
    idle_s: float
    ref_flips: int  # each way, at kubelet-lite and at the fake


@dataclass(frozen=True)
class PodCreates:
    """Per pod, seconds from the create call: to allocation.added stored, to its first event on the
    Pods API (None: not seen); the create call's own time; the storing re-query's reasons."""

    stored: tuple[float, ...]
    pods_api: tuple[float | None, ...]
    post: tuple[float, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Idle:
    cpu_s: float
    wall_s: float
    rss_mib: float
    pods: int  # on the node's Pods API when the window opened
    events: int  # audit records written during the window


@dataclass
class RealKubeletRun:
    plan: RealKubeletPlan
    flips: dict[str, dict[str, FlipSeries]] = field(default_factory=dict)  # plugin, dra, lite, fake
    pods: PodCreates | None = None
    idle: Idle | None = None
    errors: dict[str, str] = field(default_factory=dict)  # a round that could not run: why
    # The 1-minute load average when the run began and ended: what else used the machine's cores.
    load: tuple[float, float] = (0.0, 0.0)


def _health(healthy: bool) -> str:
    return "Healthy" if healthy else "Unhealthy"


async def _creates(
    node: RealNode, client: Any, sightings: PodSightings, watch: Watch, n: int, rng: random.Random
) -> PodCreates:
    from lightkube import codecs

    stored: list[float] = []
    first: list[float | None] = []
    post: list[float] = []
    reasons: list[str] = []
    for i in range(n):
        name = f"gpu-{i}"

        def added(e: Event, name: str = name) -> bool:
            return e.kind == Kind.ALLOCATION_ADDED and e.details.get("pod") == name

        await asyncio.sleep(1.0 + rng.uniform(0.0, 0.5))  # as the flips are spaced (real_flips)
        body = codecs.from_dict(node.pod(NAMESPACE, name, {GPU: 1}))
        mark = len(watch.events)
        t0 = time.monotonic()
        await client.create(body)
        post.append(time.monotonic() - t0)
        await watch.until(lambda: any(added(e) for _, e in watch.events[mark:]), EVENT_S)
        at = next(t for t, e in watch.events[mark:] if added(e))
        stored.append(at - t0)
        reasons.append(",".join(sorted(watch.reasons_at(at))) or "none")
        seen = await sightings.when(t0, lambda m: m.name == name, 5.0)
        first.append(None if seen is None else seen - t0)
    return PodCreates(tuple(stored), tuple(first), tuple(post), tuple(reasons))


def _held(sightings: PodSightings, pod: str) -> str | None:
    """The GPU `pod` holds, as its status on the Pods API names it."""
    for _, meta in reversed(sightings.seen):
        if meta.name == pod:
            ids = [v.resource_id for v in meta.verdicts if v.resource == GPU]
            if ids:
                return ids[0]
    return None


async def _real(root: Path, plan: RealKubeletPlan, rng: random.Random, out: RealKubeletRun) -> None:
    from lightkube import AsyncClient, KubeConfig

    with (
        start_kube_testcluster(root / "c") as cluster,
        start_kube_controllers(cluster, root / "kc"),
    ):
        async with RealNode(cluster, root / "n", NODE) as node:
            plugin = await node.add_plugin(GPU, {f"gpu{i}": (i % 2,) for i in range(max(plan.pods, 1))})
            dra = await add_dra_driver(node, DRA_TAG)
            await node.namespace(NAMESPACE)
            client = AsyncClient(KubeConfig.from_file(cluster.admin_kubeconfig))
            settings = agent_settings(root / "a", node.name, node.root)
            try:
                async with (
                    PodSightings(node.pods_api_socket) as sightings,
                    in_process_agent(settings) as (agent, watch),
                ):
                    out.pods = await _creates(node, client, sightings, watch, max(plan.pods, 1), rng)
                    await sightings.changes.until(lambda: _held(sightings, "gpu-0") is not None, EVENT_S)
                    found = _held(sightings, "gpu-0")
                    assert found is not None
                    held: str = found

                    async def plugin_flip(healthy: bool) -> None:
                        await plugin.set_healthy(held, healthy)

                    def shown(m: PodMeta, healthy: bool) -> bool:
                        return m.name == "gpu-0" and any(
                            v.resource == GPU and v.resource_id == held and v.health == _health(healthy)
                            for v in m.verdicts
                        )

                    out.flips["plugin"] = await flip_series(
                        agent,
                        watch,
                        plan.flips,
                        plugin_flip,
                        plugin_event(GPU, held),
                        rng=rng,
                        sightings=sightings,
                        shown=shown,
                    )

                    await claim_job(node, dra, NAMESPACE, "dra")
                    pod = await job_pod(node, NAMESPACE, "dra")
                    device = allocated_device(await claim_of(node, pod))
                    name = pod["metadata"]["name"]

                    def claim_shown(m: PodMeta, healthy: bool) -> bool:
                        return m.name == name and any(
                            v.is_claim and v.health == _health(healthy) for v in m.verdicts
                        )

                    def dra_stored(e: Event, healthy: bool) -> bool:
                        want = Kind.DEVICE_HEALTHY if healthy else Kind.DEVICE_UNHEALTHY
                        return e.kind == want and e.details.get("device_name") == device

                    async def dra_flip(healthy: bool) -> None:
                        if healthy:
                            await dra.driver.set_health(dra.pool, device, "Healthy")
                        else:
                            await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)

                    # Its first report (Healthy) on the Pods API and taken by the agent: the start.
                    await sightings.when(0.0, lambda m: claim_shown(m, True), EVENT_S)
                    await quiet_cycle(agent, watch)
                    out.flips["dra"] = await flip_series(
                        agent,
                        watch,
                        plan.flips,
                        dra_flip,
                        dra_stored,
                        rng=rng,
                        sightings=sightings,
                        shown=claim_shown,
                    )
                out.idle = await _idle(root / "p", node, plan.idle_s)
            finally:
                await client.close()


def _config(root: Path, node: RealNode, port: int) -> Path:
    """Defaults everywhere but where the files are, the audit log and a free loopback port."""
    root.mkdir(parents=True)
    path = root / "config.toml"
    path.write_text(
        f"""node = "{node.name}"
state_dir = "{root / "state"}"
[kubelet]
socket = "{node.socket_path}"
root_dir = "{node.root}"
[http]
listen = "127.0.0.1:{port}"
[sinks.audit]
type = "file"
path = "{root / "state" / "audit.jsonl"}"
"""
    )
    return path


def _records(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def _idle(root: Path, node: RealNode, seconds: float) -> Idle:
    """`python -m watcher run` against the node: once /readyz says its Pods API watch is live and
    the start has settled, its CPU over `seconds` and its RSS at the end."""
    port = free_port()
    argv = [sys.executable, "-m", "watcher", "run", "--config", str(_config(root, node, port))]
    with (root / "agent.out").open("wb") as out, (root / "agent.err").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT
        )
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                if proc.returncode is not None:
                    err = (root / "agent.err").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the agent exited ({proc.returncode}): {err}")
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        body = await r.json()
                except aiohttp.ClientError:
                    return False
                return r.status == 200 and body.get("pods_api", {}).get("state") == "watching"

            await wait_until(ready, 60, interval=0.2, what="the agent's /readyz with its Pods API watch live")
        await asyncio.sleep(SETTLE_S)  # what the start began (the first delivery, the warm-up) ends
        async with PodsApiClient(str(node.pods_api_socket), timeout=10.0) as pods_api:
            pods = len(await pods_api.list_pods())
        audit = root / "state" / "audit.jsonl"
        records0, cpu0, t0 = _records(audit), cpu_seconds(proc.pid), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        rss = rss_mib(proc.pid)
        return Idle(cpu1 - cpu0, t1 - t0, rss, pods, _records(audit) - records0)
    finally:
        await terminate(proc)


async def bench_real_kubelet(plan: RealKubeletPlan) -> RealKubeletRun:
    out = RealKubeletRun(plan)
    missing = [n for n in NEEDED if not os.access(PEERS_BIN / n, os.X_OK)]
    if missing:
        out.errors["all"] = f"not built: {', '.join(missing)} (run `make peers`)"
        return out
    rng = random.Random(37)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="prw-rk-", dir="/tmp") as tmp:
        root = Path(tmp)
        try:
            await _real(root, plan, rng, out)  # short socket paths: c, kc, n, a, p
        except (RuntimeError, AssertionError, OSError) as err:  # reported, the other rounds still run
            out.errors["real"] = f"{type(err).__name__}: {err}"[:800]
        if plan.ref_flips > 0:
            for name in ("lite", "fake"):
                where = root / name
                where.mkdir()
                try:
                    if name == "lite":
                        out.flips[name] = await lite_round(where, GPU, plan.ref_flips, rng)
                    else:
                        out.flips[name] = await fake_round(where, plan.ref_flips, rng)
                except (RuntimeError, AssertionError, OSError) as err:
                    out.errors[name] = f"{type(err).__name__}: {err}"[:800]
    out.load = (load0, os.getloadavg()[0])
    return out
