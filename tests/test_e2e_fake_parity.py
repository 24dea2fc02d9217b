"""The fake kubelet (watcher.sim) checked against upstream's whole kubelet (peers/cmd/kubelet on a
Node of a real API server, `testkit.real_node`), beyond the scenario both play in
tests/test_e2e_kubelet_parity.py, and two questions about the real kubelet that the agent's design
rests on, answered by measuring it.

Every difference found between the two is either fixed in the fake (FIXED, each shown equal by the
test it names) or kept on purpose (KEPT_DIFFERENCES: what the upstream kubelet does, what the fake
does, why it stays, and the test that shows the difference on the real kubelet and the fake's
documented behaviour). `test_every_difference_names_a_test_that_exists` keeps the tables honest.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc import aio

from testkit.inventories import dra_job_pod
from testkit.kubelet_driver import FakeDriver
from testkit.kubelet_observations import call
from testkit.pods_api_events import PodEvent, verdict, watched
from testkit.real_dra import add_dra_driver, claim_job, job_pod
from testkit.real_driver import RealDriver
from testkit.real_node import RealNode
from testkit.waiting import wait_until
from watcher.errors import KubeletInitializingError
from watcher.kubelet.decoding import Decoder, Outcome
from watcher.kubeletapi.k8s import core_v1_pb2
from watcher.kubeletapi.v1 import api_pb2
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.model.build import build_pod
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeClaimDevice, dra_backed_gpu_pod
from watcher.sim.fake_plugins import Warmup
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.decoding import pod_meta

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU, NIC = "example.com/gpu", "example.com/nic"
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}
NICS = {"nic0": (0,), "nic1": (1,)}
PARITY = "test_e2e_kubelet_parity.py"


@dataclasses.dataclass(frozen=True)
class Kept:
    upstream: str  # what the upstream kubelet does
    fake: str  # what the fake does instead
    why: str  # why the fake stays so
    test: str  # the test showing it: a name in this module, or "<file>::<name>"


KEPT_DIFFERENCES = {
    "extended-resource claim status": Kept(
        "its Pods API never carries status.extendedResourceClaimStatus (the scheduler writes it in "
        "the API server; the Pods API serves the status manager's own status, which the kubelet "
        "does not own that field in) nor any health for such a claim; pod-resources names the "
        "claim under the container's dynamic_resources",
        "serves extendedResourceClaimStatus for a DRA-backed extended resource (dra_backed_gpu_pod)",
        "the agent's Pods API decoder reads it (PodMeta.extended_claim) and tests of the fake "
        "(test_fake_pods_api, test_pods_api_decoding) pin it; dropping it is their owners' change",
        "test_kept_a_dra_backed_extended_resources_claim_is_named_by_the_api_server_not_the_pods_api",
    ),
    "pods after a restart": Kept(
        "lists no pods in pod-resources for about a second after its sockets are back, until it "
        "has its pods from the API server again (its Pods API says it is initializing meanwhile)",
        "without a warm-up lists every pod at once; Warmup(pods_delay=...) hides them as upstream does",
        "most tests of the fake study something else than the warm-up; it is there on request",
        "test_kept_after_a_restart_pod_resources_lists_no_pods_until_the_kubelet_has_them_again",
    ),
    "Pods API pod content": Kept(
        "sends the whole pod (annotations, images, conditions, IPs, ...), its resources and device "
        "verdicts in Go map order",
        "sends the fields the agent reads, sorted, so a pod's bytes change only when it does",
        "what the agent decodes (PodMeta) is the same; the fake's MODIFIED events mean a change",
        "test_kept_the_pods_api_pod_is_fuller_upstream_and_decodes_alike",
    ),
    "an unhealthy device unplugged": Kept(
        "keeps saying Unhealthy in the holder's status: a device leaving ListAndWatch makes no pod "
        "sync (only a health change of a listed device does); the pod's next sync for another "
        "reason says Healthy (a device it no longer lists counts as healthy)",
        "says Healthy at once (it computes verdicts from the devices now listed)",
        "the fake has no pod sync loop to delay it to; both end at Healthy",
        "test_kept_an_unhealthy_device_unplugged_stays_unhealthy_in_the_pods_api_upstream",
    ),
    "a health change's latency": Kept(
        "sends the holder's MODIFIED up to a second after the plugin's word (its pod worker waits "
        "for the PLEG's next relist, once a second)",
        "sends it at once",
        "the agent takes no timing from it; its own hold-downs are tested on the fake",
        "test_answer_a_plugins_health_change_reaches_the_pods_api_as_a_pod_update",
    ),
    "a new pod's first status": Kept(
        "sends a new pod first as Pending, as the API server has it (no container statuses, so no "
        "device verdicts), then each status the kubelet makes while it starts the containers",
        "sends a new pod as Running with its containers' statuses and verdicts at once",
        "the fake has no pod workers; the agent reads a new pod with Get whatever its phase, and a "
        "pod's first verdicts are no health change (sources/pods_api/reads.py)",
        "test_kept_a_new_pod_comes_pending_first_upstream_and_running_from_the_fake",
    ),
    "a claim's two names": Kept(
        "names a template-made claim <pod>-<claim>-<random> while the pod's claim entry, and so its "
        "verdict (claim:<entry>[/<request>]), keeps the entry's name; the Pods API's pod has no "
        "resourceClaimStatuses to tie the two",
        "uses one name for the entry, the verdict and the ResourceClaim",
        "the agent ties a verdict to its claim by the device's id, which both answer alike; fast "
        "tests name the claim as they built it",
        "test_kept_a_claim_entry_and_its_claim_object_have_two_names_upstream_and_one_in_the_fake",
    ),
    "free() rewrites the checkpoint": Kept(
        "frees a removed pod's devices in memory and writes no checkpoint",
        "rewrites device-plugins/kubelet_internal_checkpoint",
        "tests and the demo rely on the trigger",
        f"{PARITY}::test_one_scenario_shows_the_same_answers_events_and_files_on_both_kubelets",
    ),
    "no registration socket": Kept(
        "serves device-plugins/kubelet.sock, replaced on every start; plugin sockets are sockets",
        "serves none; its plugin sockets are plain files",
        "the fake's plugins are in-process, not gRPC servers",
        f"{PARITY}::test_one_scenario_shows_the_same_answers_events_and_files_on_both_kubelets",
    ),
    "sockets deleted by name": Kept(
        "deletes the sockets in device-plugins/ on start, by type",
        "also deletes plain files named *.sock (its own plugin sockets are plain files)",
        "as above",
        f"{PARITY}::test_a_kubelet_start_deletes_the_sockets_in_the_plugin_directory",
    ),
}
FIXED = {
    "dra_manager_state": (
        "upstream's DRA manager rewrites it whenever a pod starts and ends, claims or not; the fake "
        "never wrote it (watcher/sim/fake_kubelet.py, fake_state_files.py)",
        f"{PARITY}::test_one_scenario_shows_the_same_answers_events_and_files_on_both_kubelets",
    ),
    "generation": (
        "upstream's Pods API pods have metadata.generation 1; the fake's had none (fake_pod_objects.py)",
        "test_kept_the_pods_api_pod_is_fuller_upstream_and_decodes_alike",
    ),
}


def test_every_difference_names_a_test_that_exists() -> None:
    named = [k.test for k in KEPT_DIFFERENCES.values()] + [test for _, test in FIXED.values()]
    for test in named:
        file, _, name = test.rpartition("::")
        tree = ast.parse(Path(__file__).with_name(file or Path(__file__).name).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
        assert name in defined, test


@asynccontextmanager
async def _fake(short_tmp: Path, warmup: Warmup | None = None) -> AsyncIterator[FakeDriver]:
    """The fake with GPUS (no CPUs, as the upstream kubelet reports none) and its Pods API."""
    node = FakeDriver.node(GPU, GPUS, 0)
    async with FakeKubelet(short_tmp / "fake" / "kubelet", node, warmup=warmup) as fake:
        await fake.plugins.wait_settled()  # a warm-up plays on the first start too
        yield FakeDriver(fake, GPU)


async def _patient(socket: Path, method: str, request: bytes = b"") -> bytes:
    """One pod-resources call; a rejection by the kubelet's limiter (100 a second) is retried."""
    while True:
        try:
            return await call(socket, method, request)
        except aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        await asyncio.sleep(0.02)  # a token comes back within 10 ms


async def _listed(socket: Path) -> set[str]:
    answer = api_pb2.ListPodResourcesResponse.FromString(await _patient(socket, "List"))
    return {p.name for p in answer.pod_resources}


async def _pods_api_pod(socket: Path, uid: str) -> core_v1_pb2.Pod:
    async with PodsApiClient(str(socket), timeout=5) as api:
        return core_v1_pb2.Pod.FromString(await api.get_pod(uid))


@pytest.mark.timeout(120)
async def test_kept_a_dra_backed_extended_resources_claim_is_named_by_the_api_server_not_the_pods_api(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    tag = f"x{uuid.uuid4().hex[:6]}"
    dra = await add_dra_driver(node, tag)
    resource = f"example.com/{tag}"
    selector = {"cel": {"expression": f'device.driver == "{dra.name}"'}}
    await node.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{tag}-ext"},
            "spec": {"selectors": [selector], "extendedResourceName": resource},
        }
    )
    namespace = await node.namespace(f"ext-{uuid.uuid4().hex[:6]}")
    await node.apply(node.pod(namespace, "notebook", {resource: 1}, bound=False))  # the scheduler's
    pod = await node.wait_pod(namespace, "notebook", timeout=60)
    extended = pod["status"]["extendedResourceClaimStatus"]  # the scheduler wrote it there
    claim = extended["resourceClaimName"]
    assert [(m["containerName"], m["resourceName"]) for m in extended["requestMappings"]] == [
        ("main", resource)
    ]
    served = await _pods_api_pod(node.pods_api_socket, pod["metadata"]["uid"])
    assert not served.status.HasField("extendedResourceClaimStatus")
    assert [list(c.allocatedResourcesStatus) for c in served.status.containerStatuses] == [[]]
    get = api_pb2.GetPodResourcesRequest(pod_namespace=namespace, pod_name="notebook")
    answer = api_pb2.GetPodResourcesResponse.FromString(
        await _patient(node.socket_path, "Get", get.SerializeToString())
    )
    (main,) = answer.pod_resources.containers
    assert [d.claim_name for d in main.dynamic_resources] == [claim]

    async with _fake(short_tmp) as fake:
        device = FakeClaimDevice("gpu.example.com", "pool", "gpu-0", ["gpu.example.com/gpu=gpu-0"])
        fake.fake.add_pod(dra_backed_gpu_pod("ml", "notebook", [device], resource=resource))
        served = await _pods_api_pod(fake.pods_api_socket, await fake.uid("ml", "notebook"))
        assert served.status.extendedResourceClaimStatus.requestMappings[0].resourceName == resource
        assert [list(c.allocatedResourcesStatus) for c in served.status.containerStatuses] == [[]]


async def test_kept_after_a_restart_pod_resources_lists_no_pods_until_the_kubelet_has_them_again(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Upstream: the first List once its sockets are back has no pods, its Pods API says it is
    initializing, and the pod is back about 0.9 s later (measured). The fake: at once without a
    warm-up; hidden until `pods_delay` with one."""
    driver = await RealDriver.create(real_node, GPU, GPUS)
    await driver.admit("ml", "kept", {"main": {GPU: 1}})
    await real_node.stop()
    await real_node.start()  # returns once its sockets accept
    began = time.monotonic()
    first = await _listed(driver.socket_path)
    async with PodsApiClient(str(driver.pods_api_socket), timeout=5) as api:
        try:
            initializing = not await api.list_pods()
        except KubeletInitializingError:
            initializing = True
    while (listed := await _listed(driver.socket_path)) != {"kept"}:
        assert time.monotonic() - began < 30, listed
        await asyncio.sleep(0.05)  # the kubelet announces nothing when it has its pods again
    gap = time.monotonic() - began
    assert (first, initializing) == (set(), True), f"the pods came back {gap:.2f} s after its sockets"

    warmups: list[tuple[Warmup | None, set[str]]] = [
        (None, {"kept"}),
        (Warmup(plugin_delay=(0, 0), pods_delay=(0.5, 1.0)), set()),
    ]
    for n, (warmup, expected) in enumerate(warmups):
        async with _fake(short_tmp / f"w{n}", warmup) as fake:
            await fake.admit("ml", "kept", {"main": {GPU: 1}})
            await fake.fake.restart()
            assert await _listed(fake.socket_path) == expected
            await fake.fake.plugins.wait_settled()
            assert await _listed(fake.socket_path) == {"kept"}


async def test_kept_the_pods_api_pod_is_fuller_upstream_and_decodes_alike(
    real_node: RealNode, short_tmp: Path
) -> None:
    """The agent's PodMeta of one pod (two containers holding GPUs) is the same from both Pods
    APIs but for the uid; its generation is 1 on both (the fake's was 0)."""
    driver = await RealDriver.create(real_node, GPU, GPUS)
    containers = {"main": {GPU: 2}, "side": {GPU: 1}}
    await driver.admit("ml", "pair", containers)
    real = await _pods_api_pod(driver.pods_api_socket, await driver.uid("ml", "pair"))
    async with _fake(short_tmp) as fake:
        await fake.admit("ml", "pair", containers)
        mine = await _pods_api_pod(fake.pods_api_socket, await fake.uid("ml", "pair"))
    decoded = [dataclasses.replace(pod_meta(p.SerializeToString(), labels=()), uid="") for p in (real, mine)]
    assert decoded[0] == decoded[1] and decoded[0].generation == 1
    assert len(decoded[0].verdicts) == 3
    assert real.metadata.annotations["kubernetes.io/config.source"] == "api"
    assert real.spec.containers[0].image and not mine.spec.containers[0].image
    assert dict(mine.metadata.annotations) == {}


async def test_kept_an_unhealthy_device_unplugged_stays_unhealthy_in_the_pods_api_upstream(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Upstream: a held GPU's plugin says Unhealthy, then unplugs it; the Pods API still says
    Unhealthy 3 s later (no pod sync comes of an unplug). The fake: Healthy at once."""
    driver = await RealDriver.create(real_node, GPU, GPUS)
    ((device,),) = (await driver.admit("ml", "holder", {"main": {GPU: 1}}))["main"].values()
    uid = await driver.uid("ml", "holder")
    async with watched(driver.pods_api_socket) as seen:
        await driver.set_healthy(device, False)
        await seen.until(0, lambda e: verdict(e.meta, "main", device) == "Unhealthy")
        # A second sync of the pod may be queued behind the one that said so (each waits for
        # the PLEG's next relist, once a second): let it run while the device is still listed,
        # or it says Healthy for the unplugged device a second after the unplug. Nothing to await.
        await asyncio.sleep(2.5)
        mark = len(seen.events)
        await driver.unplug(device)
        # An absence cannot be awaited: a pod sync's MODIFIED comes within a second or so.
        await asyncio.sleep(3.0)
        said = [verdict(e.meta, "main", device) for e in seen.events[mark:]]
        assert set(said) <= {"Unhealthy"}, said
    served = await _pods_api_pod(driver.pods_api_socket, uid)
    assert verdict(pod_meta(served.SerializeToString(), labels=()), "main", device) == "Unhealthy"

    async with _fake(short_tmp) as fake:
        await fake.admit("ml", "holder", {"main": {GPU: 1}})
        await fake.set_healthy(device, False)
        await fake.unplug(device)
        served = await _pods_api_pod(fake.pods_api_socket, await fake.uid("ml", "holder"))
        assert verdict(pod_meta(served.SerializeToString(), labels=()), "main", device) == "Healthy"


@pytest.mark.timeout(90)
async def test_answer_pod_resources_bytes_of_one_pod_change_from_call_to_call(real_node: RealNode) -> None:
    """Are a pod's bytes in pod-resources `List` and `Get` the same from call to call? No.

    The kubelet builds each container's device entries from Go maps (resource -> device id ->
    NUMA nodes), one entry per device per NUMA node, so their order changes from call to call.
    With two resources held by each of two containers, 50 calls of each gave 6 to 8 distinct
    encodings of the one pod in `List` and 5 to 7 in `Get` (7 or 8 among all 100; in
    `GetAllocatableResources` 12 to 14 of 50), in four runs. Nothing else changes: the containers
    come in spec order, every answer decodes to the same pod, and the agent's decoder gives the
    same inventory every time (reordered or the same bytes, never a change). Its fast path (a
    pod's bytes equal to a remembered pod's) hits only when an order repeats, which a small pod's
    few orders make frequent and a large pod's many orders rare."""
    driver = await RealDriver.create(real_node, GPU, GPUS)
    await real_node.add_plugin(NIC, NICS)
    await driver.admit("ml", "pair", {"main": {GPU: 2, NIC: 1}, "side": {GPU: 1, NIC: 1}})
    socket = driver.socket_path
    get = api_pb2.GetPodResourcesRequest(pod_namespace="ml", pod_name="pair").SerializeToString()
    alloc = await _patient(socket, "GetAllocatableResources")
    lists, gets = [], []
    for _ in range(50):
        lists.append(await _patient(socket, "List"))
        gets.append(await _patient(socket, "Get", get))
    pods = [api_pb2.ListPodResourcesResponse.FromString(raw).pod_resources[0] for raw in lists]
    pods += [api_pb2.GetPodResourcesResponse.FromString(raw).pod_resources for raw in gets]
    encodings = {p.SerializeToString() for p in pods}
    assert len({*lists}) > 1 and len({*gets}) > 1, "the same bytes every time"
    assert all([c.name for c in p.containers] == ["main", "side"] for p in pods)
    assert all(len(d.device_ids) == 1 for p in pods for c in p.containers for d in c.devices)
    built = {build_pod("ml", "pair", [p]) for p in pods}
    assert len(built) == 1, built

    decoder = Decoder()
    first, _ = decoder.decode(alloc, lists[0])
    outcomes = [decoder.decode(alloc, raw) for raw in lists[1:]]
    assert all(inventory == first for inventory, _ in outcomes)
    assert Outcome.CHANGED not in {outcome for _, outcome in outcomes}
    print(f"{len({*lists})} List, {len({*gets})} Get encodings, {len(encodings)} of the pod in 100")


def _modified_to(device: str, health: str) -> Callable[[PodEvent], bool]:
    return lambda e: e.kind == pods_pb2.MODIFIED and verdict(e.meta, "main", device) == health


@pytest.mark.timeout(120)
async def test_answer_a_plugins_health_change_reaches_the_pods_api_as_a_pod_update(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Does a device plugin's health change reach the Pods API as a pod status update? Yes.

    The device manager tells the kubelet's sync loop which pods hold a device whose health
    changed; the kubelet syncs them, and the new status (allocatedResourcesStatus with the device
    Unhealthy, or Healthy again) goes out as a MODIFIED event on WatchPods: the Pods API path sees
    it, not only the state-file path. How long it took, from the plugin's word to the event, three
    flips each way in four runs: the first 0.009 to 0.715 s, every later one 0.84 to 1.006 s. The
    pod worker waits for a runtime cache newer than the sync's start, which the PLEG's relist
    brings once a second: up to a second, then. The fake sends it within 10 ms (kept)."""
    driver = await RealDriver.create(real_node, GPU, GPUS)
    ((device,),) = (await driver.admit("ml", "trainer", {"main": {GPU: 1}}))["main"].values()
    took: dict[str, list[float]] = {"Unhealthy": [], "Healthy": []}
    async with watched(driver.pods_api_socket) as seen:
        for _ in range(3):
            for health in ("Unhealthy", "Healthy"):
                mark, began = len(seen.events), time.monotonic()
                await driver.plugin.set_healthy(device, health == "Healthy")
                came = await seen.until(mark, _modified_to(device, health))
                took[health].append(came.at - began)
    figures = {h: [round(t, 3) for t in ts] for h, ts in took.items()}
    print(f"upstream: the MODIFIED came after {figures} s")
    assert max(took["Unhealthy"] + took["Healthy"]) < 10.0, figures

    async with _fake(short_tmp) as fake:
        await fake.admit("ml", "trainer", {"main": {GPU: 1}})
        async with watched(fake.pods_api_socket) as seen:
            began = time.monotonic()
            await fake.set_healthy(device, False)
            came = await seen.until(0, lambda e: verdict(e.meta, "main", device) == "Unhealthy")
        assert came.kind == pods_pb2.MODIFIED
        print(f"the fake: after {came.at - began:.3f} s")


async def test_kept_a_new_pod_comes_pending_first_upstream_and_running_from_the_fake(
    real_node: RealNode, short_tmp: Path
) -> None:
    driver = await RealDriver.create(real_node, GPU, GPUS)

    async def serving() -> bool:  # its Pods API says "initializing" until it has its pods
        async with PodsApiClient(str(driver.pods_api_socket), timeout=5) as api:
            try:
                await api.list_pods()
            except KubeletInitializingError:
                return False
        return True

    await wait_until(serving, 30, interval=0.1, what="the Pods API serving")
    async with watched(driver.pods_api_socket) as api:
        mark = len(api.events)
        await driver.admit("ml", "fresh", {"main": {GPU: 1}})

        def about(e: PodEvent) -> bool:
            return e.meta is not None and e.meta.name == "fresh"

        first = await api.until(mark, lambda e: about(e) and e.kind == pods_pb2.ADDED)
        assert first.meta is not None and first.meta.phase == "Pending"
        running = await api.until(
            mark, lambda e: about(e) and e.meta is not None and e.meta.phase == "Running"
        )
        assert running.meta is not None and running.meta.verdicts
    async with _fake(short_tmp) as fake, watched(fake.pods_api_socket) as api:
        mark = len(api.events)
        await fake.admit("ml", "fresh", {"main": {GPU: 1}})
        first = await api.until(mark, lambda e: e.meta is not None and e.meta.name == "fresh")
        assert first.kind == pods_pb2.ADDED and first.meta is not None
        assert first.meta.phase == "Running" and first.meta.verdicts


async def test_kept_a_claim_entry_and_its_claim_object_have_two_names_upstream_and_one_in_the_fake(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    dra = await add_dra_driver(node, f"n{uuid.uuid4().hex[:6]}")
    namespace = await node.namespace(f"names-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "named")
    pod = await job_pod(node, namespace, "named")
    name = pod["metadata"]["name"]
    served = pod_meta(
        (await _pods_api_pod(node.pods_api_socket, pod["metadata"]["uid"])).SerializeToString(), labels=()
    )
    assert served.claims == ()  # no resourceClaimStatuses on the Pods API
    assert {v.resource for v in served.verdicts} == {"claim:gpu"}
    get = api_pb2.GetPodResourcesRequest(pod_namespace=namespace, pod_name=name)
    answer = api_pb2.GetPodResourcesResponse.FromString(
        await _patient(node.socket_path, "Get", get.SerializeToString())
    )
    (main,) = answer.pod_resources.containers
    (claim,) = [d.claim_name for d in main.dynamic_resources]
    assert claim.startswith(f"{name}-gpu-") and claim != "gpu"

    async with _fake(short_tmp) as fake:
        fake.fake.add_pod(dra_job_pod("pool", "gpu-0", name="named-0", claim="named-0-gpu"))
        mine = pod_meta(
            (await _pods_api_pod(fake.pods_api_socket, await fake.uid("ml", "named-0"))).SerializeToString(),
            labels=(),
        )
        assert {v.resource for v in mine.verdicts} == {"claim:named-0-gpu/gpu"}
