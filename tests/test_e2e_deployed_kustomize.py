"""The kustomize base with the reporting overlay, applied as deploy/README.md tells users
(`kubectl apply -k deploy/overlays/kubernetes-reporting`) on a node whose kubelet (upstream v1.37)
runs pods on containerd and runc (testkit.container_node): the agent's Pod Events and Node
condition written through its own projected service-account token, under the shipped RBAC and
admission policy, in-cluster (the `kubernetes` Service, as every pod reaches its API server);
`kubectl delete -k` leaves nothing behind."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.container_node import ContainerNode
from testkit.deployed import NAMESPACE, Release
from testkit.kube_reporting import POLICY, bearer_request
from testkit.node_agent import until_node_condition
from testkit.real_node import held_devices
from testkit.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420), pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "overlays" / "kubernetes-reporting"
GPU = "example.com/gpu"
CONDITION = "ExampleGpuDevicesUnavailable"
# The reporting component's cluster-scoped objects (deploy/kubernetes/reporting/).
CLUSTER_OBJECTS = (
    "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"
)


async def _pod_event_reasons(node: ContainerNode, namespace: str, pod: str) -> list[str]:
    events = await node.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}")
    return sorted(e["reason"] for e in events["items"] if e.get("reportingComponent") != "kubelet")


async def _token(node: ContainerNode, pod: dict[str, Any]) -> str:
    """The agent's projected token as the kubelet wrote it into the pod's volume (a tmpfs the
    kubelet mounted inside the node: read there)."""
    path = f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volumes/kubernetes.io~projected/api-token/token"
    return (await node.exec("cat", path)).stdout


async def test_the_reporting_overlay_reports_through_its_own_token_and_deletes_cleanly(
    image_node: ContainerNode, tmp_path: Path
) -> None:
    node = image_node
    await node.kubectl_async("apply", "-k", str(OVERLAY))
    agent = Release(node.cluster, "pod-resources-watcher", tmp_path)  # its pods and logs; not helm's
    namespace = ""
    try:
        pod = await agent.ready_pod()
        # The token is the pod's own: bound to it, and to this node (the policy's check).
        token = await _token(node, pod)
        claims = json.loads(_b64(token.split(".")[1]))
        assert claims["kubernetes.io"]["pod"]["uid"] == pod["metadata"]["uid"]
        assert claims["kubernetes.io"]["node"]["name"] == node.name

        # A GPU fails at its plugin: the Pod Event and the Node condition, both through that token.
        plugin = await node.add_plugin(GPU, {"gpu0": (0,), "gpu1": (1,)})
        namespace = await node.namespace(f"rep-{uuid.uuid4().hex[:6]}")
        await node.apply(node.pod(namespace, "trainer", {GPU: 1}))
        held_pod = await node.wait_pod(namespace, "trainer")
        (held,) = held_devices(held_pod)
        await until_node_condition(node, CONDITION, "False", 60)
        await plugin.set_healthy(held, False)
        failed = await until_node_condition(node, CONDITION, "True", 60)
        assert held in failed["message"] and f"{namespace}/trainer" in failed["message"]
        await plugin.set_healthy(held, True)
        await until_node_condition(node, CONDITION, "False", 60)

        async def both_events() -> bool:
            return await _pod_event_reasons(node, namespace, "trainer") == ["DeviceFailed", "DeviceRecovered"]

        await wait_until(both_events, timeout=60, interval=0.5, what="DeviceFailed and DeviceRecovered")

        # The same token may not write another node's status (the admission policy), nor do what
        # RBAC does not grant (read Secrets).
        other = f"other-{uuid.uuid4().hex[:6]}"
        node.cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}})
        patch = json.dumps({"status": {"conditions": [_condition_of(CONDITION)]}}).encode()
        answer = await asyncio.to_thread(
            bearer_request, node.cluster.server, node.cluster.ca_file, token, "PATCH",
            f"/api/v1/nodes/{other}/status", patch, "application/strategic-merge-patch+json",
        )  # fmt: skip
        assert answer.status == 403 and POLICY in answer.message, answer
        secrets = await asyncio.to_thread(
            bearer_request, node.cluster.server, node.cluster.ca_file, token, "GET",
            f"/api/v1/namespaces/{NAMESPACE}/secrets", None,
        )  # fmt: skip
        assert secrets.status == 403, secrets
    finally:
        await node.kubectl_async("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s")

    # Nothing left: the namespace (and with it every namespaced object), the cluster-scoped RBAC
    # and policy, the pod's containers on the node.
    async def namespace_gone() -> bool:
        found = await node.kubectl_async("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name")
        return found.strip() == ""

    await wait_until(namespace_gone, timeout=120, interval=0.5, what=f"namespace {NAMESPACE} deleted")
    left = await node.kubectl_async(
        "get", CLUSTER_OBJECTS, "-l", "app.kubernetes.io/part-of=pod-resources-watcher", "-o", "name"
    )
    assert left.strip() == ""
    # The workload gone too, the node runs no container at all: none of the agent's was left.
    await node.kubectl_async("delete", "namespace", namespace, "--wait=true", "--timeout=120s")

    async def no_container() -> bool:
        return await node.containers() == []

    await wait_until(no_container, timeout=60, interval=0.5, what="no container left on the node")


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _condition_of(kind: str) -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": "Probe", "message": "not this agent's node"}
