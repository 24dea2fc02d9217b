"""The fake kubelet's Pods API (v1alpha1.Pods) behaves as upstream's server: the order, the
events, the minimal DELETED, the warm-up refusal, the dropped laggard, the shared limiter, the
socket. (tests/test_e2e_pods_api.py holds the fake and kubelet-lite to the same checks.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from testkit.fake_kubelets import StartKubelet
from watcher.kubelet.client import PodResourcesClient
from watcher.kubeletapi.k8s import core_v1_pb2
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeClaimDevice, FakeContainer, FakeOwner, FakePod, dra_backed_gpu_pod
from watcher.sim.fake_plugins import Warmup
from watcher.sim.fake_pods_api import WATCH_BUFFER
from watcher.sim.fake_script import ScriptError, parse_script, play

GPU = "nvidia.com/gpu"
METHOD = "/v1alpha1.Pods/"
ADDED, MODIFIED, DELETED, SYNCED = (
    pods_pb2.ADDED,
    pods_pb2.MODIFIED,
    pods_pb2.DELETED,
    pods_pb2.INITIAL_SYNC_COMPLETE,
)
Event = tuple[int, core_v1_pb2.Pod]


def _api(kubelet: FakeKubelet) -> Path:
    assert kubelet.pods_api is not None
    return kubelet.pods_api.socket_path


async def _unary(channel: aio.Channel, method: str, request: bytes = b"") -> bytes:
    return bytes(await channel.unary_unary(METHOD + method)(request, timeout=5))


async def _list(kubelet: FakeKubelet) -> list[core_v1_pb2.Pod]:
    async with aio.insecure_channel(f"unix:{_api(kubelet)}") as channel:
        answer = pods_pb2.ListPodsResponse.FromString(await _unary(channel, "ListPods"))
    return [core_v1_pb2.Pod.FromString(p) for p in answer.pods]


class Watch:
    """One WatchPods stream; `next()` is its next event, decoded."""

    def __init__(self, channel: aio.Channel) -> None:
        self.call = channel.unary_stream(METHOD + "WatchPods")(b"")
        self._stream = self.call.__aiter__()

    async def next(self, timeout: float = 5.0) -> Event:
        raw = await asyncio.wait_for(self._stream.__anext__(), timeout)
        event = pods_pb2.WatchPodsEvent.FromString(raw)
        return event.type, core_v1_pb2.Pod.FromString(event.pod)

    async def until_it_ends(self, limit: int) -> tuple[list[int], aio.AioRpcError]:
        """The "change" label of each event until the stream's error (at most `limit` events)."""
        seen = []
        for _ in range(limit):
            try:
                _, pod = await self.next()
            except aio.AioRpcError as err:
                return seen, err
            seen.append(int(pod.metadata.labels["change"]))
        raise AssertionError(f"the stream did not end within {limit} events")

    async def snapshot(self) -> list[core_v1_pb2.Pod]:
        """The ADDED events up to INITIAL_SYNC_COMPLETE."""
        pods = []
        for _ in range(1000):
            kind, pod = await self.next()
            if kind == SYNCED:
                return pods
            assert kind == ADDED
            pods.append(pod)
        raise AssertionError("no INITIAL_SYNC_COMPLETE")


@pytest.fixture
async def watch(kubelet: FakeKubelet) -> AsyncIterator[Watch]:
    async with aio.insecure_channel(f"unix:{_api(kubelet)}") as channel:
        w = Watch(channel)
        yield w
        w.call.cancel()


def _statuses(pod: core_v1_pb2.Pod) -> dict[str, dict[str, str]]:
    """container -> device id -> health, from allocatedResourcesStatus."""
    return {
        c.name: {h.resourceID: h.health for s in c.allocatedResourcesStatus for h in s.resources}
        for c in pod.status.containerStatuses
    }


async def test_list_pods_gives_every_pod_in_uid_order_with_what_the_agent_reads(kubelet: FakeKubelet) -> None:
    pods = await _list(kubelet)
    assert [p.metadata.uid for p in pods] == sorted(p.uid for p in kubelet.node.pods.values())
    trainer = next(p for p in pods if p.metadata.name == "trainer-0")
    (owner,) = trainer.metadata.ownerReferences
    assert (owner.kind, owner.name, owner.apiVersion, owner.controller) == (
        "Job",
        "llm-pretrain",
        "batch/v1",
        True,
    )
    assert trainer.metadata.labels["team"] == "research"
    assert trainer.spec.nodeName == "fake-node" and trainer.status.phase == "Running"
    main = next(c for c in trainer.spec.containers if c.name == "trainer")
    assert main.resources.limits[GPU].string == "4" == main.resources.requests[GPU].string
    held = kubelet.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU]
    assert _statuses(trainer) == {"log-shipper": {}, "trainer": dict.fromkeys(held, "Healthy")}
    claimed = next(p for p in pods if p.metadata.name == "claimed-gpu")
    assert [c.name for c in claimed.spec.resourceClaims] == ["gpu-claim"]
    assert [c.name for c in claimed.spec.containers[0].resources.claims] == ["gpu-claim"]


async def test_a_device_turning_unhealthy_shows_in_the_holders_status_and_unplugged_stays_healthy(
    kubelet: FakeKubelet,
) -> None:
    held = kubelet.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU]
    kubelet.make_unhealthy(GPU, held[0])
    kubelet.remove_device(GPU, held[1])  # the device manager has no health for it: its default
    (trainer,) = [p for p in await _list(kubelet) if p.metadata.name == "trainer-0"]
    assert _statuses(trainer)["trainer"] == {
        held[0]: "Unhealthy",
        held[1]: "Healthy",
        held[2]: "Healthy",
        held[3]: "Healthy",
    }


async def test_get_pod_answers_one_pod_by_uid_and_not_found_in_upstreams_words(kubelet: FakeKubelet) -> None:
    uid = kubelet.node.pods[("net", "dpdk-router")].uid
    async with aio.insecure_channel(f"unix:{_api(kubelet)}") as channel:
        found = await _unary(channel, "GetPod", pods_pb2.GetPodRequest(podUID=uid).SerializeToString())
        with pytest.raises(aio.AioRpcError) as caught:
            await _unary(channel, "GetPod", pods_pb2.GetPodRequest(podUID="ghost").SerializeToString())
    pod = core_v1_pb2.Pod.FromString(pods_pb2.GetPodResponse.FromString(found).pod)
    assert (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid) == ("net", "dpdk-router", uid)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "pod with UID ghost not found"


async def test_watch_gives_the_snapshot_in_uid_order_then_each_change_and_a_bare_deleted_last(
    kubelet: FakeKubelet, watch: Watch
) -> None:
    snapshot = await watch.snapshot()
    assert [p.metadata.uid for p in snapshot] == sorted(p.uid for p in kubelet.node.pods.values())

    kubelet.add_pod(
        FakePod("ml", "eval-1", [FakeContainer("main")], uid="e-1", owners=[FakeOwner("Job", "eval")])
    )
    kind, pod = await watch.next()
    assert (kind, pod.metadata.uid, pod.metadata.ownerReferences[0].name) == (ADDED, "e-1", "eval")

    kubelet.update_pod("ml", "eval-1", phase="Succeeded")  # a status change
    kind, pod = await watch.next()
    assert (kind, pod.metadata.uid, pod.status.phase) == (MODIFIED, "e-1", "Succeeded")

    device = kubelet.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
    kubelet.make_unhealthy(GPU, device)  # the holder's allocatedResourcesStatus changes
    kind, pod = await watch.next()
    assert (kind, pod.metadata.name) == (MODIFIED, "inference-7f9c")
    assert _statuses(pod)["server"][device] == "Unhealthy"

    kubelet.update_pod("ml", "eval-1", labels={"team": "eval"})  # a spec (metadata) change
    kind, pod = await watch.next()
    assert (kind, dict(pod.metadata.labels)) == (MODIFIED, {"team": "eval"})

    kubelet.free("ml", "eval-1")
    kind, pod = await watch.next()
    assert kind == DELETED
    assert (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid) == ("ml", "eval-1", "e-1")
    assert pod == core_v1_pb2.Pod(metadata=pod.metadata) and len(pod.metadata.ListFields()) == 3

    kubelet.add_device(GPU, "GPU-new", (0,))  # no pod holds it: no event; the next is the next change
    kubelet.update_pod("ml", "trainer-0", phase="Failed")
    kind, pod = await watch.next()
    assert (kind, pod.metadata.name) == (MODIFIED, "trainer-0")


async def test_a_change_just_before_the_watch_can_come_twice_as_upstreams_broadcaster_does(
    kubelet: FakeKubelet,
) -> None:
    assert kubelet.pods_api is not None
    kubelet.pods_api.delay_broadcasts(0.5)
    kubelet.update_pod("net", "dpdk-router", labels={"version": "2"})
    async with aio.insecure_channel(f"unix:{_api(kubelet)}") as channel:
        watch = Watch(channel)
        snapshot = await watch.snapshot()
        (router,) = [p for p in snapshot if p.metadata.name == "dpdk-router"]
        assert dict(router.metadata.labels) == {"version": "2"}  # the snapshot has the change
        kind, again = await watch.next()  # and the broadcast brings it once more
        assert (kind, again) == (MODIFIED, router)
        watch.call.cancel()


async def test_a_watcher_that_lags_100_events_is_dropped_after_its_buffer_and_others_go_on(
    kubelet: FakeKubelet,
) -> None:
    assert kubelet.pods_api is not None
    # No window growth on the laggard's connection: what the transport buffers stays bounded.
    options = [("grpc.http2.bdp_probe", 0)]
    async with (
        aio.insecure_channel(f"unix:{_api(kubelet)}", options=options) as lagging_channel,
        aio.insecure_channel(f"unix:{_api(kubelet)}") as reading_channel,
    ):
        lagging, reading = Watch(lagging_channel), Watch(reading_channel)
        await lagging.snapshot()
        await reading.snapshot()
        changes = 0
        for changes in range(1, 20_000):  # the laggard reads nothing meanwhile
            kubelet.update_pod("ml", "trainer-0", labels={"change": str(changes)})
            kind, pod = await reading.next()
            assert (kind, pod.metadata.labels["change"]) == (MODIFIED, str(changes))
            if kubelet.pods_api.dropped:
                break
        assert kubelet.pods_api.dropped == 1 and kubelet.pods_api.watchers == 1
        assert changes > WATCH_BUFFER
        # The laggard still gets what was buffered, in order, then the end.
        seen, end = await lagging.until_it_ends(changes + 1)
        assert (end.code(), end.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "watch client channel closed",
        )
        assert seen == list(range(1, len(seen) + 1)) and len(seen) >= WATCH_BUFFER
        kubelet.update_pod("ml", "trainer-0", phase="Failed")  # the reader goes on
        assert (await reading.next())[0] == MODIFIED
        reading.call.cancel()


async def test_list_and_get_share_one_100_per_second_burst_10_bucket_and_watch_is_not_limited(
    kubelet: FakeKubelet,
) -> None:
    assert kubelet.pods_api is not None
    get = pods_pb2.GetPodRequest(podUID=kubelet.node.pods[("ml", "trainer-0")].uid).SerializeToString()
    async with aio.insecure_channel(f"unix:{_api(kubelet)}") as channel:
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(
            *(_unary(channel, "ListPods" if i % 2 else "GetPod", b"" if i % 2 else get) for i in range(40)),
            return_exceptions=True,
        )
        elapsed = loop.time() - started
        refused = [r for r in results if isinstance(r, aio.AioRpcError)]
        assert refused, "40 calls at once all passed a burst of 10"
        assert {(r.code(), r.details()) for r in refused} == {
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        }
        assert len(results) - len(refused) <= 10 + 100 * elapsed + 1
        assert kubelet.pods_api.rejected == len(refused)
        # While the bucket is empty a watch still opens, and pod-resources has its own limiter.
        watch = Watch(channel)
        assert len(await watch.snapshot()) == len(kubelet.node.pods)
        watch.call.cancel()
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        assert (await client.list()).pod_resources


async def test_every_call_is_failed_precondition_while_the_warm_up_hides_pods(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(
        root=short_tmp, seed=3, warmup=Warmup(plugin_delay=(0.0, 0.1), pods_delay=(0.4, 0.6))
    )
    async with aio.insecure_channel(f"unix:{_api(fake)}") as channel:
        with pytest.raises(aio.AioRpcError) as listed:
            await _unary(channel, "ListPods")
        with pytest.raises(aio.AioRpcError) as got:
            await _unary(channel, "GetPod", pods_pb2.GetPodRequest(podUID="x").SerializeToString())
        with pytest.raises(aio.AioRpcError) as watched:
            await Watch(channel).next()
        for caught in (listed, got, watched):
            assert (caught.value.code(), caught.value.details()) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "Kubelet is initializing",
            )
        await fake.plugins.wait_settled()
        watch = Watch(channel)
        assert len(await watch.snapshot()) == len(fake.node.pods)
        watch.call.cancel()


async def test_the_socket_is_replaced_on_restart_and_a_stopped_kubelet_leaves_it_stale(
    kubelet: FakeKubelet, watch: Watch
) -> None:
    path = _api(kubelet)
    assert path == kubelet.root / "pods-api" / "pods-api.sock" and path.is_socket()
    await watch.snapshot()
    before = path.stat()
    await kubelet.stop()
    with pytest.raises(aio.AioRpcError):  # the watch ends with the kubelet
        await watch.next()
    assert path.is_socket()  # stale: nobody listens
    await kubelet.start()
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    assert [p.name for p in path.parent.iterdir()] == ["pods-api.sock"]
    assert len(await _list(kubelet)) == len(kubelet.node.pods)


async def test_a_kubelet_without_the_pods_api_has_no_socket(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(root=short_tmp, pods_api=False)
    assert fake.pods_api is None
    assert not (short_tmp / "pods-api").exists()


async def test_a_dra_devices_health_and_its_drivers_words_show_in_the_holders_status(
    kubelet: FakeKubelet, watch: Watch
) -> None:
    await watch.snapshot()
    (claimed,) = [p for p in await _list(kubelet) if p.metadata.name == "claimed-gpu"]
    assert _statuses(claimed) == {"app": {"gpu.example.com/gpu=gpu-8": "Healthy"}}
    kubelet.dra.set_health(
        "gpu.example.com", "node-a", "gpu-8", "Unhealthy", "critical XID 79 reported by NVML"
    )
    kind, pod = await watch.next()
    assert (kind, pod.metadata.name) == (MODIFIED, "claimed-gpu")
    (status,) = pod.status.containerStatuses[0].allocatedResourcesStatus
    (health,) = status.resources
    assert status.name == "claim:gpu-claim"  # no request named: the whole claim
    assert (health.resourceID, health.health, health.message) == (
        "gpu.example.com/gpu=gpu-8",  # the device's first CDI id
        "Unhealthy",
        "critical XID 79 reported by NVML",
    )
    kubelet.dra.set_health("gpu.example.com", "node-a", "gpu-8", "Unknown")
    kind, pod = await watch.next()
    (health,) = pod.status.containerStatuses[0].allocatedResourcesStatus[0].resources
    assert (health.health, health.HasField("message")) == ("Unknown", False)
    with pytest.raises(KeyError):
        kubelet.dra.set_health("gpu.example.com", "node-a", "gpu-404", "Unhealthy")


async def test_a_dra_backed_gpu_request_names_its_claim_and_has_no_health_as_upstream(
    kubelet: FakeKubelet,
) -> None:
    device = FakeClaimDevice("gpu.nvidia.com", "node-a", "gpu-9")  # no CDI id: driver/pool/device
    kubelet.add_pod(dra_backed_gpu_pod("ml", "notebook-0", [device], container="lab"))
    (pod,) = [p for p in await _list(kubelet) if p.metadata.name == "notebook-0"]
    (lab,) = pod.spec.containers
    assert lab.resources.limits[GPU].string == "1" and not lab.resources.claims
    assert not pod.spec.resourceClaims
    extended = pod.status.extendedResourceClaimStatus
    (mapping,) = extended.requestMappings
    assert extended.resourceClaimName.startswith("notebook-0-extended-resources-")
    assert (mapping.containerName, mapping.resourceName, mapping.requestName) == (
        "lab",
        GPU,
        "container-0-request-0",
    )
    # Upstream's DRA manager reports health only for the claims a container lists; this one is not.
    kubelet.dra.set_health("gpu.nvidia.com", "node-a", "gpu-9", "Unhealthy", "XID 79")
    (pod,) = [p for p in await _list(kubelet) if p.metadata.name == "notebook-0"]
    assert _statuses(pod) == {"lab": {}}
    # pod-resources shows its device under dynamic_resources, not as a device-plugin device.
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        listed = await client.list()
    (mine,) = [p for p in listed.pod_resources if p.name == "notebook-0"]
    (container,) = mine.containers
    assert not container.devices
    assert [r.device_name for d in container.dynamic_resources for r in d.claim_resources] == ["gpu-9"]


async def test_the_script_plays_dra_health_and_phase_steps(kubelet: FakeKubelet, watch: Watch) -> None:
    await watch.snapshot()
    steps = parse_script(
        "0 dra-health gpu.example.com/node-a/gpu-8 Unhealthy critical XID 79 reported by NVML\n"
        "0 phase ml/trainer-0 Failed\n"
    )
    await play(kubelet, steps)
    events = {pod.metadata.name: pod for _, pod in [await watch.next(), await watch.next()]}
    health = events["claimed-gpu"].status.containerStatuses[0].allocatedResourcesStatus[0].resources[0]
    assert (health.health, health.message) == ("Unhealthy", "critical XID 79 reported by NVML")
    assert events["trainer-0"].status.phase == "Failed"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 dra-health gpu.example.com/gpu-8 Unhealthy", r"usage: AT dra-health DRIVER/POOL/DEVICE"),
        ("1 dra-health d/p/x Broken", r"usage: AT dra-health DRIVER/POOL/DEVICE Healthy\|Unhealthy\|Unknown"),
        ("1 phase ml/job", r"usage: AT phase NAMESPACE/POD PHASE"),
    ],
)
def test_a_bad_dra_health_or_phase_step_is_refused(text: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(text)
