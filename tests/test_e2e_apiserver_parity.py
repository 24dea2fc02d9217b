"""Our fake API server answers as the real one does: one table of the requests the kubernetes
sink and its users make, or must be refused, each sent with the same identity to both servers
(testkit.api_parity), the same status code, Status body (reason, message, details) and stored
result read back required of both.

The real server is kube-testcluster (upstream's kube-apiserver and etcd) with the shipped RBAC and
ValidatingAdmissionPolicy installed; the fake is watcher/sim/apiserver/ with testkit's strict
schemas and admission policy, as tests/test_kubernetes_sink.py runs it. Each row has its own Node,
agent Pod, workload Pod and second Node on each side, made alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.api_parity import AGENT_USER, WORKLOAD, Call, Row, Side, both_sides, identity, play
from testkit.kube_reporting import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    READY,
)
from testkit.kube_testcluster import KubeTestCluster
from watcher.sinks.kubernetes.condition_plan import OWNER_MARK, NodeCondition
from watcher.sinks.kubernetes.conditions import condition_patch
from watcher.sinks.kubernetes.planner import ACTION

pytestmark = pytest.mark.e2e

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CONDITION = "NvidiaGpuDevicesUnavailable"
POLICY = "ValidatingAdmissionPolicy 'pod-resources-watcher-node-status'"
# The sink's own patches (watcher/sinks/kubernetes/conditions.py), at fixed times.
T1, T2 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
HEALTHY = NodeCondition(CONDITION, "False", "DevicesAvailable", OWNER_MARK + "no device is unavailable")
FAILED = NodeCondition(CONDITION, "True", "DevicesFailedOrMissing", OWNER_MARK + "GPU-held failed")
ADDED = condition_patch({}, [HEALTHY], prune=True, now=T1)
_AS_ADDED = {CONDITION: {**ADDED[0], "lastTransitionTime": ADDED[0]["lastTransitionTime"]}}
UPDATED = condition_patch(_AS_ADDED, [FAILED], prune=True, now=T2)
REMOVED = condition_patch(_AS_ADDED, [], prune=True, now=T2)
EVENTS = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"
NODE_EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
POD_EVENT = f"{WORKLOAD}.00000000000000a1"
NODE_EVENT = "{node}.00000000000000b2"


def _conditions(items: list[dict[str, Any]], rv: str | None = "{rv}", **metadata: Any) -> dict[str, Any]:
    """The body the sink sends: its items, with the resourceVersion it read."""
    meta = ({"resourceVersion": rv} if rv else {}) | metadata
    return ({"metadata": meta} if meta else {}) | {"status": {"conditions": items}}


def _event(name: str, namespace: str, regarding: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An Event as the sink writes one (watcher/sinks/kubernetes/events.py)."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "eventTime": "2026-01-01T00:00:00.000001Z",
        "reportingController": "pod-resources-watcher",
        "reportingInstance": "{node}",
        "action": ACTION,
        "reason": "DeviceFailed",
        "type": "Warning",
        "note": "nvidia.com/gpu GPU-held failed while pod {namespace}/trainer holds it",
        "regarding": regarding,
    } | fields


ON_POD = {"apiVersion": "v1", "kind": "Pod", "namespace": "{namespace}", "name": WORKLOAD, "uid": "{pod_uid}"}
ON_NODE = {"apiVersion": "v1", "kind": "Node", "name": "{node}", "uid": "{node_uid}"}
POD_EVENT_BODY = _event(POD_EVENT, "{namespace}", ON_POD)
NODE_EVENT_BODY = _event(NODE_EVENT, "default", ON_NODE, reason="DeviceRemoved")
SERIES = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000001Z"}}
STORED_POD_EVENT = (f"{EVENTS}/{POD_EVENT}", f"/api/v1/namespaces/{{namespace}}/events/{POD_EVENT}")
STORED_NODE_EVENT = (f"{NODE_EVENTS}/{NODE_EVENT}", f"/api/v1/namespaces/default/events/{NODE_EVENT}")
OWN_STATUS = "/api/v1/nodes/{node}/status"
# Another writer's condition: our suffix, not our mark.
VENDOR = {"type": "VendorNicDevicesUnavailable", "status": "True", "reason": "Down", "message": "nic"}


def _rbac(id: str, method: str, path: str, says: str, body: Any = None, who: str = "agent") -> Row:
    user = AGENT_USER if who == "agent" else who
    ctype = MERGE if method == "PATCH" else ""
    return Row(id, Call(who, method, path, body, ctype), 403, f'User "{user}" cannot {says}')


def _own_status(id: str, body: Any, says: str, who: str = "agent") -> Row:
    return Row(id, Call(who, "PATCH", OWN_STATUS, body, STRATEGIC), 403, says, stored=(OWN_STATUS,))


TABLE = [
    # --- Events (events.k8s.io/v1: the sink writes no core v1 Event) ---
    Row("event-on-pod", Call("agent", "POST", EVENTS, POD_EVENT_BODY), 201, stored=STORED_POD_EVENT),
    Row("event-on-node", Call("agent", "POST", NODE_EVENTS, NODE_EVENT_BODY), 201, stored=STORED_NODE_EVENT),
    Row(
        "event-series",
        Call("agent", "PATCH", f"{EVENTS}/{POD_EVENT}", SERIES, MERGE),
        200,
        before=(Call("agent", "POST", EVENTS, POD_EVENT_BODY),),
        stored=STORED_POD_EVENT,
    ),
    Row(
        "event-again",
        Call("agent", "POST", EVENTS, POD_EVENT_BODY),
        409,
        "already exists",
        before=(Call("agent", "POST", EVENTS, POD_EVENT_BODY),),
        stored=STORED_POD_EVENT,
    ),
    Row(
        "event-series-of-none",
        Call("agent", "PATCH", f"{EVENTS}/{POD_EVENT}", SERIES, MERGE),
        404,
        "not found",
    ),
    Row(
        # A new-style Event (with an eventTime) about a namespaced object may be in any namespace.
        "event-in-default-on-a-pod",
        Call("agent", "POST", NODE_EVENTS, _event(POD_EVENT, "default", ON_POD)),
        201,
        stored=(f"{NODE_EVENTS}/{POD_EVENT}",),
    ),
    Row(
        "event-on-node-in-a-namespace",
        Call("agent", "POST", EVENTS, _event(NODE_EVENT, "{namespace}", ON_NODE)),
        422,
        "does not match event.namespace",
    ),
    Row(
        "event-time-in-seconds",
        Call("agent", "POST", EVENTS, {**POD_EVENT_BODY, "eventTime": "2026-01-01T00:00:00Z"}),
        400,
        "parsing time",
    ),
    Row(
        "event-note-too-long",
        Call("agent", "POST", EVENTS, {**POD_EVENT_BODY, "note": "x" * 1025}),
        422,
        "can have at most 1024 characters",
    ),
    Row(
        "event-note-changed",
        Call("agent", "PATCH", f"{EVENTS}/{POD_EVENT}", {"note": "changed"}, MERGE),
        422,
        "field is immutable",
        before=(Call("agent", "POST", EVENTS, POD_EVENT_BODY),),
        stored=STORED_POD_EVENT,
    ),
    Row(
        "event-in-a-missing-namespace",
        Call(
            "agent",
            "POST",
            "/apis/events.k8s.io/v1/namespaces/gone/events",
            _event(POD_EVENT, "gone", {**ON_POD, "namespace": "gone"}),
        ),
        404,
        'namespaces "gone" not found',
    ),
    Row(
        "event-series-of-one",
        Call(
            "agent",
            "PATCH",
            f"{EVENTS}/{POD_EVENT}",
            {"series": {"count": 1, "lastObservedTime": SERIES["series"]["lastObservedTime"]}},
            MERGE,
        ),
        422,
        "series.count",
        before=(Call("agent", "POST", EVENTS, POD_EVENT_BODY),),
        stored=STORED_POD_EVENT,
    ),
    _rbac(
        "core-event",
        "POST",
        "/api/v1/namespaces/{namespace}/events",
        'create resource "events" in API group ""',
        {"metadata": {"name": "x"}},
    ),
    # --- the agent's own condition, with the sink's own patches ---
    Row(
        "condition-added",
        Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED), STRATEGIC),
        200,
        stored=(OWN_STATUS,),
    ),
    Row(
        "condition-updated",
        Call("agent", "PATCH", OWN_STATUS, _conditions(UPDATED), STRATEGIC),
        200,
        before=(Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), STRATEGIC),),
        stored=(OWN_STATUS,),
    ),
    Row(
        "condition-removed",
        Call("agent", "PATCH", OWN_STATUS, _conditions(REMOVED), STRATEGIC),
        200,
        before=(Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), STRATEGIC),),
        stored=(OWN_STATUS,),
    ),
    Row(
        "stale-resource-version",
        Call("agent", "PATCH", OWN_STATUS, _conditions(UPDATED, "{rv0}"), STRATEGIC),
        409,
        "the object has been modified",
        before=(Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), STRATEGIC),),
        stored=(OWN_STATUS,),
    ),
    Row("own-status", Call("agent", "GET", OWN_STATUS), 200),
    Row("workload-pod", Call("agent", "GET", f"/api/v1/namespaces/{{namespace}}/pods/{WORKLOAD}"), 200),
    Row(
        "condition-status-maybe",
        Call("agent", "PATCH", OWN_STATUS, _conditions([{**ADDED[0], "status": "Maybe"}]), STRATEGIC),
        200,
        stored=(OWN_STATUS,),
        fake_stricter="the fake is stricter on purpose: a Node condition's status must be True, False or "
        "Unknown there (the real server takes any string)",
    ),
    # --- what the shipped admission policy refuses ---
    Row(
        "another-nodes-status",
        Call("agent", "PATCH", "/api/v1/nodes/{other}/status", _conditions(ADDED, None), STRATEGIC),
        403,
        "may update only the status of its own node, not of",
        stored=("/api/v1/nodes/{other}/status",),
    ),
    _own_status(
        "ready-condition",
        _conditions([{**READY, "status": "False"}], None),
        "adds, changes or removes: Ready",
    ),
    _own_status(
        "unowned-condition",
        _conditions(
            [{"type": "VendorNicDevicesUnavailable", "status": "True", "reason": "Down", "message": "nic"}],
            None,
        ),
        "adds, changes or removes: VendorNicDevicesUnavailable",
    ),
    _own_status(
        "other-status-fields",
        {"status": {"capacity": {"nvidia.com/gpu": "8"}}},
        "this update changes status.",
    ),
    _own_status(
        "labels", _conditions(ADDED, None, labels={"stolen": "yes"}), "this update changes metadata.labels"
    ),
    _own_status("unbound-token", _conditions(ADDED, None), "credentials name no node", who="unbound"),
    _own_status(
        "annotations",
        _conditions(ADDED, None, annotations={"stolen": "yes"}),
        "this update changes metadata.annotations",
    ),
    _own_status(
        "ready-removed", _conditions([{"type": "Ready", "$patch": "delete"}], None), "removes: Ready"
    ),
    # A merge patch replaces the whole list: Ready goes, which is why the sink merges strategically.
    Row(
        "merge-patch-drops-ready",
        Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), MERGE),
        403,
        "adds, changes or removes: Ready",
        stored=(OWN_STATUS,),
    ),
    Row(
        "another-writers-condition-taken-over",
        Call(
            "agent", "PATCH", OWN_STATUS, _conditions([{**ADDED[0], "type": VENDOR["type"]}], None), STRATEGIC
        ),
        403,
        f"adds, changes or removes: {VENDOR['type']}",
        before=(Call("admin", "PATCH", OWN_STATUS, _conditions([VENDOR], None), STRATEGIC),),
        stored=(OWN_STATUS,),
    ),
    Row(
        "json-patch-adds-a-condition",
        Call(
            "agent",
            "PATCH",
            OWN_STATUS,
            [{"op": "add", "path": "/status/conditions/-", "value": ADDED[0]}],
            JSON_PATCH,
        ),
        200,
        stored=(OWN_STATUS,),
    ),
    # --- what the shipped RBAC does not grant ---
    _rbac(
        "update-status",
        "PUT",
        OWN_STATUS,
        'update resource "nodes/status" in API group ""',
        {"metadata": {"name": "{node}"}},
    ),
    _rbac(
        "get-node", "GET", "/api/v1/nodes/{node}", 'get resource "nodes" in API group "" at the cluster scope'
    ),
    _rbac("list-nodes", "GET", "/api/v1/nodes", 'list resource "nodes" in API group "" at the cluster scope'),
    _rbac(
        "patch-node",
        "PATCH",
        "/api/v1/nodes/{node}",
        'patch resource "nodes"',
        {"metadata": {"labels": {"x": "y"}}},
    ),
    _rbac("list-pods", "GET", "/api/v1/namespaces/{namespace}/pods", 'list resource "pods" in API group ""'),
    _rbac("delete-event", "DELETE", f"{EVENTS}/any", 'delete resource "events" in API group "events.k8s.io"'),
    _rbac("list-secrets", "GET", "/api/v1/namespaces/{namespace}/secrets", 'list resource "secrets"'),
    _rbac(
        "viewer-pod",
        "GET",
        f"/api/v1/namespaces/{{namespace}}/pods/{WORKLOAD}",
        'get resource "pods"',
        who="viewer",
    ),
    Row("no-such-token", Call("nobody", "GET", OWN_STATUS), 401, "Unauthorized"),
    # --- missing objects, malformed patches ---
    Row(
        "missing-pod",
        Call("agent", "GET", "/api/v1/namespaces/{namespace}/pods/gone"),
        404,
        'pods "gone" not found',
    ),
    Row("missing-node", Call("agent", "GET", "/api/v1/nodes/gone/status"), 404, 'nodes "gone" not found'),
    Row(
        "patch-not-an-object",
        Call("agent", "PATCH", OWN_STATUS, [ADDED[0]], STRATEGIC),
        400,
        "cannot unmarshal array",
        stored=(OWN_STATUS,),
    ),
    Row(
        "patch-not-json",
        Call("agent", "PATCH", OWN_STATUS, b'{"status": ', STRATEGIC),
        400,
        "invalid JSON patch",
        stored=(OWN_STATUS,),
    ),
    Row(
        "patch-unknown-type",
        Call("agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), "text/plain"),
        415,
        "Unsupported Media Type",
        stored=(OWN_STATUS,),
    ),
]


@pytest.fixture(scope="module")
def cluster(reporting: KubeTestCluster) -> KubeTestCluster:
    return reporting


@pytest.fixture(scope="module")
def unbound(cluster: KubeTestCluster) -> Path:
    """The agent's service account's token bound to nothing: it names no node."""
    return cluster.service_account_kubeconfig(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, None)


@pytest.fixture
async def sides(
    cluster: KubeTestCluster, unbound: Path, short_tmp: Path, request: pytest.FixtureRequest
) -> AsyncIterator[dict[str, Side]]:
    """Both servers set up alike for one test: the same names, each its own uids."""
    tag = request.node.callspec.id[:18].strip("-") if hasattr(request.node, "callspec") else "identity"
    async with both_sides(cluster, tag, unbound, short_tmp / "api") as made:
        yield made


@pytest.mark.parametrize("row", TABLE, ids=[r.id for r in TABLE])
async def test_both_servers_answer_alike(sides: dict[str, Side], row: Row) -> None:
    real = await asyncio.to_thread(play, sides["real"], row)
    assert real["status"] == row.status, real
    assert row.says in real["message"], real["message"]
    if row.status == 403 and row.call.path == OWN_STATUS and row.call.method == "PATCH":
        assert real["message"].startswith(f'nodes "{sides["real"].values["node"]}" is forbidden: {POLICY}')
    fake = await asyncio.to_thread(play, sides["fake"], row)
    if row.fake_stricter:
        assert fake["status"] == 422 and not any(fake["changed"]), (row.fake_stricter, fake)
        return
    assert fake["answer"] == real["answer"], (
        f"the fake answered\n{fake['answer']}\nthe real server\n{real['answer']}"
    )
    assert fake["stored"] == real["stored"], (
        f"the fake stored\n{fake['stored']}\nthe real server\n{real['stored']}"
    )
    assert fake["changed"] == real["changed"]
    if row.status >= 400:
        assert not any(real["changed"]), "a refused request changed what is stored"


async def test_the_fakes_agent_is_who_the_real_token_says(sides: dict[str, Side]) -> None:
    real, fake = sides["real"], sides["fake"]
    review_body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    reviewed = await asyncio.to_thread(
        real.send, "agent", "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review_body
    )
    assert reviewed.status == 201, reviewed
    real_user = reviewed.body["status"]["userInfo"]
    fake.users_seen.clear()
    wrote = await asyncio.to_thread(
        fake.send, "agent", "PATCH", OWN_STATUS, _conditions(ADDED, None), STRATEGIC
    )
    assert wrote.status == 200, wrote
    fake_user = fake.users_seen[-1]

    assert identity(fake_user, fake) == identity(real_user, real)
    # The uids are those of the Node and the agent's Pod on each side.
    assert identity(real_user, real)["extra"]["authentication.kubernetes.io/node-uid"] == ["{node_uid}"]
    assert identity(real_user, real)["extra"]["authentication.kubernetes.io/pod-uid"] == ["{agent_pod_uid}"]
