"""A fake Kubernetes API server that holds clients to the real server's contract, on loopback.

It serves, over HTTPS only (kubectl sends a bearer token only over TLS), the small part of the API a
node agent uses, and answers the way the real kube-apiserver does: the same status codes, `Status`
bodies (reason, message wording, details) and semantics, strictly enough that a request it accepts
the real server accepts too. The tests read what it holds back through the real kubectl.

Served: discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/events.k8s.io/v1`,
`/apis/coordination.k8s.io/v1`, legacy form: kubectl falls back to it from aggregated discovery);
Nodes (and `nodes/status`), Pods, Namespaces, Leases, and Events in one store with two views,
`events.k8s.io/v1` and core `v1`, converted as the real server converts them (`regarding` is
`involvedObject`, `note` is `message`, `reportingController` is `reportingComponent`, the
`deprecated*` fields are `source`, `count`, `firstTimestamp`, `lastTimestamp`; `series` is `series`).

What it enforces:
- bearer tokens (unknown or rotated out: 401); RBAC PolicyRules per user (403, the real message);
  the built-in "admin" user is in system:masters and may do anything;
- the official OpenAPI schema of each object it receives, strict (kubernetes_validate, the newest
  bundled version; if that package is missing, schema validation is off and a log line says so).
  As on the real server, an unknown field or a wrong JSON type is a decoding error (400 BadRequest,
  as with fieldValidation=Strict: the real server's default only warns and drops the field, which
  would hide a client bug), a rule broken is 422 Invalid with `details.causes`;
- the events.k8s.io/v1 rules of pkg/apis/core/validation/events.go: eventTime a MicroTime (exactly
  six fractional digits, else 400 as the real decoder), reportingController a qualified name,
  reportingInstance/action/reason required and at most 128, note at most 1024 bytes, type Normal or
  Warning, series.count >= 2 with a lastObservedTime, the deprecated fields unset, the namespace rule
  (a namespaced `regarding` in its own namespace, a cluster-scoped one in default or kube-system),
  and on update only `series` and metadata may change. Stricter than the real server: `regarding`
  is required;
- Node conditions: type and status required, status True/False/Unknown, one per type;
- writes: 404 NotFound, 409 AlreadyExists, 409 Conflict on a stale resourceVersion (PUT, or a patch
  carrying one), the result of a patch validated before it is stored; `/status` writes change only
  status, writes to the main resource never change status;
- PATCH: strategic merge (status.conditions merged by type), JSON merge patch (RFC 7386), JSON patch
  (RFC 6902); server-side apply is refused with 415;
- an optional admission hook (a ValidatingAdmissionPolicy stand-in) after validation: a denial is
  422 Invalid, as the real server answers a policy without an explicit `reason`.

Where it is stricter than the real server, on purpose (a client that passes here passes there):
unknown fields refused whatever `fieldValidation` says; `regarding` required; a Node condition's
status must be True/False/Unknown and its type unique; a `/status` write ignores metadata changes
(the real Node status strategy keeps labels and annotations it is sent); a request without a token
is refused (401) as with --anonymous-auth=false. Not served (405 or 415, saying so): watch,
deletecollection, server-side apply, writes to core v1 Events, Pods and Namespaces, creating Nodes
(tests set those up from Python), set-based label selectors; no managedFields, no dryRun.

Public API (`FakeApiServer`):
- `FakeApiServer(tmp_dir, *, users, rules, admission=None)`: `users` maps a handle to a user info
  (`{"username", "groups", "extra"}`; a service account's groups are filled in when absent),
  `rules` maps a handle to its grants (PolicyRule dicts, cluster-wide, or `Grant`s from
  `rules_from_manifests`), `admission(request) -> str | None` gets an AdmissionRequest-shaped dict
  (operation CREATE/UPDATE, resource, subResource, kind, name, namespace, userInfo, object,
  oldObject) and returns None to allow or the denial message;
- `await start() -> url`, `await stop()`, `url`, `ca_file`;
- `add_node(name, *, conditions=None) -> dict` (and its Lease, as the kubelet keeps one),
  `add_pod(namespace, name, node, *, phase="Running") -> dict`, `add_namespace(name)`,
  `node(name)`, `pod(namespace, name)`, `events()` (events.k8s.io form), deep copies;
- `token(user)`, `rotate_token(user, *, grace=0.0) -> str`;
- `fail_next(status, *, count=1, retry_after=None, method=None, path_prefix=None)`,
  `touch_node(name)` (a change behind the client's back: a new resourceVersion);
- `write_kubeconfig(path, user) -> Path`, `write_service_account_dir(path, user) -> Path`;
- `requests` (a list of `RequestRecord`: method, path, query, content_type, user, status),
  `count(...)`.
And `kubectl(kubeconfig, *args, deadline=20.0) -> (rc, stdout, stderr)` runs the real kubectl
without blocking the event loop the server runs in, with its discovery cache in a temp dir.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import importlib
import json
import logging
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from watcher.sim.fake_apiserver_objects import (
    CORE_EVENTS,
    KINDS,
    MERGE_KEYS,
    VERSION,
    ApiError,
    FieldError,
    Json,
    Kind,
    bad_request,
    conflict,
    core_event,
    decode,
    dig,
    field_selector,
    invalid,
    invalid_error,
    label_selector,
    micro_time,
    not_found,
    resource_list,
    timestamp,
    validate_meta,
    validate_rules,
)
from watcher.sim.fake_apiserver_patch import PatchError, json_patch, merge_patch, strategic_merge
from watcher.sim.fake_apiserver_rbac import Attributes, Grant, allows, forbidden_message, rules_from_manifests

__all__ = [
    "ADMIN",
    "FakeApiServer",
    "Grant",
    "RequestRecord",
    "kubectl",
    "micro_time",
    "rules_from_manifests",
]

log = logging.getLogger(__name__)

ADMIN = "admin"
MAX_BODY = 3 * 1024 * 1024  # the real server's request body limit
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real server's generateName uses
_UNKNOWN_FORMAT = "the body of the request was in an unknown format - accepted media types include: "
_PATCH_TYPES = (
    "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
)
# None allows; a denial is its message (str) or an object with `reason` and `code` besides.
Admission = Callable[[Json], object | None]


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


@dataclasses.dataclass
class _Fault:
    status: int
    count: int
    retry_after: int | None
    method: str | None
    path_prefix: str | None


def _make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) by the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make the fake API server's certificate")
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=fake-apiserver",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


def _load_validator() -> tuple[ModuleType | None, str]:
    try:
        module = importlib.import_module("kubernetes_validate")
        utils = importlib.import_module("kubernetes_validate.utils")
    except ImportError:
        log.warning("fake_apiserver: kubernetes_validate is not installed: schema validation is OFF")
        return None, ""
    return module, str(utils.latest_version())


class FakeApiServer:
    """The server; see the module docstring. Everything runs on the loop that calls `start`."""

    def __init__(
        self,
        tmp_dir: str | os.PathLike[str],
        *,
        users: Mapping[str, Mapping[str, Any]],
        rules: Mapping[str, Sequence[Grant | Mapping[str, Any]]],
        admission: Admission | None = None,
    ) -> None:
        self.tmp_dir = Path(tmp_dir)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.admission = admission
        self._users: dict[str, Json] = {ADMIN: {"username": "kubernetes-admin", "groups": ["system:masters"]}}
        for handle, info in users.items():
            self._users[handle] = _user_info(info)
        self._users[ADMIN]["groups"] = ["system:masters", "system:authenticated"]
        self._users[ADMIN].setdefault("extra", {})
        self._rules: dict[str, list[Grant | Mapping[str, Any]]] = {h: list(r) for h, r in rules.items()}
        # token -> (user handle, monotonic time it stops working, or None)
        self._tokens: dict[str, tuple[str, float | None]] = {}
        for handle in self._users:
            self._tokens[secrets.token_urlsafe(32)] = (handle, None)
        self._token_files: dict[str, list[Path]] = {}
        self._objects: dict[tuple[str, str, str, str], Json] = {}
        self._namespaces: set[str] = set()
        self._rv = 1
        self._faults: list[_Fault] = []
        self._conflicts: dict[str, int] = {}
        self.requests: list[RequestRecord] = []
        self._validator, self.schema_version = _load_validator()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.ca_file = self.tmp_dir / "apiserver.crt"
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.add_namespace(ns)

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> str:
        cert, key = await asyncio.to_thread(_make_certificate, self.tmp_dir)
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

    # --- scripting from tests --------------------------------------------------------------------

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _new_meta(self, name: str, namespace: str | None = None) -> Json:
        meta: Json = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        meta |= {"uid": str(uuid.uuid4()), "resourceVersion": self._bump(), "creationTimestamp": timestamp()}
        return meta

    def add_namespace(self, name: str) -> Json:
        if name not in self._namespaces:
            self._namespaces.add(name)
            meta = self._new_meta(name) | {"labels": {"kubernetes.io/metadata.name": name}}
            ns: Json = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
            ns |= {"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
            self._objects[("", "namespaces", "", name)] = ns
        return copy.deepcopy(self._objects[("", "namespaces", "", name)])

    def add_node(self, name: str, *, conditions: Sequence[Json] | None = None) -> Json:
        """A Node as a kubelet registers one (Ready by default), and its Lease."""
        now = timestamp()
        if conditions is None:
            conditions = [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ]
        stamped = [{"lastHeartbeatTime": now, "lastTransitionTime": now} | dict(c) for c in conditions]
        node: Json = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": self._new_meta(name) | {"labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "conditions": stamped,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "nodeInfo": {
                    "machineID": "0" * 32,
                    "systemUUID": str(uuid.uuid4()),
                    "bootID": str(uuid.uuid4()),
                    "kernelVersion": "6.8.0",
                    "osImage": "Ubuntu 24.04 LTS",
                    "containerRuntimeVersion": "containerd://2.0.0",
                    "kubeletVersion": "v1.32.4",
                    "kubeProxyVersion": "v1.32.4",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        self._objects[("", "nodes", "", name)] = node
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": self._new_meta(name, "kube-node-lease"),
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_time()},
        }
        self._objects[("coordination.k8s.io", "leases", "kube-node-lease", name)] = lease
        return copy.deepcopy(node)

    def add_pod(self, namespace: str, name: str, node: str, *, phase: str = "Running") -> Json:
        self.add_namespace(namespace)
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self._new_meta(name, namespace),
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "busybox:1.36"}],
                "restartPolicy": "Always",
            },
            "status": {"phase": phase, "startTime": timestamp()},
        }
        self._objects[("", "pods", namespace, name)] = pod
        return copy.deepcopy(pod)

    def node(self, name: str) -> Json:
        return copy.deepcopy(self._objects[("", "nodes", "", name)])

    def pod(self, namespace: str, name: str) -> Json:
        return copy.deepcopy(self._objects[("", "pods", namespace, name)])

    def events(self) -> list[Json]:
        """Every Event, in events.k8s.io/v1 form, in the order they were created."""
        return [
            copy.deepcopy(o)
            for (g, r, _, _), o in self._objects.items()
            if (g, r) == ("events.k8s.io", "events")
        ]

    def touch_node(self, name: str) -> Json:
        """Change something unrelated (an annotation), as another writer would: a new resourceVersion."""
        node = self._objects[("", "nodes", "", name)]
        node["metadata"].setdefault("annotations", {})["fake-apiserver/touched"] = str(self._rv)
        node["metadata"]["resourceVersion"] = self._bump()
        return copy.deepcopy(node)

    def conflict_after_reads(self, name: str, count: int = 1) -> None:
        """After each of the next `count` reads of node `name`, another writer changes it
        (`touch_node`): a client that writes what it read, with that resourceVersion, gets a real
        409 and must read again."""
        self._conflicts[name] = self._conflicts.get(name, 0) + count

    def token(self, user: str) -> str:
        """A token of `user` that works now (the newest)."""
        now = time.monotonic()
        valid = [t for t, (h, until) in self._tokens.items() if h == user and (until is None or until > now)]
        if not valid:
            raise KeyError(f"no valid token for user {user!r}")
        return valid[-1]

    def rotate_token(self, user: str, *, grace: float = 0.0) -> str:
        """A new token for `user`; the old ones stop working after `grace` seconds, as a projected
        service account token is replaced. A token file written for the user gets the new one."""
        if user not in self._users:
            raise KeyError(user)
        until = time.monotonic() + grace
        for t, (h, old_until) in list(self._tokens.items()):
            if h == user:
                if grace <= 0:
                    del self._tokens[t]
                else:
                    self._tokens[t] = (h, until if old_until is None else min(until, old_until))
        new = secrets.token_urlsafe(32)
        self._tokens[new] = (user, None)
        for path in self._token_files.get(user, []):
            _write_atomically(path, new)
        return new

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
        self._faults.append(
            _Fault(status, count, retry_after, method.upper() if method else None, path_prefix)
        )

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
        username = self._users[user]["username"]
        parts = username.split(":")
        namespace = (
            parts[2] if username.startswith("system:serviceaccount:") and len(parts) == 4 else "default"
        )
        _write_atomically(out / "token", self.token(user))
        shutil.copyfile(self.ca_file, out / "ca.crt")
        (out / "namespace").write_text(namespace)
        self._token_files.setdefault(user, []).append(out / "token")
        return out

    # --- the request path ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        user: str | None = None
        arrived = time.monotonic()
        try:
            handle = self._authenticate(request)
            user = self._users[handle]["username"] if handle else None
            response = await self._route(request, handle)
        except ApiError as err:
            response = _error_response(err)
        except Exception as err:  # a bug here must reach the test as an answer, not a dropped connection
            log.exception("fake_apiserver: %s %s failed", request.method, request.path)
            response = _error_response(ApiError(500, "InternalError", f"Internal error occurred: {err!r}"))
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

    def _authenticate(self, request: web.Request) -> str | None:
        if request.path in (
            "/version",
            "/healthz",
            "/livez",
            "/readyz",
        ):  # public, as system:public-info-viewer
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        found = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if found is None or (found[1] is not None and found[1] <= time.monotonic()):
            # Anonymous requests are refused too: a server run with --anonymous-auth=false.
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return found[0]

    def _take_fault(self, request: web.Request) -> None:
        for fault in self._faults:
            if fault.method is not None and fault.method != request.method:
                continue
            if fault.path_prefix is not None and not request.path.startswith(fault.path_prefix):
                continue
            fault.count -= 1
            if fault.count <= 0:
                self._faults.remove(fault)
            raise _fault_error(fault)

    async def _route(self, request: web.Request, handle: str | None) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if handle is not None:
            self._take_fault(request)
        if path in ("/version", "/healthz", "/livez", "/readyz"):
            return _json_response(VERSION) if path == "/version" else web.Response(text="ok")
        assert handle is not None
        discovery = self._discovery(path)
        if discovery is not None:
            return _json_response(discovery)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3 and parts[1] == "v1":
            group, rest = "", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4 and parts[2] == "v1":
            group, rest = parts[1], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3 or (group, rest[0]) not in KINDS:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind = KINDS[(group, rest[0])]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if (sub and sub not in kind.subresources) or (namespace and not kind.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if kind.namespaced and name and not namespace:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        query = dict(parse_qsl(request.query_string, keep_blank_values=True))
        verb = _verb(request.method, name, query)
        attrs = Attributes(verb, group, kind.resource, sub, namespace, name)
        if not self._authorized(handle, attrs):
            username = self._users[handle]["username"]
            details: Json = {"kind": kind.resource} | ({"name": name} if name else {})
            if group:
                details["group"] = group
            raise ApiError(403, "Forbidden", forbidden_message(username, attrs), details)
        if verb in ("get", "list"):
            return _json_response(self._read(kind, namespace, name, query))
        if verb == "delete":
            return _json_response(self._delete(kind, namespace, name))
        body = await _json_body(request, verb)
        if verb == "create":
            created = self._create(kind, namespace, body, handle)
            return _json_response(created, status=201)
        if verb == "update":
            return _json_response(self._update(kind, namespace, name, sub, body, handle))
        if verb == "patch":
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            return _json_response(self._patch(kind, namespace, name, sub, ctype, body, handle))
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not served by the fake API server")

    def _authorized(self, handle: str, a: Attributes) -> bool:
        if "system:masters" in self._users[handle].get("groups", []):
            return True
        return allows(self._rules.get(handle, []), a)

    def _discovery(self, path: str) -> Json | None:
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.removeprefix("https://")}
                ],
            }
        if path == "/apis":
            groups = sorted({k.group for k in KINDS.values() if k.group})
            gv = [{"groupVersion": f"{g}/v1", "version": "v1"} for g in groups]
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {"name": g, "versions": [v], "preferredVersion": v}
                    for g, v in zip(groups, gv, strict=True)
                ],
            }
        for group in {k.group for k in KINDS.values()}:
            prefix = f"/apis/{group}/v1" if group else "/api/v1"
            if path == prefix:
                return resource_list(group)
        return None

    # --- reads -----------------------------------------------------------------------------------

    def _stored_kind(self, kind: Kind) -> tuple[str, str]:
        # One store for events; the core view is a conversion of it.
        return ("events.k8s.io", "events") if kind is CORE_EVENTS else (kind.group, kind.resource)

    def _view(self, kind: Kind, obj: Json) -> Json:
        return core_event(obj) if kind is CORE_EVENTS else copy.deepcopy(obj)

    def _get(self, kind: Kind, namespace: str, name: str) -> Json:
        group, resource = self._stored_kind(kind)
        obj = self._objects.get((group, resource, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _read(self, kind: Kind, namespace: str, name: str, query: Mapping[str, str]) -> Json:
        if name:
            seen = self._view(kind, self._get(kind, namespace, name))
            if kind.resource == "nodes" and self._conflicts.get(name, 0) > 0:
                # Another writer, right after this read: the reader's resourceVersion is stale now.
                self._conflicts[name] -= 1
                self.touch_node(name)
            return seen
        if query.get("watch") in ("1", "true"):
            raise ApiError(405, "MethodNotAllowed", "watch is not served by the fake API server")
        match = field_selector(kind, query.get("fieldSelector", ""))
        labels = label_selector(query.get("labelSelector", ""))
        group, resource = self._stored_kind(kind)
        items = [
            self._view(kind, obj)
            for (g, r, ns, _), obj in self._objects.items()
            if (g, r) == (group, resource)
            and (not namespace or ns == namespace)
            and match(obj)
            and labels(obj)
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    # --- writes ----------------------------------------------------------------------------------

    def _create(self, kind: Kind, namespace: str, body: Json, handle: str) -> Json:
        if kind is CORE_EVENTS or kind.resource in ("nodes", "pods", "namespaces"):
            # Only what an agent writes is served; the others are set up from Python.
            raise ApiError(
                405,
                "MethodNotAllowed",
                f"create of {kind.qualified_resource} is not served by the fake API server",
            )
        if namespace and namespace not in self._namespaces:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        obj = decode(kind, body, self._validator, self.schema_version)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        if meta.get("resourceVersion"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            )
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5)
            )
        name = meta.get("name", "")
        errors = validate_meta(meta) + validate_rules(kind, obj, None)
        if errors:
            raise invalid_error(kind, name, errors)
        key = (kind.group, kind.resource, namespace, name)
        if key in self._objects:
            details = {"name": name, "group": kind.group, "kind": kind.resource}
            raise ApiError(
                409, "AlreadyExists", f'{kind.qualified_resource} "{name}" already exists', details
            )
        self._admit("CREATE", kind, "", namespace, name, obj, None, handle)
        meta |= {"uid": str(uuid.uuid4()), "resourceVersion": self._bump(), "creationTimestamp": timestamp()}
        self._objects[key] = obj
        return copy.deepcopy(obj)

    def _update(self, kind: Kind, namespace: str, name: str, sub: str, body: Json, handle: str) -> Json:
        old = self._writable(kind, namespace, name)
        new = decode(kind, body, self._validator, self.schema_version)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(_name_mismatch(meta.get("name"), name))
        if kind.namespaced and meta.get("namespace", namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(kind, name)
        return self._store(kind, namespace, name, sub, old, new, handle)

    def _patch(
        self, kind: Kind, namespace: str, name: str, sub: str, ctype: str, body: Any, handle: str
    ) -> Json:
        old = self._writable(kind, namespace, name)
        try:
            if ctype == "application/strategic-merge-patch+json":
                patched = strategic_merge(old, body, MERGE_KEYS.get(kind.kind, {}))
            elif ctype == "application/merge-patch+json":
                patched = merge_patch(old, body)
            elif ctype == "application/json-patch+json":
                patched = json_patch(old, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"{_UNKNOWN_FORMAT}{_PATCH_TYPES}")
        except PatchError as err:
            if err.code == 422:
                raise invalid_error(kind, name, [FieldError("FieldValueInvalid", "", err.message)]) from err
            raise bad_request(err.message) from err
        if not isinstance(patched, dict):
            raise bad_request("the patch does not result in an object")
        rv = dig(patched, ("metadata", "resourceVersion"))
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(kind, name)
        if dig(patched, ("metadata", "name")) != name:
            raise bad_request(_name_mismatch(dig(patched, ("metadata", "name")), name))
        new = decode(kind, patched, self._validator, self.schema_version)
        return self._store(kind, namespace, name, sub, old, new, handle)

    def _writable(self, kind: Kind, namespace: str, name: str) -> Json:
        if kind is CORE_EVENTS or kind.resource in ("pods", "namespaces"):
            raise ApiError(
                405,
                "MethodNotAllowed",
                f"writes to {kind.qualified_resource} are not served by the fake API server",
            )
        return self._get(kind, namespace, name)

    def _store(
        self, kind: Kind, namespace: str, name: str, sub: str, old: Json, new: Json, handle: str
    ) -> Json:
        if "status" in kind.subresources:
            if sub == "status":  # only status changes; the rest of the object stays as it was
                new = copy.deepcopy(old) | {"status": new.get("status", {})}
            elif "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        errors: list[FieldError] = []
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            errors.append(invalid("metadata.uid", meta["uid"], "field is immutable"))
        for field in ("uid", "creationTimestamp", "namespace", "name"):
            if field in old_meta:
                meta[field] = old_meta[field]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        errors += validate_meta(meta) + validate_rules(kind, new, old)
        if errors:
            raise invalid_error(kind, name, errors)
        self._admit("UPDATE", kind, sub, namespace, name, new, old, handle)
        if new != old:  # a no-op write keeps its resourceVersion, as on the real server
            meta["resourceVersion"] = self._bump()
            self._objects[(kind.group, kind.resource, namespace, name)] = new
        return copy.deepcopy(new)

    def _delete(self, kind: Kind, namespace: str, name: str) -> Json:
        if not name:
            raise ApiError(405, "MethodNotAllowed", "deletecollection is not served by the fake API server")
        obj = self._writable(kind, namespace, name)
        del self._objects[(kind.group, kind.resource, namespace, name)]
        self._bump()
        details: Json = {"name": name, "kind": kind.resource, "uid": obj["metadata"]["uid"]}
        if kind.group:
            details["group"] = kind.group
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _admit(
        self,
        operation: str,
        kind: Kind,
        sub: str,
        namespace: str,
        name: str,
        obj: Json,
        old: Json | None,
        handle: str,
    ) -> None:
        if self.admission is None:
            return
        info = self._users[handle]
        request: Json = {
            "operation": operation,
            "resource": {"group": kind.group, "version": "v1", "resource": kind.resource},
            "subResource": sub,
            "kind": {"group": kind.group, "version": "v1", "kind": kind.kind},
            "name": name,
            "namespace": namespace,
            "userInfo": {
                "username": info["username"],
                "groups": list(info.get("groups", [])),
                "extra": copy.deepcopy(info.get("extra", {})),
            },
            "object": copy.deepcopy(obj),
            "oldObject": copy.deepcopy(old),
        }
        denial = self.admission(request)
        if denial is not None:
            # A policy denial: admission.NewForbidden's wording, with the reason the policy's
            # validation gives (a denial with `reason` and `code`), else the one a
            # ValidatingAdmissionPolicy gives when its validation sets none (Invalid, 422).
            reason, code = getattr(denial, "reason", "Invalid"), getattr(denial, "code", 422)
            details: Json = {"name": name, "kind": kind.resource, "causes": [{"message": str(denial)}]}
            if kind.group:
                details["group"] = kind.group
            subject = f'{kind.qualified_resource} "{name}"' if name else kind.qualified_resource
            raise ApiError(code, reason, f"{subject} is forbidden: {denial}", details)

    # --- validation ------------------------------------------------------------------------------


# --- helpers ----------------------------------------------------------------------------------------


def _user_info(info: Mapping[str, Any]) -> Json:
    out: Json = {
        "username": info["username"],
        "groups": list(info.get("groups") or []),
        "extra": copy.deepcopy(dict(info.get("extra") or {})),
    }
    parts = out["username"].split(":")
    if not out["groups"] and out["username"].startswith("system:serviceaccount:") and len(parts) == 4:
        out["groups"] = [
            "system:serviceaccounts",
            f"system:serviceaccounts:{parts[2]}",
            "system:authenticated",
        ]
    elif "system:authenticated" not in out["groups"]:
        out["groups"].append("system:authenticated")
    return out


def _name_mismatch(got: Any, url_name: str) -> str:
    return f"the name of the object ({got}) does not match the name on the URL ({url_name})"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _verb(method: str, name: str, query: Mapping[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("1", "true"):
            return "watch"
        return "get" if name else "list"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, method.lower())


async def _json_body(request: web.Request, verb: str) -> Any:
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
    if verb in ("create", "update") and ctype != "application/json":
        raise ApiError(415, "UnsupportedMediaType", f"{_UNKNOWN_FORMAT}application/json")
    if ctype == "application/apply-patch+yaml":
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not served by the fake API server")
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as err:
        raise bad_request(f"error decoding patch or body: {err}") from err


def _json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """JSON with the real server's Content-Type: exactly `application/json`, no charset (clients
    compare it whole: lightkube reads an error as a Status only then)."""
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


def _error_response(err: ApiError) -> web.Response:
    headers = {}
    # The real server sends Retry-After whenever the Status carries retryAfterSeconds.
    if err.details and err.details.get("retryAfterSeconds"):
        headers["Retry-After"] = str(err.details["retryAfterSeconds"])
    return _json_response(err.status(), status=err.code, headers=headers)


def _fault_error(fault: _Fault) -> ApiError:
    status = fault.status
    if status == 429:
        wait = fault.retry_after if fault.retry_after is not None else 1
        return ApiError(
            429, "TooManyRequests", "Too many requests, please try again later.", {"retryAfterSeconds": wait}
        )
    reasons = {
        409: ("Conflict", "Operation cannot be fulfilled: the object has been modified"),
        500: ("InternalError", "Internal error occurred: injected by the fake API server"),
        503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
        504: ("Timeout", "The server was unable to return a response in the time allotted"),
        401: ("Unauthorized", "Unauthorized"),
        403: ("Forbidden", "forbidden: injected by the fake API server"),
    }
    reason, message = reasons.get(status, ("InternalError", f"injected status {status}"))
    return ApiError(
        status, reason, message, {"retryAfterSeconds": fault.retry_after} if fault.retry_after else None
    )


async def kubectl(
    kubeconfig: str | os.PathLike[str], *args: str, deadline: float = 20.0
) -> tuple[int, str, str]:
    """Run the real kubectl against the kubeconfig's server without blocking the event loop (the
    server answers on it), its discovery cache beside the kubeconfig; killed after `deadline` seconds."""
    config = Path(kubeconfig)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(config.parent),
        "KUBECONFIG": str(config),
    }
    proc = await asyncio.create_subprocess_exec(
        shutil.which("kubectl", path=env["PATH"]) or "kubectl",
        "--kubeconfig", str(config),
        "--cache-dir", str(config.parent / "kubectl-cache"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
