"""The kubernetes sink against the real API server (kube-testcluster: upstream's kube-apiserver
and etcd), read back with the real kubectl.

The shipped RBAC and ValidatingAdmissionPolicy are installed for real and enforced by the server
itself. The agent's identity is a TokenRequest token bound to a Pod whose spec.nodeName is the
test's Node, so the policy's node-name rule sees what it sees on a cluster. Each test has its own
Node, agent Pod and workload namespace (testkit.kube_reporting.place_agent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.kube_reporting import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    READY,
    Answer,
    Placement,
    api_request,
    place_agent,
    pod_manifest,
)
from testkit.kube_testcluster import KubeTestCluster
from testkit.waiting import wait_until
from watcher.settings import ResourceSlicesSettings
from watcher.sim.fake_node import FakeClaim, FakeClaimDevice, FakeContainer, FakeDevice, FakeNode, FakePod
from watcher.sinks.kubernetes import KubernetesSinkSettings
from watcher.sinks.kubernetes.condition_plan import OWNER_MARK

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent

GPU = "nvidia.com/gpu"
CONDITION = "NvidiaGpuDevicesUnavailable"
HELD, SPARE = "GPU-held", "GPU-spare"
WORKLOAD = "trainer"
POLICY = "ValidatingAdmissionPolicy 'pod-resources-watcher-node-status'"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def cluster(reporting: KubeTestCluster) -> KubeTestCluster:
    return reporting


def _workload_node(placement: Placement, uid: str = "") -> FakeNode:
    """What the fake kubelet serves: a pod holding one GPU, one GPU spare. `uid`: the API server's
    uid of that pod, as a kubelet's Pods API shows it (the kubelet runs the API server's object)."""
    node = FakeNode()
    node.cpu_ids = {0, 1}
    node.add_device(FakeDevice(GPU, HELD, (0,)))
    node.add_device(FakeDevice(GPU, SPARE, (0,)))
    containers = [FakeContainer("main", devices={GPU: [HELD]})]
    node.add_pod(FakePod(placement.namespace, WORKLOAD, containers, uid=uid))
    return node


def _agent_settings(placement: Placement, root: Path) -> Any:
    settings = make_settings(root)
    sink = KubernetesSinkSettings(name="k8s", kubeconfig=placement.kubeconfig, api_rate=50.0)
    return dataclasses.replace(settings, node=placement.node, sinks=(*settings.sinks, sink))


async def _condition(cluster: KubeTestCluster, node: str, ctype: str = CONDITION) -> dict[str, Any] | None:
    seen = await asyncio.to_thread(cluster.get, "node", node)
    found = [c for c in seen["status"].get("conditions", []) if c["type"] == ctype]
    assert len(found) <= 1, f"condition {ctype} twice: {found}"
    return found[0] if found else None


async def _until_condition(run: Running, cluster: KubeTestCluster, node: str, status: str) -> dict[str, Any]:
    """Until the agent's condition on `node` has `status`, read back with kubectl (the server is
    another process: polled, briefly)."""
    seen: dict[str, Any] = {}

    async def has_status() -> bool:
        if run.task.done():
            run.task.result()  # the agent crashed: say how, not "not true within"
        seen["last"] = await _condition(cluster, node)
        return seen["last"] is not None and seen["last"]["status"] == status

    await wait_until(has_status, timeout=20, interval=0.2, what=f"{CONDITION} {status} on {node}")
    return seen["last"]  # type: ignore[no-any-return]


def _describe(cluster: KubeTestCluster, *args: str) -> str:
    return cluster.kubectl("describe", *args).stdout


def _patch_status(
    cluster: KubeTestCluster, placement: Placement, node: str, status: dict[str, Any], **metadata: Any
) -> Answer:
    body: dict[str, Any] = {"status": status}
    if metadata:
        body["metadata"] = metadata
    return api_request(
        cluster, placement.kubeconfig, "PATCH", f"/api/v1/nodes/{node}/status", body, STRATEGIC
    )


def _ours(status: str = "False", message: str = "no device is unavailable") -> dict[str, Any]:
    return {
        "type": CONDITION,
        "status": status,
        "reason": "DevicesAvailable",
        "message": OWNER_MARK + message,
    }


def _refused_by_policy(answer: Answer, node: str, says: str) -> None:
    assert answer.status == 403, answer
    assert answer.body["reason"] == "Forbidden" and answer.body["kind"] == "Status", answer
    assert answer.message.startswith(f'nodes "{node}" is forbidden: {POLICY}'), answer.message
    assert says in answer.message, answer.message


# --- the agent end to end ---


async def test_events_and_condition_through_a_failure_and_back(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    cluster.apply(pod_manifest(placed.namespace, WORKLOAD, placed.node))
    uid = cluster.get("pod", "-n", placed.namespace, WORKLOAD)["metadata"]["uid"]
    fake = await start_kubelet(_workload_node(placed, uid))
    async with running_agent(_agent_settings(placed, short_tmp), fake) as run:
        healthy = await _until_condition(run, cluster, placed.node, "False")
        assert healthy["reason"] == "DevicesAvailable" and healthy["message"].startswith(OWNER_MARK)
        fake.make_unhealthy(GPU, HELD)
        failed = await _until_condition(run, cluster, placed.node, "True")
        assert failed["reason"] == "DevicesFailedOrMissing"
        assert HELD in failed["message"] and f"{placed.namespace}/{WORKLOAD}" in failed["message"]

        async def described(*args: str) -> str:
            return await asyncio.to_thread(_describe, cluster, *args)

        pod_text = await described("pod", "-n", placed.namespace, WORKLOAD)
        assert "DeviceFailed" in pod_text and HELD in pod_text
        assert "Warning" in pod_text and "pod-resources-watcher" in pod_text
        node_text = await described("node", placed.node)
        assert CONDITION in node_text and "DevicesFailedOrMissing" in node_text
        assert "DeviceRemoved" in node_text  # the Node's own Event, in the namespace default

        fake.heal(GPU, HELD)
        back = await _until_condition(run, cluster, placed.node, "False")
        assert back["reason"] == "DevicesAvailable"
        assert back["lastTransitionTime"] >= failed["lastTransitionTime"]
    events = cluster.get(
        "events", "-n", placed.namespace, "--field-selector", f"involvedObject.name={WORKLOAD}"
    )
    reasons = sorted(e["reason"] for e in events["items"])
    assert reasons == ["DeviceFailed", "DeviceRecovered"], reasons
    assert {e["involvedObject"]["uid"] for e in events["items"]} == {uid}
    # The kubelet's Ready is as the admin set it: the strategic merge touched only our type.
    ready = await _condition(cluster, placed.node, "Ready")
    assert ready is not None and ready["status"] == "True" and ready["reason"] == READY["reason"]


async def test_cleanup_removes_what_the_agent_owns_and_nothing_else(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    other = {
        "type": "VendorNicDevicesUnavailable",
        "status": "False",
        "reason": "Fine",
        "message": "nic operator",
    }
    cluster.kubectl(
        "patch", "node", placed.node, "--subresource=status", "--type=strategic", "-p",
        json.dumps({"status": {"conditions": [other]}}),
    )  # fmt: skip
    fake = await start_kubelet(_workload_node(placed))
    async with running_agent(_agent_settings(placed, short_tmp), fake) as run:
        await _until_condition(run, cluster, placed.node, "False")
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "watcher", "kubernetes", "cleanup", "--kubeconfig", str(placed.kubeconfig),
         "--node", placed.node],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"node {placed.node}: removed {CONDITION}"
    types = [c["type"] for c in cluster.get("node", placed.node)["status"]["conditions"]]
    assert sorted(types) == ["Ready", "VendorNicDevicesUnavailable"]


DRIVER, DRA_GPU = "gpu.nvidia.com", "gpu-3"


def _resource_slice(node: str, taints: list[dict[str, str]]) -> dict[str, Any]:
    """The DRA driver's slice of `node`'s pool (named after the node), gpu-3 with `taints`."""
    device: dict[str, Any] = {"name": DRA_GPU}
    if taints:
        device["taints"] = taints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [device, {"name": "gpu-4"}],
        },
    }


async def test_a_resource_slice_taint_and_the_pod_status_are_one_device_story(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """A NoExecute taint the driver puts on a device a DRA pod holds: one device.unhealthy from the
    slices alone; the Pod status agreeing adds nothing but its name to the sources; both gone is
    one device.healthy."""
    cluster.apply(pod_manifest(placed.namespace, WORKLOAD, placed.node))
    gpu = FakeClaimDevice(DRIVER, placed.node, DRA_GPU, [f"nvidia.com/gpu={DRA_GPU}"])
    claim = FakeClaim(placed.namespace, f"{WORKLOAD}-gpu", [gpu], request="gpu")
    node = FakeNode()
    node.cpu_ids = {0, 1}
    node.add_pod(FakePod(placed.namespace, WORKLOAD, [FakeContainer("main", claims=[claim])]))
    settings = dataclasses.replace(
        _agent_settings(placed, short_tmp), resource_slices=ResourceSlicesSettings(interval=1.0)
    )
    fake = await start_kubelet(node)
    async with running_agent(settings, fake) as run:
        reader, watch = run.agent.slice_taints, run.agent.pods_watch
        assert reader is not None and watch is not None
        await run.recorder.until(lambda: watch.state == "watching" and reader.taints == (), 20)
        await run.quiet_cycle()
        mark = len(run.recorder.events)

        def health() -> list[Any]:
            return [e for e in run.recorder.events[mark:] if e.kind.startswith("device.")]

        def sources() -> list[str]:
            (device,) = run.agent.committer.state.device_health.to_json()["devices"]
            return list(device["sources"])

        xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
        await asyncio.to_thread(cluster.apply, _resource_slice(placed.node, [xid]))
        await run.recorder.until(lambda: len(health()) >= 1, 20)
        (failed,) = health()
        assert failed.kind == "device.unhealthy" and failed.severity == "critical"
        assert failed.details["sources"] == ["resource-slice"]
        assert failed.details["taints"] == [xid] and failed.details["claim"] == f"{WORKLOAD}-gpu"
        assert "gpu.nvidia.com/xid=79 (NoExecute)" in failed.summary
        # The Pod status says so too: no second event, both sources now hold the story.
        fake.dra.set_health(DRIVER, placed.node, DRA_GPU, "Unhealthy", "critical XID 79 reported by NVML")
        await run.recorder.until(lambda: sources() == ["pod-status", "resource-slice"], 20)
        await run.quiet_cycle()
        assert len(health()) == 1
        # The taint goes first (the Pod status still says Unhealthy: nothing), then the Pod status.
        await asyncio.to_thread(cluster.apply, _resource_slice(placed.node, []))
        await run.recorder.until(
            lambda: reader.taints is not None and not any(t.fails for t in reader.taints), 20
        )
        await run.quiet_cycle()
        assert len(health()) == 1
        fake.dra.set_health(DRIVER, placed.node, DRA_GPU, "Healthy")
        await run.recorder.until(lambda: len(health()) >= 2, 20)
        await run.quiet_cycle()
        assert [e.kind for e in health()] == ["device.unhealthy", "device.healthy"]
        assert health()[1].details["sources"] == ["pod-status", "resource-slice"]
        assert not reader.stale and reader.trouble is None  # the shipped RBAC let it list


# --- the server refuses, as the shipped RBAC and policy say ---


def test_another_nodes_status_is_refused(cluster: KubeTestCluster, placed: Placement) -> None:
    elsewhere = place_agent(cluster, "elsewhere")
    answer = _patch_status(cluster, placed, elsewhere.node, {"conditions": [_ours()]})
    _refused_by_policy(
        answer,
        elsewhere.node,
        f"the pod-resources-watcher agent on node {placed.node} may update only the status of its own node, "
        f"not of {elsewhere.node}",
    )
    assert all(c["type"] != CONDITION for c in cluster.get("node", elsewhere.node)["status"]["conditions"])


def test_its_own_condition_on_its_own_node_is_allowed(cluster: KubeTestCluster, placed: Placement) -> None:
    answer = _patch_status(cluster, placed, placed.node, {"conditions": [_ours()]})
    assert answer.status == 200, answer
    assert {c["type"] for c in answer.body["status"]["conditions"]} == {"Ready", CONDITION}


def test_the_ready_condition_is_refused(cluster: KubeTestCluster, placed: Placement) -> None:
    answer = _patch_status(cluster, placed, placed.node, {"conditions": [{**READY, "status": "False"}]})
    _refused_by_policy(answer, placed.node, "this update adds, changes or removes: Ready")


def test_a_condition_it_does_not_own_is_refused(cluster: KubeTestCluster, placed: Placement) -> None:
    # Our suffix without our mark: another writer's, which the agent may neither change nor take.
    unmarked = {"type": "VendorNicDevicesUnavailable", "status": "True", "reason": "Down", "message": "nic"}
    answer = _patch_status(cluster, placed, placed.node, {"conditions": [unmarked]})
    _refused_by_policy(
        answer, placed.node, "this update adds, changes or removes: VendorNicDevicesUnavailable"
    )


def test_other_status_fields_and_metadata_are_refused(cluster: KubeTestCluster, placed: Placement) -> None:
    answer = _patch_status(cluster, placed, placed.node, {"capacity": {GPU: "8"}})
    _refused_by_policy(answer, placed.node, "this update changes status.")
    # The server defaults allocatable to capacity on a Node that has none, so the update changes
    # both; CEL iterates a map in no fixed order, so the message lists them in either.
    changed = answer.message.split("this update changes ")[1].split(", ")
    assert sorted(changed) == ["status.allocatable", "status.capacity"], answer.message
    answer = _patch_status(cluster, placed, placed.node, {"conditions": [_ours()]}, labels={"stolen": "yes"})
    _refused_by_policy(answer, placed.node, "this update changes metadata.labels")


def test_a_token_bound_to_no_pod_names_no_node_and_is_refused(
    cluster: KubeTestCluster, placed: Placement
) -> None:
    unbound = cluster.service_account_kubeconfig(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, None)
    body = {"status": {"conditions": [_ours()]}}
    answer = api_request(cluster, unbound, "PATCH", f"/api/v1/nodes/{placed.node}/status", body, STRATEGIC)
    _refused_by_policy(answer, placed.node, "credentials name no node")


@pytest.mark.parametrize(
    ("method", "path", "body", "says"),
    [
        (
            "GET",
            "/api/v1/nodes/{node}",
            None,
            'cannot get resource "nodes" in API group "" at the cluster scope',
        ),
        ("GET", "/api/v1/nodes", None, 'cannot list resource "nodes" in API group "" at the cluster scope'),
        (
            "PATCH",
            "/api/v1/nodes/{node}",
            {"metadata": {"labels": {"x": "y"}}},
            'cannot patch resource "nodes" in API group "" at the cluster scope',
        ),
        (
            "GET",
            "/api/v1/namespaces/{namespace}/pods",
            None,
            'cannot list resource "pods" in API group "" in the namespace "{namespace}"',
        ),
        (
            "DELETE",
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events/any",
            None,
            'cannot delete resource "events" in API group "events.k8s.io" in the namespace "{namespace}"',
        ),
        (
            "GET",
            "/api/v1/namespaces/{namespace}/secrets",
            None,
            'cannot list resource "secrets" in API group "" in the namespace "{namespace}"',
        ),
    ],
    ids=["get-node", "list-nodes", "patch-node", "list-pods", "delete-event", "list-secrets"],
)
def test_what_rbac_does_not_grant_is_refused(
    cluster: KubeTestCluster, placed: Placement, method: str, path: str, body: Any, says: str
) -> None:
    where = {"node": placed.node, "namespace": placed.namespace}
    answer = api_request(
        cluster, placed.kubeconfig, method, path.format(**where), body,
        "application/merge-patch+json" if method == "PATCH" else "",
    )  # fmt: skip
    assert answer.status == 403, answer
    assert answer.body["reason"] == "Forbidden", answer
    assert f'User "{AGENT_USER}" {says.format(**where)}' in answer.message, answer.message


def test_what_rbac_grants_is_allowed(cluster: KubeTestCluster, placed: Placement) -> None:
    cluster.apply(pod_manifest(placed.namespace, WORKLOAD, placed.node))
    pod = api_request(
        cluster, placed.kubeconfig, "GET", f"/api/v1/namespaces/{placed.namespace}/pods/{WORKLOAD}"
    )
    status = api_request(cluster, placed.kubeconfig, "GET", f"/api/v1/nodes/{placed.node}/status")
    assert (pod.status, status.status) == (200, 200), (pod, status)
    assert status.body["metadata"]["name"] == placed.node


def test_the_server_refuses_a_policy_whose_cel_does_not_type_check(cluster: KubeTestCluster) -> None:
    # The real server type-checks CEL when the policy is written; the Python fake
    # (testkit/admission_policy.py, untyped CEL) would accept this one and fail only at evaluation.
    shipped = (ROOT / "deploy" / "kubernetes" / "reporting" / "admissionpolicy.yaml").read_text()
    broken = shipped.replace("has(request.name) ? request.name : ''", "has(request.name) ? request.name : 0")
    assert broken != shipped
    done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=broken, check=False)
    assert done.returncode == 1
    assert "spec.variables[1].expression: Invalid value" in done.stderr, done.stderr
    assert "found no matching overload for '_?_:_' applied to '(bool, string, int)'" in done.stderr
