"""One raw Pod -> PodMeta: the controller as owner, only the allowlisted labels (printable, capped),
every container's device verdicts in one canonical order and within bounds, the claims, and errors
for what is not a pod. A 10,000-pod snapshot leaves only the small records behind."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from watcher import errors
from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.model.devicehealth.pods import DeviceVerdict, ExtendedRequest, Owner, PodMeta
from watcher.sim.fake_node import FakeClaimDevice, FakeNode, dra_backed_gpu_pod
from watcher.sim.fake_pod_objects import pod_object
from watcher.sources.pods_api.decoding import MESSAGE_MAX, VERDICTS_MAX, pod_meta, pod_uid

GPU = "nvidia.com/gpu"


def _pod(uid: str = "u-1", **labels: str) -> core_v1_pb2.Pod:
    pod = core_v1_pb2.Pod(
        metadata=meta_v1_pb2.ObjectMeta(name="web-0", namespace="shop", uid=uid, generation=3)
    )
    for key, value in labels.items():
        pod.metadata.labels[key] = value
    pod.status.phase = "Running"
    return pod


def _status(pod: core_v1_pb2.Pod, container: str, name: str, *healths: tuple[str, str, str]) -> None:
    c = next((c for c in pod.status.containerStatuses if c.name == container), None)
    if c is None:
        c = pod.status.containerStatuses.add(name=container)
    status = c.allocatedResourcesStatus.add(name=name)
    for resource_id, health, message in healths:
        entry = status.resources.add(resourceID=resource_id, health=health)
        if message:
            entry.message = message


def test_the_owner_is_the_controller_and_only_the_controller() -> None:
    pod = _pod()
    pod.metadata.ownerReferences.add(kind="ConfigMap", name="gc-link", uid="c-1")
    pod.metadata.ownerReferences.add(kind="ReplicaSet", name="web-7f9c", uid="r-1", controller=True)
    meta = pod_meta(pod.SerializeToString(), labels=())
    assert meta.owner == Owner("ReplicaSet", "web-7f9c", "r-1")
    del pod.metadata.ownerReferences[1]
    assert pod_meta(pod.SerializeToString(), labels=()).owner is None
    assert (meta.uid, meta.key, meta.phase, meta.generation) == ("u-1", "shop/web-0", "Running", 3)


def test_only_allowlisted_labels_are_kept_printable_and_cut_to_63() -> None:
    raw = _pod(team="a\x1b[2J\nb", app="x" * 100, secret="s3cr3t").SerializeToString()
    meta = pod_meta(raw, labels=("team", "app", "absent"))
    labels = dict(meta.labels)
    assert set(labels) == {"team", "app"}
    assert labels["team"] == "a\\x1b[2J\\x0ab" and labels["team"].isprintable()
    assert labels["app"] == "x" * 63
    assert meta.labels == tuple(sorted(meta.labels))


def test_every_containers_verdicts_in_one_order_whatever_order_the_kubelet_used() -> None:
    one, two = _pod(), _pod()
    _status(one, "a", GPU, ("GPU-1", "Healthy", ""), ("GPU-2", "Unhealthy", ""))
    _status(one, "b", "claim:gpus/big", ("gpu.example.com/gpu=gpu-8", "Unknown", "driver stopped"))
    # The same verdicts in another (Go map) order, and an init container, which has none to give.
    _status(two, "b", "claim:gpus/big", ("gpu.example.com/gpu=gpu-8", "Unknown", "driver stopped"))
    _status(two, "a", GPU, ("GPU-2", "Unhealthy", ""), ("GPU-1", "Healthy", ""))
    two.status.initContainerStatuses.add(name="init")
    meta = pod_meta(one.SerializeToString(), labels=())
    assert meta == pod_meta(two.SerializeToString(), labels=())
    assert meta.verdicts == (
        DeviceVerdict("a", GPU, "GPU-1", "Healthy", ""),
        DeviceVerdict("a", GPU, "GPU-2", "Unhealthy", ""),
        DeviceVerdict("b", "claim:gpus/big", "gpu.example.com/gpu=gpu-8", "Unknown", "driver stopped"),
    )
    assert meta.verdicts[2].claim == ("gpus", "big")


def test_a_message_is_cut_to_1_kib_and_verdicts_past_256_are_counted_unhealthy_ones_kept() -> None:
    pod = _pod()
    _status(pod, "c", "claim:gpus", *[(f"d/p/gpu-{i:03}", "Healthy", "") for i in range(300)])
    _status(pod, "c", GPU, ("GPU-bad", "Unhealthy", "m" * 5000))
    meta = pod_meta(pod.SerializeToString(), labels=())
    assert len(meta.verdicts) == VERDICTS_MAX and meta.dropped_verdicts == 301 - VERDICTS_MAX
    (bad,) = [v for v in meta.verdicts if v.health == "Unhealthy"]
    assert len(bad.message) == MESSAGE_MAX and bad.message.endswith("…") and bad.message.startswith("mmm")


def test_claims_and_a_dra_backed_extended_resource_come_from_the_status() -> None:
    node = FakeNode()
    fake = dra_backed_gpu_pod(
        "ml", "notebook-0", [FakeClaimDevice("gpu.nvidia.com", "node-a", "gpu-9")], container="lab"
    )
    pod = pod_object(node, fake, "node-a")
    pod.status.resourceClaimStatuses.add(name="scratch", resourceClaimName="notebook-0-scratch-x7k2")
    meta = pod_meta(pod.SerializeToString(), labels=())
    assert meta.claims == (("scratch", "notebook-0-scratch-x7k2"),)
    assert meta.claim_object("scratch") == "notebook-0-scratch-x7k2" and meta.claim_object("other") is None
    claim = pod.status.extendedResourceClaimStatus.resourceClaimName
    assert meta.extended_claim == claim and claim.startswith("notebook-0-extended-resources-")
    assert meta.extended == (ExtendedRequest("lab", GPU, "container-0-request-0"),)
    assert meta.verdicts == ()  # upstream gives such devices no health
    assert pod_meta(_pod().SerializeToString(), labels=()).extended_claim is None


def test_text_that_is_not_utf8_comes_back_escaped() -> None:
    pod = _pod(team="ok")
    _status(pod, "c", GPU, ("GPU-zz", "Unhealthy", "bad zz"))
    raw = pod.SerializeToString().replace(b"GPU-zz", b"GPU-\xff\xfe").replace(b"bad zz", b"bad \xc3(")
    (verdict,) = pod_meta(raw, labels=()).verdicts
    assert (verdict.resource_id, verdict.message) == ("GPU-\\xff\\xfe", "bad \\xc3(")


@pytest.mark.parametrize("raw", [b"\xff\xff\xff not a pod", b"\x0a\x05\x0a\x01"])
def test_a_malformed_pod_is_one_pod_decode_error(raw: bytes) -> None:
    with pytest.raises(errors.PodDecodeError, match="not a Pod message") as caught:
        pod_meta(raw, labels=())
    assert isinstance(caught.value, errors.WatcherError) and not isinstance(caught.value, errors.KubeletError)
    assert caught.value.uid is None


def test_a_pod_without_uid_is_refused_and_a_deleted_body_gives_its_uid() -> None:
    with pytest.raises(errors.PodDecodeError, match="no uid"):
        pod_meta(core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name="x")).SerializeToString(), labels=())
    deleted = core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name="x", namespace="y", uid="u-9"))
    assert pod_uid(deleted.SerializeToString()) == "u-9"


def _big_raw(i: int) -> bytes:
    pod = _pod(uid=f"uid-{i:05}", team="research")
    pod.metadata.annotations["blob"] = "a" * 4096  # the bulk the agent must not keep
    _status(pod, "main", GPU, (f"GPU-{i}", "Healthy", ""))
    return pod.SerializeToString()


def _reachable(meta: PodMeta) -> set[type]:
    types, todo, seen = set(), [meta], set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        types.add(type(obj))
        if isinstance(obj, PodMeta | Owner | DeviceVerdict | ExtendedRequest | tuple):
            todo.extend(gc.get_referents(obj))
    return types


@pytest.mark.slow  # 10000 pods decoded: seconds
def test_a_10000_pod_snapshot_leaves_only_small_records_behind() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        metas = [pod_meta(_big_raw(i), labels=("team",)) for i in range(10_000)]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # 4 KiB of annotation per pod went by; what stays is the records (well under 1 KiB each).
    assert held < 10_000 * 1024, held
    allowed = {PodMeta, Owner, DeviceVerdict, ExtendedRequest, tuple, str, int, type(None), type}
    assert _reachable(metas[0]) <= allowed and _reachable(metas[-1]) <= allowed
    assert len({m.uid for m in metas}) == 10_000
