"""The same requests to both API servers: the real one (kube-testcluster, the shipped RBAC and
admission policy in force) and our fake (watcher/sim/apiserver/ with testkit's strict schemas and
admission policy), set up alike, each request sent with the same identity to both.

`real_side(...)` and `fake_side(...)` make a `Side`: where the server is, a bearer token per
identity ("admin", "agent" (a token bound to the agent's Pod on the test's Node), "unbound" (the
same service account, bound to nothing), "viewer" (granted nothing), "nobody" (a token no server
issued)) and the names and uids a request template is filled with. The names are the same on both
sides; the uids and resourceVersions are each server's own, so `normalised` writes them back as
their template names and `comparable` reduces an answer to what both servers must agree on.
`play(side, row)` runs one `Row` (a `Call`, what is set up before it, what is read back after) on
one side; a test compares what it gives for the two.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from testkit.admission_policy import review
from testkit.kube_reporting import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    READY,
    Answer,
    Placement,
    bearer_request,
    place_agent,
)
from testkit.kube_schemas import strict_schemas
from testkit.kube_testcluster import KubeTestCluster
from watcher.sim.apiserver import ADMIN, FakeApiServer, grants_for, pod_bound_user, shipped_rbac

__all__ = [
    "AGENT_USER",
    "WORKLOAD",
    "Call",
    "Row",
    "Side",
    "both_sides",
    "comparable",
    "fake_side",
    "fill",
    "identity",
    "normalised",
    "play",
    "real_side",
]

AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
WORKLOAD = "trainer"  # the Pod the agent reports on, in the placement's namespace
_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Where a policy message lists what an update touches: CEL iterates a map in no fixed order.
_LISTED = re.compile(r"(this update (?:changes |adds, changes or removes: ))(.*)$")


@dataclass
class Side:
    """One API server, its identities' tokens, and the values a request template names."""

    name: str
    url: str
    ca_file: Path
    tokens: dict[str, str]
    values: dict[str, str] = field(default_factory=dict)
    users_seen: list[dict[str, Any]] = field(default_factory=list)  # the fake's: userInfo admitted

    def send(self, who: str, method: str, path: str, body: Any = None, content_type: str = "") -> Answer:
        """One request as `who`, its template filled; `body` bytes are sent as they are."""
        path = fill(path, self.values)
        data = (
            body
            if isinstance(body, bytes)
            else None
            if body is None
            else json.dumps(fill(body, self.values)).encode()
        )
        return bearer_request(self.url, self.ca_file, self.tokens[who], method, path, data, content_type)


def fill(template: Any, values: dict[str, str]) -> Any:
    """`template` with each `{name}` in its strings replaced by the value of that name."""
    if isinstance(template, str):
        return re.sub(r"\{([a-z_0-9]+)\}", lambda m: values.get(m.group(1), m.group(0)), template)
    if isinstance(template, dict):
        return {fill(k, values): fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


def normalised(value: Any, values: dict[str, str]) -> Any:
    """`value` with this side's own values written back as `{name}`, the uids, resourceVersions
    and creation times the server made up as their shape, and managedFields left out (the fake
    keeps none)."""
    # Only the uids differ between the sides: the names are the same on both.
    by_value = {v: f"{{{k}}}" for k, v in values.items() if v and k.endswith("_uid")}
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "managedFields":
                continue
            if key == "uid" and isinstance(item, str) and item not in by_value and _UID.fullmatch(item):
                out[key] = "<uid>"
            elif key == "resourceVersion" and isinstance(item, str) and item.isdigit():
                out[key] = "<resourceVersion>"
            elif key == "creationTimestamp" and isinstance(item, str) and _TIME.fullmatch(item):
                out[key] = "<time>"
            else:
                out[key] = normalised(item, values)
        return out
    if isinstance(value, list):
        return [normalised(v, values) for v in value]
    if isinstance(value, str):
        for raw in sorted(by_value, key=len, reverse=True):
            value = value.replace(raw, by_value[raw])
        listed = _LISTED.search(value)
        if listed:
            value = value[: listed.start(2)] + ", ".join(sorted(listed.group(2).split(", ")))
        return value
    return value


def comparable(answer: Answer, values: dict[str, str]) -> Any:
    """What both servers must agree on in an answer: the code, and the body normalised; of a Node
    only its conditions (the rest is each side's set-up: the real one has a kubectl annotation,
    the not-ready taint, an empty nodeInfo)."""
    body = answer.body
    if body.get("kind") == "Node":
        body = {"kind": "Node", "conditions": body.get("status", {}).get("conditions")}
    elif body.get("kind") == "Pod":
        meta, spec = body.get("metadata", {}), body.get("spec", {})
        body = {
            "kind": "Pod",
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
            "nodeName": spec.get("nodeName"),
        }
    return answer.status, normalised(body, values)


@dataclass(frozen=True)
class Call:
    """One request as an identity sends it: a template (`{node}`, `{rv}`, ...) filled per side."""

    who: str
    method: str
    path: str
    body: Any = None
    content_type: str = ""


@dataclass(frozen=True)
class Row:
    """One request, what the real server answers (its code, words in its message), what is set
    up before it and which objects are read back after (as the admin)."""

    id: str
    call: Call
    status: int
    says: str = ""
    before: tuple[Call, ...] = ()
    stored: tuple[str, ...] = ()
    # A kept difference: the fake refuses (422) what the real server takes, and why.
    fake_stricter: str = ""


def _resource_version(side: Side) -> str:
    answer = side.send("admin", "GET", "/api/v1/nodes/{node}")
    return str(answer.body["metadata"]["resourceVersion"])


def play(side: Side, row: Row) -> dict[str, Any]:
    """The row on one side: its set-up, the request, and what is stored before and after."""
    side.values["rv0"] = _resource_version(side)
    for call in row.before:
        done = side.send(call.who, call.method, call.path, call.body, call.content_type)
        assert done.status in (200, 201), (side.name, call, done)
    side.values["rv"] = _resource_version(side)
    before = [side.send("admin", "GET", path) for path in row.stored]
    answer = side.send(row.call.who, row.call.method, row.call.path, row.call.body, row.call.content_type)
    after = [side.send("admin", "GET", path) for path in row.stored]
    return {
        "status": answer.status,
        "message": answer.message,
        "answer": comparable(answer, side.values),
        "stored": [comparable(a, side.values) for a in after],
        "changed": [_version(b) != _version(a) for b, a in zip(before, after, strict=True)],
    }


def _version(answer: Any) -> tuple[int, str]:
    return answer.status, str(answer.body.get("metadata", {}).get("resourceVersion", ""))


def _token(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


def real_side(cluster: KubeTestCluster, placed: Placement, other: str, unbound: Path) -> Side:
    """The real server with `placed` (the agent's Node and Pod), the workload Pod beside it and a
    second Node `other`, both Ready, made with the admin's requests."""
    admin = _token(cluster.admin_kubeconfig)
    side = Side(
        "real",
        cluster.server,
        cluster.ca_file,
        {
            "admin": admin,
            "agent": _token(placed.kubeconfig),
            "unbound": _token(unbound),
            "viewer": _token(cluster.kubeconfig("viewer")),
            "nobody": secrets.token_urlsafe(32),
        },
    )
    workload = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": WORKLOAD},
        "spec": {
            "nodeName": placed.node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "pod-resources-watcher:test"}],
        },
    }
    made = [
        side.send("admin", "POST", f"/api/v1/namespaces/{placed.namespace}/pods", workload),
        side.send("admin", "POST", "/api/v1/nodes", {"metadata": {"name": other}}),
        side.send(
            "admin",
            "PATCH",
            f"/api/v1/nodes/{other}/status",
            {"status": {"conditions": [READY]}},
            "application/strategic-merge-patch+json",
        ),
    ]
    assert all(a.status in (200, 201) for a in made), made
    pod = side.send("admin", "GET", f"/api/v1/namespaces/{placed.namespace}/pods/{WORKLOAD}").body
    node = side.send("admin", "GET", f"/api/v1/nodes/{placed.node}").body
    agent_pod = side.send("admin", "GET", f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods/{placed.pod}").body
    side.values = _values(placed, other, node["metadata"]["uid"], pod["metadata"]["uid"])
    side.values["agent_pod_uid"] = agent_pod["metadata"]["uid"]
    return side


def fake_side(fake: FakeApiServer, placed: Placement, other: str, users_seen: list[dict[str, Any]]) -> Side:
    """The fake (started), set up as `real_side` sets up the real one: the same names, bare Nodes
    with the admin's Ready, the agent's identities as the real server's tokens carry them;
    `users_seen` is where its admission hook notes each request's userInfo."""
    for namespace in (AGENT_NAMESPACE, placed.namespace):
        fake.add_namespace(namespace)
    node = fake.add_node(placed.node, conditions=[READY], kubelet=False)
    fake.add_node(other, conditions=[READY], kubelet=False)
    agent_pod = fake.add_pod(AGENT_NAMESPACE, placed.pod, placed.node, phase="Pending")
    pod = fake.add_pod(placed.namespace, WORKLOAD, placed.node, phase="Pending")
    grants = grants_for(shipped_rbac(), service_account=AGENT_SERVICE_ACCOUNT, namespace=AGENT_NAMESPACE)
    bound = pod_bound_user(
        AGENT_USER,
        node=placed.node,
        pod=placed.pod,
        node_uid=node["metadata"]["uid"],
        pod_uid=agent_pod["metadata"]["uid"],
    )
    fake.add_user("agent", bound, grants)
    unbound = {
        "username": AGENT_USER,
        "uid": bound["uid"],
        "extra": {_CREDENTIAL_ID: [f"JTI={uuid.uuid4()}"]},
    }
    fake.add_user("unbound", unbound, grants)
    fake.add_user("viewer", {"username": "viewer", "uid": "viewer", "groups": ["viewers"]}, [])
    tokens = {who: fake.token(who) for who in ("agent", "unbound", "viewer")}
    tokens |= {"admin": fake.token(ADMIN), "nobody": secrets.token_urlsafe(32)}
    side = Side("fake", fake.url, fake.ca_file, tokens, users_seen=users_seen)
    side.values = _values(placed, other, node["metadata"]["uid"], pod["metadata"]["uid"])
    side.values["agent_pod_uid"] = agent_pod["metadata"]["uid"]
    return side


@asynccontextmanager
async def both_sides(
    cluster: KubeTestCluster, tag: str, unbound: Path, fake_dir: Path
) -> AsyncIterator[dict[str, Side]]:
    """The agent placed on the real server (its Node named after `tag`), and a fake started in
    `fake_dir` set up alike, with testkit's strict schemas and the shipped admission policy:
    {"real": ..., "fake": ...}; the fake stops when the block ends."""
    placed = await asyncio.to_thread(place_agent, cluster, tag)
    other = f"other-{placed.node}"
    real = await asyncio.to_thread(real_side, cluster, placed, other, unbound)
    seen: list[dict[str, Any]] = []

    def admission(request: dict[str, Any]) -> object | None:
        seen.append(request["userInfo"])  # who asked, as the fake's admission sees it
        return review(request)

    fake = FakeApiServer(fake_dir, users={}, rules={}, admission=admission, schema=strict_schemas())
    await fake.start()
    try:
        yield {"real": real, "fake": fake_side(fake, placed, other, seen)}
    finally:
        await fake.stop()


def identity(user: dict[str, Any], side: Side) -> dict[str, Any]:
    """What a user info must agree on between the sides: the username, groups and extra (uids as
    their template names, the credential id as its kind), and that it has a uid."""
    extra = {k: normalised(v, side.values) for k, v in user.get("extra", {}).items()}
    if _CREDENTIAL_ID in extra:
        extra[_CREDENTIAL_ID] = [v.split("=")[0] for v in user["extra"][_CREDENTIAL_ID]]
    return {
        "username": user["username"],
        "uid": bool(user.get("uid")),
        "groups": user["groups"],
        "extra": extra,
    }


def _values(placed: Placement, other: str, node_uid: str, pod_uid: str) -> dict[str, str]:
    return {
        "node": placed.node,
        "other": other,
        "namespace": placed.namespace,
        "agent_pod": placed.pod,
        "node_uid": node_uid,
        "pod_uid": pod_uid,
    }
