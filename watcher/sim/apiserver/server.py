"""A fake Kubernetes API server that holds clients to the real server's contract, on loopback.

It serves, over HTTPS only (kubectl sends a bearer token only over TLS), the small part of the API a
node agent uses, and answers the way the real kube-apiserver does: the same status codes, `Status`
bodies (reason, message wording, details) and semantics, strictly enough that a request it accepts
the real server accepts too. The tests read what it holds back through the real kubectl.

Served: discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/events.k8s.io/v1`,
`/apis/coordination.k8s.io/v1`, `/apis/resource.k8s.io/v1`, legacy form: kubectl falls back to it
from aggregated discovery); Nodes (and `nodes/status`), Pods, Namespaces, Leases, ResourceSlices
(listed by `spec.nodeName` or `spec.driver`), DeviceTaintRules (written through the API as an
admin writes them, the taint's `timeAdded` set as the real server sets it), and Events in one
store with two views, `events.k8s.io/v1` and core `v1`, converted as the real server converts
them (`regarding` is `involvedObject`, `note` is `message`, `reportingController` is
`reportingComponent`, the `deprecated*` fields are `source`, `count`, `firstTimestamp`,
`lastTimestamp`; `series` is `series`).

What it enforces:
- bearer tokens (unknown or rotated out: 401); RBAC PolicyRules per user (403, the real message),
  checked before the URL is resolved (a resource it does not serve is a 403 to whoever may not
  have it, then a 404); the built-in "admin" user is in system:masters and may do anything;
- with a schema check plugged in (`schema`, a `SchemaCheck`: the tests pass testkit's, the official
  OpenAPI schemas through kubernetes_validate), the schema of each object it receives, strict.
  As on the real server, an unknown field or a wrong JSON type is a decoding error (400 BadRequest,
  as with fieldValidation=Strict: the real server's default only warns and drops the field, which
  would hide a client bug), a rule broken is 422 Invalid with `details.causes`;
- the events.k8s.io/v1 rules of pkg/apis/core/validation/events.go: eventTime a MicroTime (exactly
  six fractional digits, else 400 as the real decoder), reportingController a qualified name,
  reportingInstance/action/reason required and at most 128, note at most 1024 bytes, type Normal or
  Warning, series.count >= 2 with a lastObservedTime, the deprecated fields unset, the namespace rule
  (a cluster-scoped `regarding` in default or kube-system; a namespaced one anywhere, but in its
  own namespace for an Event without an eventTime), and on update only `series` and metadata may
  change; a 422 names the kind `Event` without a group, as the real server (which validates the
  core Event) does. Stricter than the real server: `regarding` is required;
- Node conditions: type and status required, status True/False/Unknown, one per type;
- writes: 404 NotFound, 409 AlreadyExists, 409 Conflict on a stale resourceVersion (PUT, or a patch
  carrying one), the result of a patch validated before it is stored; `/status` writes change
  status and metadata but never the spec, writes to the main resource never change status; what
  the real server defaults or always serializes is stored too (a Node's allocatable from its
  capacity, a condition's unset times as null, an Event's deprecatedSource and timestamps);
- answers worded as the real server's: a PATCH body that is not JSON ("invalid JSON patch"), one
  that is not an object (Go's "cannot unmarshal"), a patch type not served ("415: Unsupported Media
  Type"), a time the decoder cannot parse (Go's time.Parse words);
- PATCH: strategic merge (status.conditions merged by type, in the real server's order: an element
  new to the list first), JSON merge patch (RFC 7386), JSON patch (RFC 6902); server-side apply is
  refused with 415;
- an optional admission hook (a ValidatingAdmissionPolicy stand-in) after validation: a denial is
  422 Invalid, as the real server answers a policy without an explicit `reason`.

Where it is stricter than the real server, on purpose (a client that passes here passes there):
unknown fields refused whatever `fieldValidation` says; `regarding` required; a Node condition's
status must be True/False/Unknown and its type unique; a request without a token is refused (401)
as with --anonymous-auth=false. Not served (405 or 415, saying so): watch,
deletecollection, server-side apply, writes to core v1 Events, Pods and Namespaces, creating Nodes
(tests set those up from Python), set-based label selectors; no managedFields, no dryRun.

Public API (`FakeApiServer`):
- `FakeApiServer(tmp_dir, *, users, rules, admission=None, schema=None)`: `users` maps a handle to
  a user info (`{"username", "uid", "groups", "extra"}`; a service account's groups are filled in
  when absent; `pod_bound_user` makes the one a pod-bound token carries), `rules` maps a handle
  to its grants (PolicyRule dicts, cluster-wide, or `Grant`s from `grants_for` or testkit's
  `rules_from_manifests`), `admission(request) -> str | None` gets an
  AdmissionRequest-shaped dict (operation CREATE/UPDATE, resource, subResource, kind, name,
  namespace, userInfo, object, oldObject) and returns None to allow or the denial message;
  `schema` checks each object received (`schema_version`: which Kubernetes version's schemas, ""
  without one);
- `await start() -> url`, `await stop()`, `url`, `ca_file`;
- `add_node(name, *, conditions=None, kubelet=True) -> dict` (and its Lease, as the kubelet keeps
  one; `kubelet=False`: a bare Node, as an admin creates one), `add_user(handle, info, rules)`,
  `add_pod(namespace, name, node, *, phase="Running", uid=None) -> dict`, `add_namespace(name)`,
  `node(name)`, `pod(namespace, name)`, `events()` (events.k8s.io form), deep copies;
- `token(user)`, `rotate_token(user, *, grace=0.0) -> str`;
- `fail_next(status, *, count=1, retry_after=None, method=None, path_prefix=None)`,
  `touch_node(name)` (a change behind the client's back: a new resourceVersion);
- `write_kubeconfig(path, user) -> Path`, `write_service_account_dir(path, user) -> Path`;
- `requests` (a list of `RequestRecord`: method, path, query, content_type, user, status),
  `count(...)`.

And `kubectl(kubeconfig, *args, deadline=20.0) -> (rc, stdout, stderr)` runs the real kubectl
without blocking the event loop the server runs in, with its discovery cache in a temp dir.

Why it ships in the package: `demo --kubernetes` runs this very server, so that what the demo
shows is what the tests hold the agent to. What only the tests use (fault injection, `touch_node`,
`conflict_after_reads`, token rotation) costs nothing unless called; `requests` is also what the
demo's summary counts. What needs a test dependency stays out: the OpenAPI schemas are a plug-in
(testkit.kube_schemas), reading RBAC from YAML manifests is testkit.kube_rbac's, and the shipped
ClusterRole comes as package data (`shipped_rbac`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from watcher.sim.apiserver.certificate import make_certificate
from watcher.sim.apiserver.cluster import Cluster
from watcher.sim.apiserver.decoding import SchemaCheck
from watcher.sim.apiserver.errors import ApiError
from watcher.sim.apiserver.faults import Faults
from watcher.sim.apiserver.kinds import VERSION, discovery
from watcher.sim.apiserver.rbac import Attributes, Grant, allows, forbidden_message
from watcher.sim.apiserver.users import ADMIN, PUBLIC_PATHS, Users
from watcher.sim.apiserver.values import Json
from watcher.sim.apiserver.wire import (
    MAX_BODY,
    error_response,
    json_body,
    json_response,
    resource_path,
    target,
    verb,
)
from watcher.sim.apiserver.writes import Admission, Writes

__all__ = ["ADMIN", "FakeApiServer", "RequestRecord"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it."""

    method: str
    path: str
    query: str
    content_type: str
    user: str | None  # the username, None when not authenticated
    status: int
    at: float = 0.0  # time.monotonic() when it arrived


class FakeApiServer:
    """The server; see the module docstring. Everything runs on the loop that calls `start`."""

    def __init__(
        self,
        tmp_dir: str | os.PathLike[str],
        *,
        users: Mapping[str, Mapping[str, Any]],
        rules: Mapping[str, Sequence[Grant | Mapping[str, Any]]],
        admission: Admission | None = None,
        schema: SchemaCheck | None = None,
    ) -> None:
        self.tmp_dir = Path(tmp_dir)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._users = Users(users)
        self._rules: dict[str, list[Grant | Mapping[str, Any]]] = {h: list(r) for h, r in rules.items()}
        self._cluster = Cluster()
        self._writes = Writes(self._cluster, schema, admission)
        self._faults = Faults()
        self.schema_version = schema.version if schema is not None else ""
        self.requests: list[RequestRecord] = []
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.ca_file = self.tmp_dir / "apiserver.crt"

    @property
    def admission(self) -> Admission | None:
        return self._writes.admission

    @admission.setter
    def admission(self, hook: Admission | None) -> None:
        self._writes.admission = hook

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> str:
        cert, key = await asyncio.to_thread(make_certificate, self.tmp_dir)
        self.ca_file = cert
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock, ssl_context=ctx).start()
        self.url = f"https://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- scripting from tests and the demo -------------------------------------------------------

    def add_namespace(self, name: str) -> Json:
        return self._cluster.add_namespace(name)

    def add_node(self, name: str, *, conditions: Sequence[Json] | None = None, kubelet: bool = True) -> Json:
        """A Node as a kubelet registers one (Ready by default), and its Lease; without `kubelet`,
        as an admin creates one by name and sets its conditions."""
        return self._cluster.add_node(name, conditions=conditions, kubelet=kubelet)

    def add_user(
        self, handle: str, info: Mapping[str, Any], rules: Sequence[Grant | Mapping[str, Any]]
    ) -> None:
        """Another user after the start, with its grants: one whose user info names objects made
        since (a pod-bound token's node and pod uids, `pod_bound_user`)."""
        self._users.add(handle, info)
        self._rules[handle] = list(rules)

    def add_pod(
        self, namespace: str, name: str, node: str, *, phase: str = "Running", uid: str | None = None
    ) -> Json:
        return self._cluster.add_pod(namespace, name, node, phase=phase, uid=uid)

    def put_resource_slice(self, body: Json) -> Json:
        """A ResourceSlice (`metadata.name`, `spec`) as a DRA driver publishes one, replaced whole
        if it is there: its devices' taints are what the agent reads."""
        return self._cluster.put_resource_slice(body)

    def delete_resource_slice(self, name: str) -> None:
        self._cluster.delete_resource_slice(name)

    def node(self, name: str) -> Json:
        return self._cluster.node(name)

    def pod(self, namespace: str, name: str) -> Json:
        return self._cluster.pod(namespace, name)

    def events(self) -> list[Json]:
        """Every Event, in events.k8s.io/v1 form, in the order they were created."""
        return self._cluster.events()

    def touch_node(self, name: str) -> Json:
        """Change something unrelated (an annotation), as another writer would: a new resourceVersion."""
        return self._cluster.touch_node(name)

    def conflict_after_reads(self, name: str, count: int = 1) -> None:
        """After each of the next `count` reads of node `name`, another writer changes it
        (`touch_node`): a client that writes what it read, with that resourceVersion, gets a real
        409 and must read again."""
        self._cluster.conflict_after_reads(name, count)

    def token(self, user: str) -> str:
        """A token of `user` that works now (the newest)."""
        return self._users.token(user)

    def rotate_token(self, user: str, *, grace: float = 0.0) -> str:
        """A new token for `user`; the old ones stop working after `grace` seconds, as a projected
        service account token is replaced. A token file written for the user gets the new one."""
        return self._users.rotate_token(user, grace=grace)

    def fail_next(
        self,
        status: int,
        *,
        count: int = 1,
        retry_after: int | None = None,
        method: str | None = None,
        path_prefix: str | None = None,
    ) -> None:
        """Answer the next `count` authenticated requests that match with `status` (a Status body
        with the real reason for it; 429 carries Retry-After)."""
        self._faults.add(status, count=count, retry_after=retry_after, method=method, path_prefix=path_prefix)

    def count(self, *, method: str | None = None, path_prefix: str = "", status: int | None = None) -> int:
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method)
            and r.path.startswith(path_prefix)
            and (status is None or r.status == status)
        )

    def write_kubeconfig(self, path: str | os.PathLike[str], user: str) -> Path:
        """A kubeconfig (JSON, which kubectl reads as YAML) for `user` with its current token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": user, "user": {"token": self.token(user)}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": user, "namespace": "default"}}
            ],
            "current-context": "fake",
        }
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(config, indent=1))
        return out

    def write_service_account_dir(self, path: str | os.PathLike[str], user: str) -> Path:
        """`token`, `ca.crt` and `namespace`, as the kubelet projects them into a pod."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self._users.write_token_file(out / "token", user)
        shutil.copyfile(self.ca_file, out / "ca.crt")
        (out / "namespace").write_text(self._users.namespace_of(user))
        return out

    # --- the request path ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        user: str | None = None
        arrived = time.monotonic()
        try:
            handle = self._users.authenticate(request.path, request.headers.get("Authorization", ""))
            user = self._users.info[handle]["username"] if handle else None
            response = await self._route(request, handle)
        except ApiError as err:
            response = error_response(err)
        except Exception as err:  # a bug here must reach the test as an answer, not a dropped connection
            log.exception("fake apiserver: %s %s failed", request.method, request.path)
            response = error_response(ApiError(500, "InternalError", f"Internal error occurred: {err!r}"))
        self.requests.append(
            RequestRecord(
                request.method,
                request.path,
                request.query_string,
                request.headers.get("Content-Type", ""),
                user,
                response.status,
                arrived,
            )
        )
        return response

    async def _route(self, request: web.Request, handle: str | None) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if handle is not None:
            self._faults.take(request.method, request.path)
        if path in PUBLIC_PATHS:
            return json_response(VERSION) if path == "/version" else web.Response(text="ok")
        assert handle is not None
        document = discovery(path, self.url)
        if document is not None:
            return json_response(document)
        query = dict(parse_qsl(request.query_string, keep_blank_values=True))
        asked = resource_path(path)
        if asked is not None:
            # Authorized before the URL is resolved: a resource not served is a 403 to whoever
            # may not have it, as on the real server, and a 404 only to whoever may.
            group, resource, namespace, name, sub = asked
            action = verb(request.method, name, query)
            self._authorize(handle, Attributes(action, group, resource, sub, namespace, name))
        where = target(path)
        kind, namespace, name, sub = where.kind, where.namespace, where.name, where.sub
        action = verb(request.method, name, query)
        if action in ("get", "list"):
            return json_response(self._cluster.read(kind, namespace, name, query))
        if action == "delete":
            return json_response(self._writes.delete(kind, namespace, name))
        body = await json_body(request, action)
        user = self._users.info[handle]
        if action == "create":
            return json_response(self._writes.create(kind, namespace, body, user), status=201)
        if action == "update":
            return json_response(self._writes.update(kind, namespace, name, sub, body, user))
        if action == "patch":
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            return json_response(self._writes.patch(kind, namespace, name, sub, ctype, body, user))
        raise ApiError(405, "MethodNotAllowed", f"{action} is not served by the fake API server")

    def _authorize(self, handle: str, a: Attributes) -> None:
        """403, worded as the real RBAC authorizer words it, unless the user may."""
        if "system:masters" in self._users.info[handle].get("groups", []):
            return
        if allows(self._rules.get(handle, []), a):
            return
        username = self._users.info[handle]["username"]
        details: Json = {"kind": a.resource} | ({"name": a.name} if a.name else {})
        if a.group:
            details["group"] = a.group
        raise ApiError(403, "Forbidden", forbidden_message(username, a), details)
