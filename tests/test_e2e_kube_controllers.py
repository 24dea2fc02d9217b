"""kube-controllers against kube-testcluster: upstream's kube-scheduler, resourceclaim controller
and Job controller do what a node test relies on a cluster for.

Each test gets its own Node (made schedulable as peers/README.md's kube-controllers section says),
namespace, DRA driver name, DeviceClass and ResourceSlice with two devices, so the session's shared
cluster and the other tests' Nodes cannot change where a pod goes. Everything is read back with
the real kubectl, polled with a deadline (the three run in another process).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from testkit.kube_controllers import KubeControllers
from testkit.kube_testcluster import KubeTestCluster
from testkit.waiting import wait_until

pytestmark = pytest.mark.e2e

T = TypeVar("T")
IMAGE = "pod-resources-watcher:test"  # never pulled: no kubelet runs
TEMPLATE = "gpu"  # the ResourceClaimTemplate in each test's namespace, and the pod's claim name
NOT_READY_TAINT = "node.kubernetes.io/not-ready:NoSchedule"
DEADLINE_S = 30.0


@dataclass(frozen=True)
class Site:
    """One test's Node with its two DRA devices, and its namespace."""

    node: str
    namespace: str
    driver: str
    device_class: str
    devices: tuple[str, ...]


@pytest.fixture
def controllers(kube_controllers: KubeControllers) -> KubeControllers:
    """The session's kube-controllers (tests/conftest.py): one scheduler per cluster."""
    return kube_controllers


@pytest.fixture
def site(kube_cluster: KubeTestCluster, controllers: KubeControllers) -> Iterator[Site]:
    suffix = secrets.token_hex(3)
    node, namespace = f"kc-node-{suffix}", f"kc-{suffix}"
    driver, device_class = f"gpu-{suffix}.test.example.com", f"gpu-{suffix}"
    devices = ("gpu-0", "gpu-1")
    kube_cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        # The ServiceAccount admission plugin refuses a pod whose service account does not
        # exist, and no controller-manager creates `default`.
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{device_class}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": device} for device in devices],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
                }
            },
        },
    )
    # The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
    # lifecycle controller that would lift it once the kubelet reports Ready does not run here.
    kube_cluster.kubectl("taint", "node", node, f"{NOT_READY_TAINT}-")
    kube_cluster.kubectl(
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": _node_status()}),
    )
    assert kube_cluster.get("node", node)["spec"].get("taints") is None, "the Node must have no taint left"
    try:
        yield Site(node, namespace, driver, device_class, devices)
    finally:
        # Cluster-scoped: gone, so no later test's scheduler sees a schedulable Node of ours.
        kube_cluster.kubectl(
            "delete",
            f"node/{node}",
            f"resourceslice/{node}-{device_class}",
            f"deviceclass/{device_class}",
            "--wait=false",
        )


def _node_status() -> dict[str, Any]:
    """What a kubelet reports and the scheduler filters on: room for pods, CPU and memory."""
    room = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    at = "2025-01-01T00:00:00Z"
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }
    return {"capacity": room, "allocatable": room, "conditions": [ready]}


def _claim_pod(site: Site, name: str) -> dict[str, Any]:
    """A pod whose claim comes from the namespace's ResourceClaimTemplate, and no spec.nodeName."""
    container = {"name": "main", "image": IMAGE, "resources": {"claims": [{"name": TEMPLATE}]}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": site.namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE}],
            "containers": [container],
        },
    }


async def _until(
    controllers: KubeControllers, what: str, fetch: Callable[[], T | None], timeout: float = DEADLINE_S
) -> T:
    """Until `fetch()` (kubectl, in a thread) gives something; the failure shows the last thing
    seen and the peer's log."""
    seen: dict[str, Any] = {}

    async def arrived() -> bool:
        seen["value"] = await asyncio.to_thread(fetch)
        return seen["value"] is not None

    try:
        await wait_until(arrived, timeout=timeout, interval=0.2, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}\nkube-controllers' log ends:\n{controllers.log_tail()}") from None
    return seen["value"]  # type: ignore[no-any-return]


def _scheduled(cluster: KubeTestCluster, namespace: str, pod: str) -> Callable[[], dict[str, Any] | None]:
    def fetch() -> dict[str, Any] | None:
        seen: dict[str, Any] = cluster.get("pod", pod, "-n", namespace)
        return seen if seen["spec"].get("nodeName") else None

    return fetch


def _claim_of(cluster: KubeTestCluster, pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("resourceClaimStatuses", [])
    assert [s["name"] for s in statuses] == [TEMPLATE], f"the pod's claim statuses: {statuses}"
    claim: dict[str, Any] = cluster.get(
        "resourceclaim", statuses[0]["resourceClaimName"], "-n", pod["metadata"]["namespace"]
    )
    return claim


async def test_template_claim_is_created_allocated_and_the_pod_bound(
    kube_cluster: KubeTestCluster, controllers: KubeControllers, site: Site
) -> None:
    kube_cluster.apply(_claim_pod(site, "trainer"))
    pod = await _until(
        controllers, "trainer bound to a node", _scheduled(kube_cluster, site.namespace, "trainer")
    )

    assert pod["spec"]["nodeName"] == site.node
    claim = _claim_of(kube_cluster, pod)
    # Made by the resourceclaim controller from the template, for this pod.
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": pod["metadata"]["uid"]}
    assert claim["metadata"]["ownerReferences"] == [{**owner, "controller": True}]
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == TEMPLATE
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == site.device_class
    # Allocated by the scheduler's DynamicResources plugin before it bound the pod.
    allocation = claim["status"]["allocation"]
    [result] = allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (site.driver, site.node, "gpu")
    assert result["device"] in site.devices
    [term] = allocation["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [site.node]}]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "trainer", "uid": pod["metadata"]["uid"]}
    ]


async def test_two_devices_go_to_two_pods_and_a_third_waits(
    kube_cluster: KubeTestCluster, controllers: KubeControllers, site: Site
) -> None:
    """The allocation is real: each device goes to one claim only, and a claim with no device
    left keeps its pod from being scheduled."""
    kube_cluster.apply(_claim_pod(site, "first"), _claim_pod(site, "second"))
    held = []
    for name in ("first", "second"):
        pod = await _until(controllers, f"{name} bound", _scheduled(kube_cluster, site.namespace, name))
        [result] = _claim_of(kube_cluster, pod)["status"]["allocation"]["devices"]["results"]
        held.append(result["device"])
    assert sorted(held) == list(site.devices)

    kube_cluster.apply(_claim_pod(site, "third"))

    def refused() -> dict[str, Any] | None:
        pod: dict[str, Any] = kube_cluster.get("pod", "third", "-n", site.namespace)
        scheduled = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return scheduled[0] if scheduled and scheduled[0]["status"] == "False" else None

    condition = await _until(controllers, "third found unschedulable", refused)
    assert condition["reason"] == "Unschedulable", condition
    pod = kube_cluster.get("pod", "third", "-n", site.namespace)
    assert "nodeName" not in pod["spec"]
    claim = _claim_of(kube_cluster, pod)  # created, but nothing could be allocated to it
    assert "allocation" not in claim.get("status", {}), claim["status"]


async def test_job_pod_is_owned_by_the_job_and_scheduled(
    kube_cluster: KubeTestCluster, controllers: KubeControllers, site: Site
) -> None:
    spec = {
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        # Only so that the other tests' Nodes, schedulable too while their test runs, cannot
        # take it: the assertion below is on this test's Node.
        "nodeSelector": {"kubernetes.io/hostname": site.node},
        "containers": [{"name": "main", "image": IMAGE}],
    }
    job_manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "batch", "namespace": site.namespace},
        "spec": {"template": {"spec": spec}},
    }
    kube_cluster.apply(job_manifest)
    job = kube_cluster.get("job", "batch", "-n", site.namespace)

    def job_pods() -> list[dict[str, Any]] | None:
        found = kube_cluster.get("pods", "-n", site.namespace, "-l", "batch.kubernetes.io/job-name=batch")
        pods: list[dict[str, Any]] = found["items"]
        return pods if pods and all(p["spec"].get("nodeName") for p in pods) else None

    [pod] = await _until(controllers, "the Job's pod, bound", job_pods)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "batch", "uid": job["metadata"]["uid"]}
    assert pod["metadata"]["ownerReferences"] == [{**owner, "controller": True, "blockOwnerDeletion": True}]
    assert pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == job["metadata"]["uid"]
    assert "batch.kubernetes.io/job-tracking" in pod["metadata"]["finalizers"]
    assert pod["spec"]["nodeName"] == site.node

    def counted() -> dict[str, Any] | None:
        status: dict[str, Any] = kube_cluster.get("job", "batch", "-n", site.namespace)["status"]
        return status if status.get("active") == 1 else None

    await _until(controllers, "the Job counting its pod active", counted)
