"""The kubernetes sink's setting on a real API server (kube-testcluster): the shipped RBAC and
admission policy installed, and for each test a Node with the agent's Pod on it, whose pod-bound
service-account token is the agent's identity, as on a cluster."""

from __future__ import annotations

import json
import secrets
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.kube_testcluster import KubeTestCluster
from testkit.waiting import wait_until

__all__ = [
    "AGENT_NAMESPACE",
    "AGENT_SERVICE_ACCOUNT",
    "Answer",
    "agent_identity",
    "apply_reporting",
    "bearer_request",
    "Placement",
    "READY",
    "api_request",
    "install_reporting",
    "place_agent",
    "pod_manifest",
]

ROOT = Path(__file__).resolve().parent.parent
REPORTING = ROOT / "deploy" / "kubernetes" / "reporting"
# Fixed by the shipped ClusterRoleBinding and the policy's matchConditions.
AGENT_NAMESPACE = "pod-resources-watcher"
AGENT_SERVICE_ACCOUNT = "pod-resources-watcher"
POLICY = "pod-resources-watcher-node-status"
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
}


@dataclass(frozen=True)
class Answer:
    """The API server's own answer: the HTTP status and the body (a Status object on errors)."""

    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


def api_request(
    cluster: KubeTestCluster,
    kubeconfig: Path,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "",
) -> Answer:
    """One request as the kubeconfig's (bearer-token) user, the answer as the server gave it."""
    config = _load(kubeconfig)
    token = config["users"][0]["user"]["token"]
    data = None if body is None else json.dumps(body).encode()
    return bearer_request(cluster.server, cluster.ca_file, token, method, path, data, content_type)


def bearer_request(
    server: str, ca_file: Path, token: str, method: str, path: str, data: bytes | None, content_type: str = ""
) -> Answer:
    """One HTTPS request to `server` (trusting `ca_file`) with a bearer token; any status is an Answer."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = content_type or "application/json"
    request = urllib.request.Request(server + path, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return Answer(response.status, json.loads(response.read() or b"{}"))
    except urllib.error.HTTPError as error:
        return Answer(error.code, json.loads(error.read() or b"{}"))


def _load(kubeconfig: Path) -> Any:
    import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

    return yaml.safe_load(kubeconfig.read_text())


def apply_reporting(cluster: KubeTestCluster) -> None:
    """The agent's namespace and ServiceAccount, the shipped rbac.yaml and admissionpolicy.yaml,
    applied as the admin (the server enforces the policy a moment later)."""
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE},
        },
    )
    for manifest in ("rbac.yaml", "admissionpolicy.yaml"):
        cluster.kubectl("apply", "-f", str(REPORTING / manifest))


async def install_reporting(cluster: KubeTestCluster) -> None:
    """`apply_reporting`; returns once the server enforces the policy (it compiles and syncs the
    policy asynchronously)."""
    apply_reporting(cluster)
    # A probe the policy refuses and RBAC allows: patch another node's status.
    probe, elsewhere = place_agent(cluster, "probe"), place_agent(cluster, "probe")
    patch = {"status": {"conditions": [READY]}}

    def refused() -> bool:
        answer = api_request(
            cluster,
            probe.kubeconfig,
            "PATCH",
            f"/api/v1/nodes/{elsewhere.node}/status",
            patch,
            "application/strategic-merge-patch+json",
        )
        return answer.status == 403 and POLICY in answer.message

    await wait_until(refused, timeout=30, interval=0.2, what="the admission policy enforced")


@dataclass(frozen=True)
class Placement:
    """A Node, the agent's Pod on it, the agent's kubeconfig (a token bound to that Pod), and a
    namespace for the workload pods the agent reports on."""

    node: str
    pod: str
    namespace: str
    kubeconfig: Path


def place_agent(cluster: KubeTestCluster, tag: str) -> Placement:
    """A fresh Node (Ready, as a kubelet would have set it) named after `tag`, the agent's Pod
    bound to it, and an empty workload namespace with its default ServiceAccount (no
    controller-manager makes one)."""
    suffix = secrets.token_hex(3)
    node, pod, namespace = f"{tag}-{suffix}", f"agent-{tag}-{suffix}", f"work-{tag}-{suffix}"
    cluster.apply(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace},
        },
    )
    cluster.kubectl(
        "patch", "node", node, "--subresource=status", "--type=strategic", "-p",
        json.dumps({"status": {"conditions": [READY]}}),
    )  # fmt: skip
    return Placement(node, pod, namespace, agent_identity(cluster, node, pod))


def agent_identity(cluster: KubeTestCluster, node: str, pod: str) -> Path:
    """The agent's Pod `pod` bound to an existing `node` (a real kubelet's) and a kubeconfig
    holding a token bound to that Pod, as the chart's projected token is."""
    cluster.apply(pod_manifest(AGENT_NAMESPACE, pod, node, AGENT_SERVICE_ACCOUNT))
    return cluster.service_account_kubeconfig(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, pod)


def pod_manifest(namespace: str, name: str, node: str, service_account: str = "default") -> dict[str, Any]:
    """A Pod already placed on `node` (no scheduler needed); it stays Pending unless a kubelet (the
    real-node peer) runs as that Node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "pod-resources-watcher:test"}],
        },
    }
