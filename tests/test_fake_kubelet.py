"""The fake kubelet keeps the real kubelet's quirks; otherwise our tests would prove nothing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from testkit.fake_kubelets import StartKubelet
from watcher import errors
from watcher.kubelet.client import PodResourcesClient
from watcher.model.build import build
from watcher.ratelimit import TokenBucket
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeDevice, FakeNode, FakePod, default_node
from watcher.sim.fake_plugins import Warmup, plugin_socket_name

GPU = "nvidia.com/gpu"


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


async def test_socket_is_renamed_into_place_as_a_new_file_on_every_start(kubelet: FakeKubelet) -> None:
    first = _identity(kubelet.socket_path)
    await kubelet.restart()
    second = _identity(kubelet.socket_path)
    assert first != second
    assert kubelet.starts == 2
    # Only the final name is left: the temporary listening name was renamed away.
    assert [p.name for p in kubelet.socket_dir.iterdir()] == ["kubelet.sock"]
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        assert (await client.list()).pod_resources


async def test_a_stopped_kubelet_leaves_a_stale_socket(kubelet: FakeKubelet) -> None:
    await kubelet.stop()
    assert not kubelet.running
    assert kubelet.socket_path.is_socket()  # stale: nobody listens
    started = time.monotonic()
    await kubelet.restart(downtime=0.2)
    assert time.monotonic() - started >= 0.2
    assert kubelet.running


async def test_answers_are_shuffled_but_mean_the_same(kubelet: FakeKubelet) -> None:
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        allocs = [await client.allocatable_raw() for _ in range(3)]
        lists = [await client.list_raw() for _ in range(3)]
    assert len(set(allocs)) > 1 and len(set(lists)) > 1
    from watcher.kubeletapi.v1 import api_pb2

    inventories = {
        build(
            api_pb2.AllocatableResourcesResponse.FromString(a), api_pb2.ListPodResourcesResponse.FromString(p)
        ).content_hash
        for a, p in zip(allocs, lists, strict=True)
    }
    assert len(inventories) == 1


async def test_one_entry_per_device_per_numa_node(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    node = FakeNode()
    node.add_device(FakeDevice("example.com/xpu", "xpu0", (0, 1)))
    node.add_device(FakeDevice("example.com/xpu", "xpu1"))
    fake = await start_kubelet(node, root=short_tmp)
    resp = fake.allocatable_response()
    entries = sorted(
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes], d.HasField("topology"))
        for d in resp.devices
    )
    assert entries == [
        ("example.com/xpu", ["xpu0"], [0], True),
        ("example.com/xpu", ["xpu0"], [1], True),
        ("example.com/xpu", ["xpu1"], [], False),
    ]


async def test_unhealthy_device_vanishes_from_allocatable_but_stays_allocated(kubelet: FakeKubelet) -> None:
    trainer = kubelet.node.pods[("ml", "trainer-0")].container("trainer")
    gpu = trainer.devices[GPU][0]
    kubelet.make_unhealthy(GPU, gpu)
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    assert gpu not in inv.devices_by_resource[GPU]
    assert [m.id for m in inv.missing_devices] == [gpu]
    assert inv.missing_devices[0].holders == ("ml/trainer-0/trainer",)
    kubelet.heal(GPU, gpu)
    healed = build(kubelet.allocatable_response(), kubelet.list_response())
    assert gpu in healed.devices_by_resource[GPU]
    assert healed.missing_devices == ()


async def test_hotplug_unplug_allocate_and_free(kubelet: FakeKubelet) -> None:
    kubelet.add_device(GPU, "GPU-new", (1,))
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    assert inv.devices_by_resource[GPU]["GPU-new"] == (1,)
    kubelet.allocate("team", "job", "main", devices={GPU: ["GPU-new"]}, cpu_ids=[60, 61])
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    job = inv.pod("team", "job")
    assert job is not None and job.containers[0].cpu_ids == (60, 61)
    kubelet.remove_device(GPU, "GPU-new")
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    assert [m.id for m in inv.missing_devices] == ["GPU-new"]
    kubelet.free("team", "job")
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    assert inv.pod("team", "job") is None and inv.missing_devices == ()


async def test_checkpoint_rewritten_by_rename_on_every_change(kubelet: FakeKubelet) -> None:
    before = _identity(kubelet.checkpoint_path)
    old = json.loads(kubelet.checkpoint_path.read_text())
    kubelet.make_unhealthy(GPU, next(iter(kubelet.node.devices.values())).id)
    after = _identity(kubelet.checkpoint_path)
    new = json.loads(kubelet.checkpoint_path.read_text())
    assert before[1] != after[1] or before[2] != after[2]
    assert len(new["Data"]["RegisteredDevices"][GPU]) == len(old["Data"]["RegisteredDevices"][GPU]) - 1
    assert {"Data", "Checksum"} <= set(new)
    # No temporary files are left behind: the checkpoint and one socket per registered plugin.
    names = sorted(p.name for p in kubelet.checkpoint_path.parent.iterdir())
    sockets = sorted(plugin_socket_name(r) for r in {r for r, _ in kubelet.node.devices})
    assert names == sorted(["kubelet_internal_checkpoint", *sockets])
    cpu_state = json.loads(kubelet.cpu_state_path.read_text())
    assert cpu_state["policyName"] == "static" and cpu_state["entries"]


async def test_cpus_and_memory_change_across_a_restart(kubelet: FakeKubelet) -> None:
    await kubelet.restart(cpu_ids=range(2, 64))
    inv = build(kubelet.allocatable_response(), kubelet.list_response())
    assert inv.cpu_ids == tuple(range(2, 64))


async def test_get_and_disabled_methods_from_the_wire(kubelet: FakeKubelet) -> None:
    kubelet.faults.disable("GetAllocatableResources")
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        assert (await client.get("dra", "claimed-gpu")).pod_resources.containers[0].dynamic_resources
    kubelet.faults.enable("GetAllocatableResources")
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        assert (await client.allocatable()).cpu_ids


def test_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=100, burst=10, clock=lambda: now[0])
    assert [bucket.take() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 0.05  # 5 tokens
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    now[0] += 10  # never more than the burst
    assert sum(bucket.take() for _ in range(20)) == 10


def test_default_node_looks_real() -> None:
    node = default_node()
    gpus = [d for d in node.devices.values() if d.resource == GPU]
    assert len(gpus) == 8 and {d.numa for d in gpus} == {(0,), (1,)}
    assert len(node.cpu_ids) >= 64
    assert any(m.type.startswith("hugepages-") for m in node.memory)
    claims = [cl for p in node.pods.values() for c in p.containers for cl in c.claims]
    assert len(claims) == 1
    assert 3 <= len(node.pods) <= 8
    assert isinstance(node.pods[("ml", "trainer-0")], FakePod)


async def test_a_restart_warms_up_like_a_real_kubelet(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    """Allocations come back at once, devices only as each plugin re-registers, pods as List syncs."""
    warmup = Warmup(plugin_delay=(0.05, 0.3), pods_delay=(0.0, 0.2))
    fake = await start_kubelet(seed=3, warmup=warmup)
    await fake.plugins.wait_settled()
    full = build(fake.allocatable_response(), fake.list_response())
    await fake.restart()
    early = build(fake.allocatable_response(), fake.list_response())
    assert early.devices == ()  # every resource's healthy set starts empty
    assert len(early.pods) < len(full.pods)
    assert not any(p.name.endswith(".sock") for p in fake.checkpoint_path.parent.iterdir())
    await fake.plugins.wait_settled()
    assert build(fake.allocatable_response(), fake.list_response()) == full
    sockets = {p.name for p in fake.checkpoint_path.parent.iterdir() if p.name.endswith(".sock")}
    assert sockets == {plugin_socket_name(r) for r, _ in fake.node.devices}


async def test_a_warm_up_whose_plugins_all_return_on_the_same_loop_turn_settles(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Equal delays end on one loop turn: the last plugin to register must still see the warm-up
    over (a finished task whose done callback had not run yet once kept it open for ever)."""
    warmup = Warmup(plugin_delay=(0.05, 0.05), pods_delay=(0.05, 0.05))
    fake = await start_kubelet(seed=3, warmup=warmup)
    assert len({r for r, _ in fake.node.devices}) >= 2
    await fake.restart()
    async with asyncio.timeout(5):
        await fake.plugins.wait_settled()
    assert not fake.plugins.down


async def test_a_plugin_restart_takes_its_devices_away_and_back(kubelet: FakeKubelet) -> None:
    full = build(kubelet.allocatable_response(), kubelet.list_response())
    socket = kubelet.checkpoint_path.parent / plugin_socket_name(GPU)
    kubelet.plugins.restart_plugin(GPU, downtime=0.05)
    gone = build(kubelet.allocatable_response(), kubelet.list_response())
    assert not socket.exists()
    assert {d.resource for d in gone.devices} == {d.resource for d in full.devices} - {GPU}
    assert gone.pods == full.pods  # allocations stay
    await kubelet.plugins.wait_settled()
    assert socket.exists() and build(kubelet.allocatable_response(), kubelet.list_response()) == full


async def test_unknown_methods_spend_no_token_and_texts_are_the_kubelets(kubelet: FakeKubelet) -> None:
    kubelet.faults.make_absent("Get")
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        for _ in range(kubelet.burst * 3):
            with pytest.raises(errors.MethodNotImplementedError, match="unknown method Get for service"):
                await client.get("ml", "trainer-0")
        assert kubelet.rejected == 0
        kubelet.faults.disable("GetAllocatableResources")
        with pytest.raises(
            errors.MethodDisabledError, match="Pod Resources API GetAllocatableResources disabled"
        ):
            await client.allocatable()
