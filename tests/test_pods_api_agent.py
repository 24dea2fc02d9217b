"""The agent with the kubelet's Pods API (the fake kubelet serves it as a real grpc.aio server on a
real unix socket): a pod's change read with pod-resources Get for that pod alone, the watch's
snapshots, drops and restarts (nothing lost, nothing twice), and the agent exactly as without the
API when its socket is absent or refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import grpc

from testkit.agent import Running, make_settings, running_agent
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


async def _readyz(run: Running) -> dict[str, Any]:
    assert run.agent.http is not None and run.agent.http.bound_port is not None
    url = f"http://127.0.0.1:{run.agent.http.bound_port}/readyz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body: dict[str, Any] = await response.json()
    return body


def _job_pod(name: str, cpus: set[int]) -> FakePod:
    return FakePod(
        "ml",
        name,
        [FakeContainer("trainer", cpu_ids=set(cpus))],
        labels={"team": "research", "pod-template-hash": "x"},
        owners=[FakeOwner("Job", "llm-pretrain", api_version="batch/v1")],
    )


async def test_a_new_pod_is_read_with_one_get_and_named_with_its_owner(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=3)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
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


async def test_the_first_snapshot_and_its_duplicates_report_nothing(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=5)
    async with fake:
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

            await run.recorder.until(relabelled)
            await run.quiet_cycle()
            assert run.recorder.kinds() == ["watcher.started"]


async def test_a_kubelet_restart_initializing_gives_only_kubelet_restarted(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=6)
    async with fake, running_agent(make_settings(short_tmp, poll_interval=0.05), fake) as run:
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


async def test_a_dropped_watch_re_diffs_nothing_lost_nothing_twice(short_tmp: Path) -> None:
    node = FakeNode()
    for i in range(150):  # one change to all: 150 events at once overflow the 100-event buffer
        node.add_pod(FakePod("load", f"pod-{i:03}", [FakeContainer("main", cpu_ids={i})]))
    node.cpu_ids = set(range(256))
    fake = FakeKubelet(short_tmp / "kubelet", node, seed=7)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
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


async def test_without_the_socket_the_agent_works_as_before_and_says_so(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=8, pods_api=False)
    async with fake, running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        watch = run.agent.pods_watch
        assert watch is not None
        await run.recorder.until(lambda: watch.state == "absent", 10)
        mark = len(run.recorder.events)
        fake.add_pod(_job_pod("llm-pretrain-4", {64}))  # seen through the checkpoint, as before
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert "pod_uid" not in added.details and "owner" not in added.details
        ready = await _readyz(run)
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
        ready = await _readyz(run)
        assert ready["pods_api"] == {"state": "disabled", "detail": watch.detail}
        assert "UNIMPLEMENTED" in watch.detail or "unknown service" in watch.detail
