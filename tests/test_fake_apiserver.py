"""The fake Kubernetes API server holds clients to the real server's contract.

What it stores is read back through the real kubectl (a client we did not write); what it refuses
is refused with the real server's status, reason and wording.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.kube_rbac import rules_from_manifests
from testkit.kube_schemas import strict_schemas
from testkit.tools import tool
from watcher.sim.apiserver import ADMIN, FakeApiServer, kubectl, micro_time, pod_bound_user
from watcher.sim.apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge


@pytest.fixture(autouse=True)
def _openssl_and_kubectl() -> None:
    """Every test here needs both: skipped without them, failed under CI (testkit.tools)."""
    tool("openssl")
    tool("kubectl")


SA = "system:serviceaccount:pod-resources-watcher:pod-resources-watcher"
NODE = "gpu-node-1"
WATCHER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]
USERS = {
    "watcher": pod_bound_user(SA, node=NODE, pod="pod-resources-watcher-x7k2p"),
    "creator": {"username": "system:serviceaccount:ml:creator"},
}
RULES: dict[str, list[dict[str, Any]]] = {
    "watcher": WATCHER_RULES,
    "creator": [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}],
}
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


@pytest.fixture
async def api(short_tmp: Path) -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(short_tmp / "apiserver", users=USERS, rules=RULES, schema=strict_schemas())
    await server.start()
    server.add_node(NODE)
    server.add_pod("ml", "trainer-0", NODE)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def admin(api: FakeApiServer, short_tmp: Path) -> Path:
    """An admin kubeconfig (its own directory: kubectl's discovery cache goes beside it)."""
    return api.write_kubeconfig(short_tmp / "admin" / "config", ADMIN)


class Client:
    """A plain HTTPS client with one user's bearer token, to send exactly what a test means."""

    def __init__(self, api: FakeApiServer, session: aiohttp.ClientSession) -> None:
        self.api, self.session = api, session

    async def call(
        self, user: str | None, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any, dict[str, str]]:
        headers = {"Content-Type": ctype} if body is not None else {}
        if user is not None:
            headers["Authorization"] = f"Bearer {self.api.token(user)}"
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.api.url + path, data=data, headers=headers) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[Client]:
    ctx = ssl.create_default_context(cafile=str(api.ca_file))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield Client(api, session)


def event(name: str, regarding: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as a well-behaved reporter writes one."""
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name},
        "eventTime": micro_time(),
        "reportingController": "pod-resources-watcher.io/agent",
        "reportingInstance": f"pod-resources-watcher-{NODE}",
        "action": "Observed",
        "reason": "DeviceRemoved",
        "type": "Warning",
        "note": "nvidia.com/gpu GPU-1 was removed while pod ml/trainer-0 holds it",
        "regarding": regarding,
    }
    return body | fields


def node_ref(api: FakeApiServer) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": api.node(NODE)["metadata"]["uid"]}


def pod_ref(api: FakeApiServer) -> dict[str, Any]:
    pod = api.pod("ml", "trainer-0")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "trainer-0",
        "uid": pod["metadata"]["uid"],
    }


def conditions(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in api.node(NODE)["status"]["conditions"]}


NODE_STATUS = f"/api/v1/nodes/{NODE}/status"
EVENTS_DEFAULT = "/apis/events.k8s.io/v1/namespaces/default/events"
EVENTS_ML = "/apis/events.k8s.io/v1/namespaces/ml/events"


def gpu_condition(status: str = "False") -> dict[str, Any]:
    return {
        "type": "GPUHealthy",
        "status": status,
        "reason": "DeviceRemoved",
        "message": "GPU-1 is gone",
        "lastHeartbeatTime": "2026-11-30T17:04:05Z",
        "lastTransitionTime": "2026-11-30T17:04:05Z",
    }


# --- read back through kubectl -----------------------------------------------------------------------


async def test_kubectl_describes_the_node_with_a_patched_condition_and_an_event(
    api: FakeApiServer, client: Client, admin: Path
) -> None:
    patch = {"status": {"conditions": [gpu_condition()]}}
    status, _, _ = await client.call("watcher", "PATCH", NODE_STATUS, patch, SMP)
    assert status == 200
    status, created, _ = await client.call(
        "watcher", "POST", EVENTS_DEFAULT, event("gpu-node-1.a", node_ref(api))
    )
    assert status == 201, created

    rc, out, err = await kubectl(admin, "get", "nodes", "-o", "json")
    assert (rc, err) == (0, "")
    (node,) = json.loads(out)["items"]
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {
        "Ready": "True",
        "GPUHealthy": "False",
    }

    rc, out, err = await kubectl(admin, "describe", "node", NODE)
    assert (rc, err) == (0, "")
    assert "GPUHealthy" in out and "GPU-1 is gone" in out
    events = out.split("Events:")[1]
    assert "DeviceRemoved" in events and "nvidia.com/gpu GPU-1 was removed" in events
    # kubectl asked for the node's events twice: by the node's uid and by its name as uid (the
    # kubelet's convention); both through the core view, across all namespaces.
    asked = [r.query for r in api.requests if r.path == "/api/v1/events"]
    assert len(asked) == 2 and all("involvedObject.kind%3DNode" in q for q in asked)


async def test_kubectl_shows_an_events_k8s_io_event_about_a_pod_in_the_core_view(
    api: FakeApiServer, client: Client, admin: Path
) -> None:
    body = event("trainer-0.a", pod_ref(api), series={"count": 2, "lastObservedTime": micro_time()})
    status, created, _ = await client.call("watcher", "POST", EVENTS_ML, body)
    assert status == 201, created

    rc, out, err = await kubectl(admin, "describe", "pod", "-n", "ml", "trainer-0")
    assert (rc, err) == (0, "")
    assert "DeviceRemoved" in out.split("Events:")[1]

    rc, out, err = await kubectl(
        admin, "get", "events", "-n", "ml", "--field-selector", "involvedObject.name=trainer-0", "-o", "json"
    )
    assert (rc, err) == (0, "")
    (core,) = json.loads(out)["items"]
    assert core["apiVersion"] == "v1"
    assert core["involvedObject"] == pod_ref(api)
    assert core["message"] == body["note"]
    assert core["reportingComponent"] == "pod-resources-watcher.io/agent"
    assert core["reportingInstance"] == body["reportingInstance"]
    assert core["eventTime"] == body["eventTime"]
    assert core["series"] == body["series"]
    # The deprecated fields were not set, so their core counterparts are empty, as on the real server.
    assert core["source"] == {} and core["firstTimestamp"] is None and "count" not in core
    assert not {"note", "regarding", "reportingController"} & set(core)

    rc, out, err = await kubectl(
        admin, "get", "events", "-n", "ml", "--field-selector", "involvedObject.name=other"
    )
    assert rc == 0 and "No resources found" in err


async def test_an_unsupported_field_selector_is_a_bad_request(api: FakeApiServer, admin: Path) -> None:
    rc, _, err = await kubectl(admin, "get", "events", "-n", "ml", "--field-selector", "note=x")
    assert rc == 1
    assert err.startswith("Error from server (BadRequest): ")
    assert err.rstrip().endswith(": field label not supported: note")


# --- strategic merge, merge patch, conflicts ------------------------------------------------------------


async def test_strategic_merge_merges_conditions_by_type(api: FakeApiServer, client: Client) -> None:
    ready = conditions(api)["Ready"]
    status, node, _ = await client.call(
        "watcher", "PATCH", NODE_STATUS, {"status": {"conditions": [gpu_condition()]}}, SMP
    )
    assert status == 200
    assert conditions(api) == {"Ready": ready, "GPUHealthy": gpu_condition()}
    assert node["status"]["conditions"] == api.node(NODE)["status"]["conditions"]

    # One element changed by its key, the other untouched; the order directive is accepted.
    patch = {
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "GPUHealthy"}],
            "conditions": [{"type": "GPUHealthy", "status": "True", "reason": "DeviceBack"}],
        }
    }
    status, _, _ = await client.call("watcher", "PATCH", NODE_STATUS, patch, SMP)
    assert status == 200
    assert conditions(api)["Ready"] == ready
    assert conditions(api)["GPUHealthy"] == gpu_condition("True") | {"reason": "DeviceBack"}

    delete = {"status": {"conditions": [{"type": "GPUHealthy", "$patch": "delete"}]}}
    status, _, _ = await client.call("watcher", "PATCH", NODE_STATUS, delete, SMP)
    assert status == 200
    assert conditions(api) == {"Ready": ready}

    # A JSON merge patch has no merge keys: the list it names is replaced whole, Ready included.
    status, _, _ = await client.call(
        "watcher", "PATCH", NODE_STATUS, {"status": {"conditions": [gpu_condition()]}}, MERGE
    )
    assert status == 200
    assert conditions(api) == {"GPUHealthy": gpu_condition()}


async def test_a_status_patch_never_changes_the_spec_and_a_node_patch_never_status(
    api: FakeApiServer, client: Client
) -> None:
    before = api.node(NODE)
    # The real Node status strategy keeps the spec but takes the metadata sent (labels too).
    patch = {
        "metadata": {"labels": {"x": "y"}},
        "spec": {"unschedulable": True},
        "status": {"conditions": [gpu_condition()]},
    }
    status, _, _ = await client.call(ADMIN, "PATCH", NODE_STATUS, patch, SMP)
    assert status == 200
    after = api.node(NODE)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"] | {"x": "y"}
    assert "GPUHealthy" in conditions(api)

    patch = {"status": {"conditions": []}, "metadata": {"labels": {"x": "y"}}}
    status, _, _ = await client.call(ADMIN, "PATCH", f"/api/v1/nodes/{NODE}", patch, SMP)
    assert status == 200
    assert api.node(NODE)["metadata"]["labels"]["x"] == "y"
    assert "GPUHealthy" in conditions(api)


async def test_a_stale_resource_version_is_a_conflict(api: FakeApiServer, client: Client) -> None:
    held = api.node(NODE)["metadata"]["resourceVersion"]
    api.touch_node(NODE)  # another writer, behind the client's back
    patch = {"metadata": {"resourceVersion": held}, "status": {"conditions": [gpu_condition()]}}
    status, body, _ = await client.call("watcher", "PATCH", NODE_STATUS, patch, SMP)
    assert status == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        f'Operation cannot be fulfilled on nodes "{NODE}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert "GPUHealthy" not in conditions(api)

    stale = api.node(NODE)
    api.touch_node(NODE)
    status, body, _ = await client.call(ADMIN, "PUT", NODE_STATUS, stale)
    assert (status, body["reason"]) == (409, "Conflict")

    patch["metadata"]["resourceVersion"] = api.node(NODE)["metadata"]["resourceVersion"]
    status, body, _ = await client.call("watcher", "PATCH", NODE_STATUS, patch, SMP)
    assert status == 200
    assert int(body["metadata"]["resourceVersion"]) > int(patch["metadata"]["resourceVersion"])


async def test_kubectl_patches_node_status_as_admin(api: FakeApiServer, admin: Path) -> None:
    ready = conditions(api)["Ready"]
    patch = json.dumps({"status": {"conditions": [gpu_condition()]}})
    rc, out, err = await kubectl(
        admin, "patch", "node", NODE, "--subresource=status", "--type=strategic", "-p", patch
    )
    assert (rc, err) == (0, ""), err
    assert "patched" in out
    assert conditions(api) == {"Ready": ready, "GPUHealthy": gpu_condition()}
    # kubectl read the status subresource first, then patched it with the strategic type.
    writes = [(r.method, r.path, r.content_type) for r in api.requests if r.path.startswith(NODE_STATUS)]
    assert writes == [("GET", NODE_STATUS, ""), ("PATCH", NODE_STATUS, SMP)]


async def test_node_conditions_need_a_type_and_a_known_status(api: FakeApiServer, client: Client) -> None:
    bad = {"status": {"conditions": [{"type": "GPUHealthy", "status": "Maybe"}]}}
    status, body, _ = await client.call("watcher", "PATCH", NODE_STATUS, bad, SMP)
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "status.conditions[0].status"  # a new one goes first
    status, body, _ = await client.call(
        "watcher", "PATCH", NODE_STATUS, {"status": {"conditions": [{"status": "True"}]}}, MERGE
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert "GPUHealthy" not in conditions(api)


# --- events.k8s.io validation ------------------------------------------------------------------------


async def test_events_are_validated_like_the_real_server(
    api: FakeApiServer, client: Client, admin: Path
) -> None:
    ref = node_ref(api)
    # eventTime is a MicroTime: exactly six fractional digits, or the decoder refuses the body (400).
    for when in ("2026-11-30T17:04:05.123Z", "2026-11-30T17:04:05Z", "2026-11-30T17:04:05.123456789Z"):
        status, body, _ = await client.call(
            "watcher", "POST", EVENTS_DEFAULT, event("e1", ref, eventTime=when)
        )
        assert (status, body["reason"]) == (400, "BadRequest"), when
        assert "cannot be handled as a Event: parsing time" in body["message"]
    status, body, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", ref, bogus=1))
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"].endswith('strict decoding error: unknown field "bogus"')
    status, body, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", ref, note="x" * 1025))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "": can have at most 1024 characters',
            "field": "message",
        }
    ]
    # A node's events live in default (or kube-system), a pod's in the pod's namespace.
    status, body, _ = await client.call("watcher", "POST", EVENTS_ML, event("e1", ref))
    assert (status, body["details"]["causes"][0]["field"]) == (422, "involvedObject.namespace")
    status, body, _ = await client.call(
        "watcher", "POST", EVENTS_DEFAULT, event("e1", ref, type="Info", reportingController="not a name")
    )
    assert status == 422
    assert {c["field"] for c in body["details"]["causes"]} == {"type", "reportingController"}
    assert api.events() == []

    status, created, _ = await client.call(
        "watcher", "POST", EVENTS_DEFAULT, event("e1", ref, note="x" * 1024)
    )
    assert status == 201
    status, body, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", ref))
    assert (status, body["reason"]) == (409, "AlreadyExists")

    path = f"{EVENTS_DEFAULT}/e1"
    status, body, _ = await client.call("watcher", "PATCH", path, {"note": "changed"}, MERGE)
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == 'Event "e1" is invalid: message: Invalid value: "changed": field is immutable'
    series = {"series": {"count": 3, "lastObservedTime": micro_time()}}
    status, patched, _ = await client.call("watcher", "PATCH", path, series, MERGE)
    assert status == 200
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]

    rc, out, err = await kubectl(admin, "get", "events.events.k8s.io", "e1", "-o", "json")
    assert (rc, err) == (0, "")
    assert json.loads(out)["series"] == series["series"]


async def test_generate_name_gives_a_fresh_name(api: FakeApiServer, client: Client) -> None:
    body = event("", node_ref(api))
    body["metadata"] = {"generateName": "gpu-node-1."}
    names = set()
    for _ in range(2):
        status, created, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, body)
        assert status == 201
        names.add(created["metadata"]["name"])
    assert len(names) == 2 and all(n.startswith("gpu-node-1.") and len(n) == 16 for n in names)
    assert {e["metadata"]["name"] for e in api.events()} == names


# --- authentication and authorization ------------------------------------------------------------------


async def test_no_or_unknown_token_is_unauthorized(api: FakeApiServer, client: Client) -> None:
    expected = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Unauthorized", "reason": "Unauthorized", "code": 401,
    }  # fmt: skip
    status, body, _ = await client.call(None, "GET", f"/api/v1/nodes/{NODE}")
    assert (status, body) == (401, expected)
    async with client.session.get(api.url + "/api/v1/nodes", headers={"Authorization": "Bearer nope"}) as r:
        assert (r.status, await r.json()) == (401, expected)


async def test_a_rotated_token_stops_working_and_the_new_one_works(
    api: FakeApiServer, short_tmp: Path
) -> None:
    old = api.write_kubeconfig(short_tmp / "old" / "config", "watcher")
    sa_dir = api.write_service_account_dir(short_tmp / "sa", "watcher")
    assert (sa_dir / "token").read_text() == api.token("watcher")
    assert (sa_dir / "namespace").read_text() == "pod-resources-watcher"
    rc, _, err = await kubectl(old, "get", "node", NODE, "-o", "name")
    assert (rc, err) == (0, "")

    new_token = api.rotate_token("watcher")
    assert (sa_dir / "token").read_text() == new_token
    rc, _, err = await kubectl(old, "get", "node", NODE, "-o", "name")
    assert rc == 1 and "Unauthorized" in err
    new = api.write_kubeconfig(short_tmp / "new" / "config", "watcher")
    rc, out, err = await kubectl(new, "get", "node", NODE, "-o", "name")
    assert (rc, out.strip(), err) == (0, f"node/{NODE}", "")


async def test_a_rotated_token_works_through_its_grace(api: FakeApiServer, client: Client) -> None:
    old = api.token("watcher")
    api.rotate_token("watcher", grace=30)
    headers = {"Authorization": f"Bearer {old}"}
    async with client.session.get(api.url + f"/api/v1/nodes/{NODE}", headers=headers) as r:
        assert r.status == 200
    assert api.token("watcher") != old


async def test_rbac_refuses_what_is_not_granted_with_the_real_message(
    api: FakeApiServer, client: Client, short_tmp: Path
) -> None:
    status, created, _ = await client.call("creator", "POST", EVENTS_ML, event("e1", pod_ref(api)))
    assert status == 201, created
    series = {"series": {"count": 2, "lastObservedTime": micro_time()}}
    status, body, _ = await client.call("creator", "PATCH", f"{EVENTS_ML}/e1", series, MERGE)
    assert status == 403
    assert body == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'events.events.k8s.io "e1" is forbidden: User "system:serviceaccount:ml:creator" cannot '
        'patch resource "events" in API group "events.k8s.io" in the namespace "ml"',
        "reason": "Forbidden", "details": {"name": "e1", "group": "events.k8s.io", "kind": "events"},
        "code": 403,
    }  # fmt: skip
    # The watcher may patch its node's status, not the node itself; kubectl shows the refusal.
    config = api.write_kubeconfig(short_tmp / "watcher" / "config", "watcher")
    rc, _, err = await kubectl(config, "label", "node", NODE, "a=b")
    assert rc == 1
    assert (
        f'Error from server (Forbidden): nodes "{NODE}" is forbidden: User "{SA}" cannot patch resource '
        '"nodes" in API group "" at the cluster scope'
    ) in err


def test_rules_from_manifests_follow_the_bindings(tmp_path: Path) -> None:
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(
        """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: watcher}
rules:
  - {apiGroups: [""], resources: [nodes/status], verbs: [patch], resourceNames: [gpu-node-1]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: watcher}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: watcher}
subjects: [{kind: ServiceAccount, name: pod-resources-watcher, namespace: pod-resources-watcher}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: events, namespace: default}
rules:
  - {apiGroups: [events.k8s.io], resources: [events], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: events, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: events}
subjects: [{kind: ServiceAccount, name: pod-resources-watcher, namespace: pod-resources-watcher}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: other, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: watcher}
subjects: [{kind: ServiceAccount, name: someone-else, namespace: pod-resources-watcher}]
"""
    )
    grants = rules_from_manifests(
        [manifest], service_account="pod-resources-watcher", namespace="pod-resources-watcher"
    )
    assert [(g.namespace, g.rule["resources"]) for g in grants] == [
        (None, ["nodes/status"]),
        ("default", ["events"]),
    ]


async def test_manifest_rules_are_enforced(short_tmp: Path) -> None:
    manifest = short_tmp / "rbac.yaml"
    manifest.write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: ev, namespace: default}\n"
        "rules: [{apiGroups: [events.k8s.io], resources: [events], verbs: [create]}]\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"
        "metadata: {name: ev, namespace: default}\n"
        "roleRef: {kind: Role, name: ev}\n"
        "subjects: [{kind: ServiceAccount, name: pod-resources-watcher, namespace: pod-resources-watcher}]\n"
    )
    grants = rules_from_manifests(
        [manifest], service_account="pod-resources-watcher", namespace="pod-resources-watcher"
    )
    users, rules = {"watcher": USERS["watcher"]}, {"watcher": grants}
    api = FakeApiServer(short_tmp / "api", users=users, rules=rules, schema=strict_schemas())
    await api.start()
    try:
        api.add_node(NODE)
        api.add_pod("ml", "trainer-0", NODE)
        ctx = ssl.create_default_context(cafile=str(api.ca_file))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            client = Client(api, session)
            status, _, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", node_ref(api)))
            assert status == 201
            status, body, _ = await client.call("watcher", "POST", EVENTS_ML, event("e2", pod_ref(api)))
            assert status == 403
            assert body["message"].endswith('in the namespace "ml"')
    finally:
        await api.stop()


# --- faults and admission ---------------------------------------------------------------------------------


async def test_injected_429_carries_retry_after(api: FakeApiServer, client: Client) -> None:
    api.fail_next(429, retry_after=7, method="POST", path_prefix="/apis/events.k8s.io/")
    status, body, _ = await client.call("watcher", "GET", f"/api/v1/nodes/{NODE}")
    assert status == 200  # not a matching request
    status, body, headers = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", node_ref(api)))
    assert (status, headers["Retry-After"], body["reason"]) == (429, "7", "TooManyRequests")
    assert body["details"] == {"retryAfterSeconds": 7}
    assert api.events() == []
    api.fail_next(500, count=2)
    for _ in range(2):
        status, body, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", node_ref(api)))
        assert (status, body["reason"]) == (500, "InternalError")
    status, _, _ = await client.call("watcher", "POST", EVENTS_DEFAULT, event("e1", node_ref(api)))
    assert status == 201
    assert api.count(method="POST", path_prefix=EVENTS_DEFAULT, status=201) == 1


async def test_an_admission_denial_is_invalid_with_the_policy_message(
    api: FakeApiServer, client: Client
) -> None:
    seen: list[dict[str, Any]] = []

    def policy(request: dict[str, Any]) -> str | None:
        seen.append(request)
        node = request["userInfo"]["extra"].get("authentication.kubernetes.io/node-name", [""])[0]
        if request["object"]["metadata"]["name"] == node:
            return None
        return "ValidatingAdmissionPolicy 'own-node' with binding 'own-node' denied request: not your node"

    api.admission = policy
    api.add_node("gpu-node-2")
    status, _, _ = await client.call(
        "watcher", "PATCH", NODE_STATUS, {"status": {"conditions": [gpu_condition()]}}, SMP
    )
    assert status == 200
    other = "/api/v1/nodes/gpu-node-2/status"
    status, body, _ = await client.call(
        "watcher", "PATCH", other, {"status": {"conditions": [gpu_condition()]}}, SMP
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        "nodes \"gpu-node-2\" is forbidden: ValidatingAdmissionPolicy 'own-node' with binding "
        "'own-node' denied request: not your node"
    )
    assert "GPUHealthy" not in {c["type"] for c in api.node("gpu-node-2")["status"]["conditions"]}
    first = seen[0]
    assert (first["operation"], first["resource"]["resource"], first["subResource"]) == (
        "UPDATE",
        "nodes",
        "status",
    )
    assert first["userInfo"]["username"] == SA
    assert {c["type"] for c in first["object"]["status"]["conditions"]} == {"Ready", "GPUHealthy"}
    assert {c["type"] for c in first["oldObject"]["status"]["conditions"]} == {"Ready"}


async def test_the_server_runs_on_the_callers_loop(api: FakeApiServer, admin: Path) -> None:
    """kubectl runs as a subprocess the loop awaits: two at once both get their answers."""
    results = await asyncio.gather(
        kubectl(admin, "get", "node", NODE, "-o", "name"), kubectl(admin, "get", "ns", "-o", "name")
    )
    assert [rc for rc, _, _ in results] == [0, 0]
    assert "namespace/ml" in results[1][1].split()


# --- the patch formats on their own ----------------------------------------------------------------


def test_strategic_merge_directives() -> None:
    keys = {("status", "conditions"): "type", ("metadata", "finalizers"): ""}
    original = {
        "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
        "status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]},
    }
    patch = {
        "metadata": {"labels": {"a": None, "c": "3"}, "finalizers": ["y"]},
        "status": {
            "$setElementOrder/conditions": [{"type": "B"}, {"type": "A"}],
            "conditions": [{"type": "A", "reason": "R"}],
        },
    }
    # An element new to a merged list comes before the stored ones (strategicpatch's order).
    assert strategic_merge(original, patch, keys) == {
        "metadata": {"labels": {"b": "2", "c": "3"}, "finalizers": ["y", "x"]},
        "status": {
            "conditions": [{"type": "B", "status": "False"}, {"type": "A", "status": "True", "reason": "R"}]
        },
    }
    replaced = strategic_merge(original, {"metadata": {"$patch": "replace", "name": "n"}}, keys)
    assert replaced["metadata"] == {"name": "n"}
    dropped = strategic_merge(original, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}, keys)
    assert dropped["metadata"]["finalizers"] == []
    with pytest.raises(PatchError, match="merge key: type"):
        strategic_merge(original, {"status": {"conditions": [{"status": "True"}]}}, keys)
    assert original["metadata"]["labels"] == {"a": "1", "b": "2"}  # the original is not modified


def test_merge_patch_and_json_patch() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(doc, {"a": {"b": None, "c": [3]}, "e": {"f": 1}}) == {
        "a": {"c": [3]},
        "d": 1,
        "e": {"f": 1},
    }
    ops = [
        {"op": "test", "path": "/a/b", "value": 1},
        {"op": "add", "path": "/a/c/-", "value": 3},
        {"op": "replace", "path": "/d", "value": 2},
        {"op": "move", "from": "/a/b", "path": "/x~1y"},
        {"op": "remove", "path": "/a/c/0"},
    ]
    assert json_patch(doc, ops) == {"a": {"c": [2, 3]}, "d": 2, "x/y": 1}
    with pytest.raises(PatchError) as failed:
        json_patch(doc, [{"op": "test", "path": "/d", "value": 2}])
    assert failed.value.code == 422
    with pytest.raises(PatchError, match="missing path"):
        json_patch(doc, [{"op": "replace", "path": "/nope", "value": 2}])


async def test_a_json_patch_test_guards_the_write(api: FakeApiServer, client: Client) -> None:
    ready = "/status/conditions/0"
    ops = [
        {"op": "test", "path": f"{ready}/type", "value": "Ready"},
        {"op": "replace", "path": f"{ready}/status", "value": "False"},
    ]
    status, _, _ = await client.call("watcher", "PATCH", NODE_STATUS, ops, "application/json-patch+json")
    assert status == 200
    assert conditions(api)["Ready"]["status"] == "False"
    ops[0]["value"] = "NotReady"
    status, body, _ = await client.call("watcher", "PATCH", NODE_STATUS, ops, "application/json-patch+json")
    assert (status, body["reason"]) == (422, "Invalid")
    status, body, _ = await client.call("watcher", "PATCH", NODE_STATUS, {}, "application/apply-patch+yaml")
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_labels_are_validated(api: FakeApiServer, client: Client) -> None:
    path = f"/api/v1/nodes/{NODE}"
    status, body, _ = await client.call(
        ADMIN, "PATCH", path, {"metadata": {"labels": {"a": "x" * 64}}}, MERGE
    )
    assert (status, body["details"]["causes"][0]["field"]) == (422, "metadata.labels")
    status, body, _ = await client.call(ADMIN, "PATCH", path, {"metadata": {"labels": {"a": 1}}}, MERGE)
    assert (status, body["reason"]) == (400, "BadRequest")
    assert "a" not in api.node(NODE)["metadata"]["labels"]


async def test_kubectl_reads_not_found_as_not_found(api: FakeApiServer, admin: Path) -> None:
    rc, _, err = await kubectl(admin, "get", "node", "gpu-node-9")
    assert (rc, err.strip()) == (1, 'Error from server (NotFound): nodes "gpu-node-9" not found')
    rc, _, err = await kubectl(admin, "get", "events.events.k8s.io", "-n", "ml", "nope")
    assert (rc, err.strip()) == (1, 'Error from server (NotFound): events.events.k8s.io "nope" not found')


def test_without_kubernetes_validate_the_schema_is_off_and_says_so(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)  # an import of it now fails
    with caplog.at_level(logging.WARNING, logger="testkit.kube_schemas"):
        server = FakeApiServer(short_tmp / "api", users={}, rules={}, schema=strict_schemas())
    assert server.schema_version == ""
    assert any("schema validation is OFF" in r.getMessage() for r in caplog.records)
