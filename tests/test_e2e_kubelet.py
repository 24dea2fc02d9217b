"""The agent against upstream's kubelet (peers/cmd/kubelet, the whole kubelet on a fake CRI): its
device manager, checkpoint restore, device plugin registration, admission, pod-resources server and
rate limiter, with our v1beta1 device plugin (peers/cmd/device-plugin). Pods are created in the API
server and admitted by the kubelet. The same assertions the fake-kubelet tests make, on the real
thing; and where it is cheap, the fake checked against the real one. (These ran on kubelet-lite,
upstream's device manager and servers alone, before the whole kubelet ran here.)"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.fake_kubelets import StartKubelet
from testkit.kubelet_lite import AdmissionError
from testkit.real_node import RealNode
from testkit.waiting import wait_until
from watcher.kubeletapi.v1 import api_pb2
from watcher.sim.fake_plugins import Warmup

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}
SERVICE = "/v1.PodResourcesLister/"
FLIPS = 30  # health changes in the rate-limit test, each awaited by the agent's re-query


@asynccontextmanager
async def _agent(short_tmp: Path, node: RealNode, **overrides: Any) -> AsyncIterator[AgentRun]:
    """The agent on the kubelet's root, past its first look and holding nothing back."""
    settings = make_settings(short_tmp, kubelet_root=node.root, node=node.name, **overrides)
    async with agent_against(settings) as run:
        await run.recorder.until(lambda: "watcher.started" in run.recorder.kinds())
        await run.released()
        yield run


async def _call(socket: Path, method: str, request: bytes = b"") -> bytes:
    async with aio.insecure_channel(f"unix:{socket}") as channel:
        return bytes(await channel.unary_unary(SERVICE + method)(request, timeout=5))


async def _error(socket: Path, method: str, request: bytes = b"") -> tuple[grpc.StatusCode, str]:
    with pytest.raises(aio.AioRpcError) as caught:
        await _call(socket, method, request)
    return caught.value.code(), caught.value.details() or ""


async def _list(socket: Path) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse.FromString(await _call(socket, "List"))


async def _allocatable(socket: Path) -> api_pb2.AllocatableResourcesResponse:
    return api_pb2.AllocatableResourcesResponse.FromString(await _call(socket, "GetAllocatableResources"))


def _devices_of(response: api_pb2.ListPodResourcesResponse, namespace: str, name: str) -> set[str]:
    return {
        device
        for pod in response.pod_resources
        if (pod.namespace, pod.name) == (namespace, name)
        for container in pod.containers
        for entry in container.devices
        for device in entry.device_ids
    }


# -- the agent against the real kubelet --


async def test_kubelet_restarts_give_one_kubelet_restarted_each_and_nothing_else(
    real_node: RealNode, short_tmp: Path
) -> None:
    """The real checkpoint restore and plugin re-registration: no false 'device missing'."""
    await real_node.add_plugin(GPU, GPUS)
    await real_node.admit("ml", "trainer-restarts", {"main": {GPU: 2}})
    async with _agent(short_tmp, real_node) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        for n in range(2):
            await real_node.restart()
            await run.recorder.until(
                lambda n=n: run.recorder.kinds(mark).count("kubelet.restarted") == n + 1, timeout=30
            )
            await run.released()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"] * 2
        assert run.agent.inventory == before


async def test_a_device_plugin_restart_gives_only_plugin_lifecycle_events(
    real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    await real_node.admit("ml", "trainer-plugin", {"main": {GPU: 1}})
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await plugin.stop()  # the process ends and removes its socket
        # The kubelet drops the devices when the plugin's stream ends, a moment after the socket
        # goes, and rewrites no file then: the agent's follow-up look after the socket change sees
        # it, long before its timer (an hour here).
        await run.recorder.until(lambda: "plugin.unregistered" in run.recorder.kinds(mark), timeout=10)
        await plugin.start()  # a new process, registering anew
        await run.recorder.until(lambda: "plugin.registered" in run.recorder.kinds(mark), timeout=15)
        await run.released()
        assert run.recorder.kinds(mark) == ["plugin.unregistered", "plugin.registered"]
        assert all(e.details["resource"] == GPU for e in run.recorder.events[mark:])


async def test_a_plugin_whose_streams_outlive_its_socket_is_a_departure_not_a_failure(
    real_node: RealNode, short_tmp: Path
) -> None:
    """The socket goes first, the ListAndWatch stream 1 s later, and only then does the real
    device manager drop the devices (writing no file): the look the socket's removal triggers sees
    them all still there. That drop is the plugin leaving, never `device.removed`."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    await real_node.admit("ml", "trainer-linger", {"main": {GPU: 1}})
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        cycles = run.recorder.cycles
        await plugin.leave(linger=1.0)  # returns once the process has ended: the drop is due
        assert run.recorder.cycles > cycles  # a look came while the socket was gone, devices there
        await run.recorder.until(lambda: bool(run.recorder.kinds(mark)), timeout=10)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["plugin.unregistered"]
        assert run.recorder.events[mark].details["resource"] == GPU


async def test_a_quick_device_plugin_restart_gives_no_event_but_plugin_lifecycle(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Stopped and started at once: whether the agent catches the gap is timing, but it never
    reports anything else (no device missing, no allocation change)."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    await real_node.admit("ml", "trainer-quick", {"main": {GPU: 1}})
    async with _agent(short_tmp, real_node) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        await plugin.restart()
        await run.released()
        assert run.recorder.kinds(mark) in ([], ["plugin.unregistered", "plugin.registered"])
        assert run.agent.inventory == before


async def test_an_allocated_device_turning_unhealthy_is_critical_and_healing_resolves_it(
    real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    held = await real_node.admit("ml", "trainer-health", {"main": {GPU: 1}})
    (victim,) = held["main"][GPU]
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await plugin.set_healthy(victim, False)  # through ListAndWatch
        await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark))
        (removed,) = [e for e in run.recorder.events[mark:] if e.kind == "device.removed"]
        assert str(removed.severity) == "critical"
        assert removed.details["device"] == victim
        assert removed.details["allocated_to"] == ["ml/trainer-health/main"]
        assert "ml/trainer-health/main" in removed.summary
        mark = len(run.recorder.events)
        await plugin.set_healthy(victim, True)
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark))
        (added,) = [e for e in run.recorder.events[mark:] if e.kind == "device.added"]
        assert added.details["device"] == victim
        assert list(added.details["numa"]) == list(GPUS[victim])


async def test_a_hot_plugged_device_is_reported_added(real_node: RealNode, short_tmp: Path) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await plugin.add_device("gpu-hotplug", (1,))
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark))
        (added,) = [e for e in run.recorder.events[mark:] if e.kind == "device.added"]
        assert added.details == {"resource": GPU, "device": "gpu-hotplug", "numa": [1]}


async def test_a_pod_admitted_with_devices_and_removed_shows_as_the_agent_reports_it(
    real_node: RealNode, short_tmp: Path
) -> None:
    await real_node.add_plugin(GPU, GPUS)
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        held = await real_node.admit("team", "job-alloc", {"main": {GPU: 2}})
        ids = sorted(held["main"][GPU])
        assert len(ids) == 2
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark))
        (added,) = [e for e in run.recorder.events[mark:] if e.kind == "allocation.added"]
        assert (added.details["namespace"], added.details["pod"], added.details["container"]) == (
            "team",
            "job-alloc",
            "main",
        )
        assert added.details["devices"] == {GPU: ids}
        mark = len(run.recorder.events)
        await real_node.remove("team", "job-alloc")
        # The device manager frees the devices in memory; the DRA manager's checkpoint, rewritten
        # at every pod's end, and the Pods API tell the agent. A forced look settles it here.
        await run.quiet_cycle()
        (gone,) = [e for e in run.recorder.events[mark:] if e.kind == "allocation.removed"]
        assert gone.details["devices"] == {GPU: ids}
        # Freed for real: a pod can now take every device.
        again = await real_node.admit("team", "job-all", {"main": {GPU: len(GPUS)}})
        assert sorted(again["main"][GPU]) == sorted(GPUS)


async def test_the_device_manager_refuses_more_devices_than_are_free_in_upstreams_words(
    real_node: RealNode,
) -> None:
    await real_node.add_plugin(GPU, GPUS)
    with pytest.raises(AdmissionError) as caught:
        await real_node.admit("team", "job-greedy", {"main": {GPU: len(GPUS) + 1}})
    # The device manager's own words, as the kubelet puts them in the refused pod's status.
    assert caught.value.reason == "UnexpectedAdmissionError"
    assert caught.value.message == (
        f"Pod was rejected: Allocate failed due to requested number of devices unavailable for {GPU}. "
        f"Requested: {len(GPUS) + 1}, Available: {len(GPUS)}, which is unexpected"
    )
    listed = await _list(real_node.socket_path)
    assert all(p.name != "job-greedy" for p in listed.pod_resources)  # a refused pod holds nothing


async def test_the_agent_at_its_highest_rate_cap_stays_under_the_real_rate_limiter(
    real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    async with _agent(short_tmp, real_node, max_rpc_rate=50) as run:  # the most [watch] max_rpc_rate allows
        answered = run.queries_ok()
        for flip in range(FLIPS):  # each flip rewrites the checkpoint: a trigger to re-query
            seen = run.queries_ok()
            await plugin.set_healthy("gpu3", flip % 2 == 1)
            await run.recorder.until(lambda seen=seen: run.queries_ok() > seen)
        await run.quiet_cycle()
        assert run.agent.metrics.value("requeries_total", result="rate_limited") == 0
        assert run.queries_ok() - answered >= FLIPS  # the burst did drive a re-query each


# -- the fake checked against the real one --


async def test_the_fake_and_the_real_limiter_reject_with_the_same_status_and_text(
    real_node: RealNode, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    async def burst(socket: Path) -> set[tuple[grpc.StatusCode, str]]:
        async with aio.insecure_channel(f"unix:{socket}") as channel:
            call = channel.unary_unary(SERVICE + "List")
            results = await asyncio.gather(*(call(b"", timeout=5) for _ in range(40)), return_exceptions=True)
        return {(r.code(), r.details() or "") for r in results if isinstance(r, aio.AioRpcError)}

    real = await burst(real_node.socket_path)
    fake = await start_kubelet(root=short_tmp / "fake")
    faked = await burst(fake.socket_path)
    assert real == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")}
    assert faked == real


async def test_the_fake_and_the_real_answer_get_of_an_unknown_pod_alike(
    real_node: RealNode, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    request = api_pb2.GetPodResourcesRequest(pod_namespace="nowhere", pod_name="ghost").SerializeToString()
    real = await _error(real_node.socket_path, "Get", request)
    fake = await start_kubelet(root=short_tmp / "fake")
    faked = await _error(fake.socket_path, "Get", request)
    assert real == (grpc.StatusCode.UNKNOWN, "pod ghost in namespace nowhere not found")
    assert faked == real


async def test_the_fake_and_the_real_socket_have_one_mode_and_are_replaced_on_restart(
    real_node: RealNode, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    def identity(path: Path) -> tuple[int, int, int]:
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, stat.S_IMODE(st.st_mode)

    real_before = identity(real_node.socket_path)
    await real_node.restart()
    real_after = identity(real_node.socket_path)
    fake = await start_kubelet(root=short_tmp / "fake")
    fake_before = identity(fake.socket_path)
    await fake.restart()
    fake_after = identity(fake.socket_path)
    assert stat.S_ISSOCK(os.stat(real_node.socket_path).st_mode)
    assert real_before[:2] != real_after[:2]  # a new file (its inode may be reused; its time is not)
    assert fake_before[:2] != fake_after[:2]
    assert real_after[2] == fake_after[2], f"socket mode: real {real_after[2]:o}, fake {fake_after[2]:o}"


async def test_the_warm_up_shows_allocations_at_once_and_allocatable_empty_until_the_plugin_registers(
    real_node: RealNode, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    held = await real_node.admit("ml", "trainer-warmup", {"main": {GPU: 2}})
    await real_node.stop()
    await plugin.stop()  # a plugin not back yet: the kubelet knows its devices only by its checkpoint
    await real_node.start()

    # The pods come back as soon as the kubelet has them from the API server (its pod manager is
    # empty for a moment after a start: List may say nothing at first), with their devices from
    # the checkpoint, while the plugin's devices are not allocatable.
    async def allocations_back() -> bool:
        return _devices_of(await _list(real_node.socket_path), "ml", "trainer-warmup") == set(
            held["main"][GPU]
        )

    await wait_until(allocations_back, 30, interval=0.05, what="the pod's devices listed again")
    assert [d for d in (await _allocatable(real_node.socket_path)).devices if d.resource_name == GPU] == []
    await plugin.start()

    async def all_back() -> bool:  # registered; its first ListAndWatch answer follows
        allocatable = await _allocatable(real_node.socket_path)
        return {i for d in allocatable.devices for i in d.device_ids} == set(GPUS)

    await wait_until(all_back, what="the plugin's devices back in allocatable")

    # The fake's warm-up has the same shape.
    fake = await start_kubelet(root=short_tmp / "fake", warmup=Warmup(never=frozenset({"nvidia.com/gpu"})))
    held_fake = {
        i for p in fake.node.pods.values() for c in p.containers for i in c.devices.get("nvidia.com/gpu", [])
    }
    listed = await _list(fake.socket_path)
    assert (
        held_fake
        and {
            i
            for pod in listed.pod_resources
            for c in pod.containers
            for d in c.devices
            if d.resource_name == "nvidia.com/gpu"
            for i in d.device_ids
        }
        == held_fake
    )
    faked = await _allocatable(fake.socket_path)
    assert [d for d in faked.devices if d.resource_name == "nvidia.com/gpu"] == []


async def test_a_restart_whose_first_look_is_rate_limited_still_holds_the_warm_up(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Issue 36 item 4 on the real limiter and checkpoint restore: another client spends the new
    kubelet's shared limit, so the agent's first look after the restart is refused; the device
    plugin is slow to register again (paused), so the next answer is the warm-up itself. Only
    `kubelet.restarted` may come of it."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    await real_node.admit("ml", "trainer-warm", {"main": {GPU: 2}})
    async with _agent(short_tmp, real_node) as run:
        before, mark = run.agent.inventory, len(run.recorder.events)
        registered = plugin.registrations
        assert plugin.process is not None
        plugin.process.pause()
        busy = asyncio.Event()
        others = [asyncio.create_task(_spend_the_limit(real_node.socket_path, busy)) for _ in range(8)]
        try:
            await real_node.stop()
            await real_node.start()
            metrics = run.agent.metrics
            await run.recorder.until(
                lambda: (
                    "kubelet.restarted" in run.recorder.kinds(mark)
                    and metrics.value("requeries_total", result="rate_limited") > 0
                ),
                timeout=30,
            )
        finally:
            busy.set()
            await asyncio.gather(*others)
        await run.quiet_cycle()  # answered now: allocations restored, no GPU allocatable yet
        plugin.process.resume()
        await plugin.wait_registered(registered + 1)
        await real_node.wait_allocatable(GPU, set(GPUS))
        await run.released()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"]
        assert run.agent.inventory == before


async def _spend_the_limit(socket: Path, done: asyncio.Event) -> None:
    """Another client on the node, calling List as fast as it can (its refusals ignored)."""
    while not done.is_set():
        try:
            await _call(socket, "List")
        except (aio.AioRpcError, OSError):
            await asyncio.sleep(0)  # refused, or the socket is being replaced: at once again
