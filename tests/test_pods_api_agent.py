"""The agent with the kubelet's Pods API (the fake kubelet serves it as a real grpc.aio server on a
real unix socket): a pod's change read with pod-resources Get for that pod alone, the watch's
snapshots, drops and restarts (nothing lost, nothing twice), and the agent exactly as without the
API when its socket is absent or refuses it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
from structlog.testing import capture_logs

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.inventories import dra_job_pod
from testkit.waiting import wait_until
from watcher.kubelet.triggers import GATHER_MOST
from watcher.settings import PodsSettings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeContainer, FakeNode, FakeOwner, FakePod
from watcher.sim.fake_plugins import Warmup
from watcher.sim.fake_pods_api import FakePodsApi

GPU = "nvidia.com/gpu"


def _api(fake: FakeKubelet) -> FakePodsApi:
    assert fake.pods_api is not None
    return fake.pods_api


def _settings(root: Path, **overrides: Any) -> Any:
    # The Pods API alone tells of pod changes here: no state-file triggers, the timer far away.
    return make_settings(root, state_file_triggers=False, interval=3600.0, **overrides)


async def _watching(run: Running) -> None:
    watch = run.agent.pods_watch
    assert watch is not None
    await run.recorder.until(lambda: watch.state == "watching", 10)
    await run.quiet_cycle()


def _job_pod(name: str, cpus: set[int]) -> FakePod:
    return FakePod(
        "ml",
        name,
        [FakeContainer("trainer", cpu_ids=set(cpus))],
        labels={"team": "research", "pod-template-hash": "x"},
        owners=[FakeOwner("Job", "llm-pretrain", api_version="batch/v1")],
    )


async def test_a_new_pod_is_read_with_one_get_and_named_with_its_owner(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=3)
    async with running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        mark, calls = len(run.recorder.events), dict(fake.calls)
        fake.add_pod(_job_pod("llm-pretrain-1", {60, 61}))
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert added.details["pod_uid"] == fake.node.pods[("ml", "llm-pretrain-1")].uid
        assert added.details["owner"]["kind"] == "Job" and added.details["owner"]["name"] == "llm-pretrain"
        assert added.details["labels"] == {"team": "research"}  # pod-template-hash is not allowlisted
        # One Get for that pod, and neither List nor GetAllocatableResources.
        assert fake.calls["Get"] - calls.get("Get", 0) == 1
        assert fake.calls["List"] == calls.get("List", 0)
        assert fake.calls["GetAllocatableResources"] == calls.get("GetAllocatableResources", 0)
        # What Get built is what List says: a full re-query finds nothing more.
        await run.quiet_cycle()
        assert run.recorder.kinds(mark + 2) == []


async def test_a_finished_pod_is_taken_out_without_a_call_and_a_deleted_one_once_get_misses_it(
    short_tmp: Path,
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=4)
    fake.node.add_pod(_job_pod("llm-pretrain-2", {62}))
    fake.node.add_pod(_job_pod("llm-pretrain-3", {63}))
    async with fake, running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        mark, calls = len(run.recorder.events), sum(fake.calls.values())
        fake.update_pod("ml", "llm-pretrain-2", phase="Succeeded")
        await run.recorder.kinds_after(mark, 2)
        fake.free("ml", "llm-pretrain-3")  # DELETED: name, namespace and uid only
        kinds = await run.recorder.kinds_after(mark, 4)
        assert kinds == ["allocation.removed", "capacity.changed"] * 2
        assert [e.details["pod"] for e in run.recorder.events[mark:] if e.kind == "allocation.removed"] == [
            "llm-pretrain-2",
            "llm-pretrain-3",
        ]
        removed = [e for e in run.recorder.events[mark:] if e.kind == "allocation.removed"]
        # Named as their arrival was, though the watch forgot the deleted one at once.
        assert [e.details["owner"]["name"] for e in removed] == ["llm-pretrain", "llm-pretrain"]
        assert all(e.details["pod_uid"] for e in removed)
        # No call answered: the finished pod needed none, the deleted one's Get found nothing (the
        # fake counts answered calls only; pod-resources, not the DELETED, said its holdings went).
        assert sum(fake.calls.values()) == calls
        await run.quiet_cycle()  # and List agrees
        assert run.recorder.kinds(mark + 4) == []


async def test_the_first_snapshot_and_its_duplicates_report_nothing(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=5)
    _api(fake).delay_broadcasts(0.2)  # changes meanwhile reach the new watch twice
    async with running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        fake.update_pod("ml", "trainer-0", labels={"team": "research", "app": "x"})
        watch = run.agent.pods_watch
        assert watch is not None
        uid = fake.node.pods[("ml", "trainer-0")].uid

        def relabelled() -> bool:
            meta = watch.index.by_uid(uid)
            return meta is not None and dict(meta.labels).get("app") == "x"

        # A label change alone wakes no cycle (events read labels from the index): look.
        await wait_until(relabelled, what="the index relabelled")
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started"]


async def test_a_kubelet_restart_initializing_gives_only_kubelet_restarted(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=6)
    async with running_agent(make_settings(short_tmp, poll_interval=0.05), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        mark = len(run.recorder.events)
        # The warm-up: plugins back late and the pods hidden a while, the Pods API answering
        # FAILED_PRECONDITION "Kubelet is initializing" all that time.
        fake.plugins.warmup = Warmup(plugin_delay=(0.3, 0.6), pods_delay=(0.4, 0.6))
        await fake.restart(downtime=0.1)
        watch = run.agent.pods_watch
        assert watch is not None
        await run.recorder.until(lambda: watch.state == "initializing", 10)
        await run.recorder.until(lambda: watch.state == "watching", 15)
        await run.settled()
        kinds = [k for k in run.recorder.kinds(mark) if not k.startswith("plugin.")]
        assert kinds == ["kubelet.restarted"]


async def test_a_dropped_watch_re_diffs_nothing_lost_nothing_twice(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    node = FakeNode()
    for i in range(150):  # one change to all: 150 events at once overflow the 100-event buffer
        node.add_pod(FakePod("load", f"pod-{i:03}", [FakeContainer("main", cpu_ids={i})]))
    node.cpu_ids = set(range(256))
    fake = await start_kubelet(node, seed=7)
    async with running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        mark = len(run.recorder.events)
        for i in range(150):
            fake.update_pod("load", f"pod-{i:03}", phase="Failed")
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("allocation.removed") >= 150, 15)
        await run.quiet_cycle()
        assert _api(fake).dropped == 1
        removed = [e.details["pod"] for e in run.recorder.events[mark:] if e.kind == "allocation.removed"]
        assert sorted(removed) == [f"pod-{i:03}" for i in range(150)]  # each once
        assert run.agent.inventory is not None and run.agent.inventory.pods == ()


async def test_without_the_socket_the_agent_works_as_before_and_says_so(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=8, pods_api=False)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        watch = run.agent.pods_watch
        assert watch is not None
        await run.recorder.until(lambda: watch.state == "absent", 10)
        mark = len(run.recorder.events)
        fake.add_pod(_job_pod("llm-pretrain-4", {64}))  # seen through the checkpoint, as before
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert "pod_uid" not in added.details and "owner" not in added.details
        ready = await run.readyz()
        assert ready["pods_api"]["state"] == "absent"


async def test_a_kubelet_refusing_the_api_is_disabled_and_the_agent_works_as_before(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=9)
    _api(fake).refuse(grpc.StatusCode.UNIMPLEMENTED, "unknown service v1alpha1.Pods")
    async with fake, running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        watch = run.agent.pods_watch
        assert watch is not None
        await run.recorder.until(lambda: watch.state == "disabled", 10)
        mark = len(run.recorder.events)
        fake.add_pod(_job_pod("llm-pretrain-5", {65}))
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
        assert "owner" not in run.recorder.events[mark].details
        ready = await run.readyz()
        assert ready["pods_api"] == {"state": "disabled", "detail": watch.detail}
        assert "UNIMPLEMENTED" in watch.detail or "unknown service" in watch.detail


# --- what a misbehaving Pods API may cost the agent (issue 36, items 11, 12, 15) ---

DRIVER, POOL, DEVICE = "gpu.nvidia.com", "node-a", "gpu-3"


def _verdict_message(run: Running, namespace: str, name: str) -> str | None:
    watch = run.agent.pods_watch
    held = watch.index.get(namespace, name) if watch is not None else None
    return held.verdicts[0].message if held is not None and held.verdicts else None


async def test_an_endless_snapshot_leaves_the_agent_on_pod_resources_and_says_so(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=10)
    _api(fake).endless_snapshot(every=0.1)  # a pod every 0.1 s, never INITIAL_SYNC_COMPLETE
    settings = make_settings(short_tmp, pods=PodsSettings(snapshot_timeout=1.0))
    with capture_logs() as logs:
        async with fake, running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            watch = run.agent.pods_watch
            assert watch is not None
            await wait_until(lambda: watch.state == "capped", what="the snapshot given up")
            ready = await run.readyz()
            assert ready["pods_api"]["state"] == "capped"
            assert "no INITIAL_SYNC_COMPLETE within 1 s" in ready["pods_api"]["detail"]
            mark = len(run.recorder.events)
            fake.add_pod(_job_pod("llm-pretrain-6", {66}))  # seen through the checkpoint, as before
            assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
            assert "owner" not in run.recorder.events[mark].details
    warned = [e["event"] for e in logs if e["log_level"] == "warning" and "bounds" in str(e["event"])]
    assert warned == [
        "the Pods API's snapshot went past its bounds; the agent works from pod-resources alone for now"
    ]


async def test_a_stream_gone_quiet_still_reports_a_dra_gpu_failing(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=11)
    fake.node.add_pod(dra_job_pod(POOL, DEVICE, labels={"team": "research"}))
    settings = _settings(short_tmp, pods=PodsSettings(resync_interval=0.5))
    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        watch = run.agent.pods_watch
        assert watch is not None
        mark = len(run.recorder.events)
        _api(fake).stall()  # the stream stays open and says nothing more
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", "critical XID 79 reported by NVML")
        # Found by the next ListPods (+- 10 %), after the 2 s the stream gets to catch up.
        assert await run.recorder.kinds_after(mark, 1, timeout=10) == ["device.unhealthy"]
        await wait_until(lambda: watch.connects == 2 and watch.state == "watching", what="a fresh stream")
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.unhealthy"]


async def test_a_flood_of_label_changes_costs_no_re_query_and_no_event(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=12)
    pod = dra_job_pod(POOL, DEVICE, labels={"team": "research"})
    fake.node.add_pod(pod)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        metrics, mark = run.agent.metrics, len(run.recorder.events)
        cycles = metrics.value("requeries_total")
        for flood in range(3):
            for i in range(90):  # each its own MODIFIED, within the kubelet's 100-event buffer
                # One label events carry, one they do not: labels reach events from the index.
                fake.update_pod(pod.namespace, pod.name, labels={"team": f"t{flood}-{i}", "hash": str(i)})
                await asyncio.sleep(0)
            # Floods apart, as an operator's tool relabelling in rounds: a pod-status look gathers a
            # burst, so before, each round cost one re-query of its own (the input's spacing).
            await asyncio.sleep(4 * PodsSettings().status_gather)
        # Then a driver's words on the same stream: once they are looked at, the floods were read.
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy", "probe")
        await run.recorder.until(
            lambda: (
                _verdict_message(run, pod.namespace, pod.name) == "probe"
                and metrics.value("requeries_total") > cycles
            )
        )
        await run.quiet_cycle()
        assert metrics.value("requeries_total") - cycles == 2  # the probe's and ours; none of the 270
        assert run.recorder.kinds(mark) == [] and _api(fake).dropped == 0
        watch = run.agent.pods_watch
        held = watch.index.get(pod.namespace, pod.name) if watch is not None else None
        assert held is not None and dict(held.labels) == {"team": "t2-89"}


async def test_a_flood_of_verdict_changes_costs_a_bounded_number_of_re_queries(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=13)
    pod = dra_job_pod(POOL, DEVICE)
    fake.node.add_pod(pod)
    settings = _settings(short_tmp)
    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        metrics, mark = run.agent.metrics, len(run.recorder.events)
        cycles, started = metrics.value("requeries_total"), time.monotonic()
        for flood in range(3):
            for i in range(90):  # a driver that rewords its Healthy verdict as fast as it can
                fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy", f"temperature {flood}-{i}")
                await asyncio.sleep(0)
            last = f"temperature {flood}-89"
            await wait_until(lambda m=last: _verdict_message(run, pod.namespace, pod.name) == m, what=last)
        await run.quiet_cycle()
        elapsed = time.monotonic() - started
        spent = metrics.value("requeries_total") - cycles
        # Status changes are gathered: a look waits for a quiet moment, at most GATHER_MOST quiet
        # periods, so a flood costs a look every half second, not one per change (270 here).
        most = GATHER_MOST * settings.pods.status_gather
        assert spent <= elapsed / most + 3, (spent, elapsed)
        assert run.recorder.kinds(mark) == [] and _api(fake).dropped == 0


async def test_a_held_plugin_gpu_failing_is_seen_through_the_pod_status_alone(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """The kubelet shows a plugin device's health in its holder's status within milliseconds (the
    real kubelet: ~4 ms, make bench section 13), long before the checkpoint's rewrite is seen. With
    the state files not watched and the timer an hour away, the status alone brings the whole look
    that reports the device gone, and the heal back."""
    fake = await start_kubelet(seed=5)
    held = sorted(
        (pod.namespace, pod.name, i)
        for pod in fake.node.pods.values()
        for c in pod.containers
        for i in c.devices.get(GPU, [])
    )
    assert held, "the built-in node has a pod holding a GPU"
    _, _, victim = held[0]
    async with running_agent(_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await _watching(run)
        mark = len(run.recorder.events)
        fake.make_unhealthy(GPU, victim)
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark), timeout=5)
        fake.heal(GPU, victim)
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark), timeout=5)
        removed = next(e for e in run.recorder.events[mark:] if e.kind == "device.removed")
        assert removed.details["device"] == victim and removed.severity == "critical"
