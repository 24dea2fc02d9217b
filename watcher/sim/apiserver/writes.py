"""The fake API server's writes: create, update (PUT), patch, delete, each held to the real
server's rules (decoded and validated, 404/409/422 as it answers them, `/status` writes changing
only status) and then to the admission hook, a ValidatingAdmissionPolicy stand-in."""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from watcher.sim.apiserver.cluster import Cluster
from watcher.sim.apiserver.decoding import SchemaCheck, decode
from watcher.sim.apiserver.errors import ApiError, FieldError, bad_request, conflict, invalid, invalid_error
from watcher.sim.apiserver.kinds import CORE_EVENTS, MERGE_KEYS, Kind
from watcher.sim.apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge
from watcher.sim.apiserver.validation import validate_meta, validate_rules
from watcher.sim.apiserver.values import Json, dig, timestamp
from watcher.sim.apiserver.wire import unsupported_patch_type

__all__ = ["Admission", "Writes"]

_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real server's generateName uses
# None allows; a denial is its message (str) or an object with `reason` and `code` besides.
Admission = Callable[[Json], object | None]


class Writes:
    """The writes to a `Cluster`, checked against `schema` when there is one, then `admission`."""

    def __init__(self, cluster: Cluster, schema: SchemaCheck | None, admission: Admission | None) -> None:
        self.cluster, self.schema, self.admission = cluster, schema, admission

    def create(self, kind: Kind, namespace: str, body: Json, user: Json) -> Json:
        if kind is CORE_EVENTS or kind.resource in ("nodes", "pods", "namespaces"):
            # Only what an agent writes is served; the others are set up from Python.
            raise ApiError(
                405,
                "MethodNotAllowed",
                f"create of {kind.qualified_resource} is not served by the fake API server",
            )
        if namespace and namespace not in self.cluster.namespaces:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        obj = decode(kind, body, self.schema)
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
        if key in self.cluster.objects:
            details = {"name": name, "group": kind.group, "kind": kind.resource}
            raise ApiError(
                409, "AlreadyExists", f'{kind.qualified_resource} "{name}" already exists', details
            )
        self._admit("CREATE", kind, "", namespace, name, obj, None, user)
        _time_added(obj, None)
        meta |= {
            "uid": str(uuid.uuid4()),
            "resourceVersion": self.cluster.bump(),
            "creationTimestamp": timestamp(),
        }
        self.cluster.objects[key] = obj
        return copy.deepcopy(obj)

    def update(self, kind: Kind, namespace: str, name: str, sub: str, body: Json, user: Json) -> Json:
        old = self._writable(kind, namespace, name)
        new = decode(kind, body, self.schema)
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
        return self._store(kind, namespace, name, sub, old, new, user)

    def patch(
        self, kind: Kind, namespace: str, name: str, sub: str, ctype: str, body: Any, user: Json
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
                raise unsupported_patch_type()
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
        new = decode(kind, patched, self.schema)
        return self._store(kind, namespace, name, sub, old, new, user)

    def _writable(self, kind: Kind, namespace: str, name: str) -> Json:
        if kind is CORE_EVENTS or kind.resource in ("pods", "namespaces"):
            raise ApiError(
                405,
                "MethodNotAllowed",
                f"writes to {kind.qualified_resource} are not served by the fake API server",
            )
        return self.cluster.get(kind, namespace, name)

    def _store(
        self, kind: Kind, namespace: str, name: str, sub: str, old: Json, new: Json, user: Json
    ) -> Json:
        if "status" in kind.subresources:
            if sub == "status":
                # Status and metadata change, the spec stays (the Node status strategy): labels
                # and annotations sent here are kept, and the admission policy sees them.
                new = copy.deepcopy(old) | {
                    "metadata": new.get("metadata", {}),
                    "status": new.get("status", {}),
                }
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
        self._admit("UPDATE", kind, sub, namespace, name, new, old, user)
        _time_added(new, old)
        if new != old:  # a no-op write keeps its resourceVersion, as on the real server
            meta["resourceVersion"] = self.cluster.bump()
            self.cluster.objects[(kind.group, kind.resource, namespace, name)] = new
        return copy.deepcopy(new)

    def delete(self, kind: Kind, namespace: str, name: str) -> Json:
        if not name:
            raise ApiError(405, "MethodNotAllowed", "deletecollection is not served by the fake API server")
        obj = self._writable(kind, namespace, name)
        del self.cluster.objects[(kind.group, kind.resource, namespace, name)]
        self.cluster.bump()
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
        user: Json,
    ) -> None:
        if self.admission is None:
            return
        request: Json = {
            "operation": operation,
            "resource": {"group": kind.group, "version": "v1", "resource": kind.resource},
            "subResource": sub,
            "kind": {"group": kind.group, "version": "v1", "kind": kind.kind},
            "name": name,
            "namespace": namespace,
            "userInfo": {
                "username": user["username"],
                "uid": user.get("uid", ""),
                "groups": list(user.get("groups", [])),
                "extra": copy.deepcopy(user.get("extra", {})),
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


def _name_mismatch(got: Any, url_name: str) -> str:
    return f"the name of the object ({got}) does not match the name on the URL ({url_name})"


def _time_added(obj: Json, old: Json | None) -> None:
    """A DeviceTaintRule's taint without `timeAdded` gets it from the server (pkg/registry/resource/
    devicetaintrule's strategy): now, or the old one's when the taint is otherwise the same."""
    if obj.get("kind") != "DeviceTaintRule":
        return
    taint = dig(obj, ("spec", "taint"))
    if not isinstance(taint, dict) or taint.get("timeAdded"):
        return
    was = dig(old, ("spec", "taint")) if old is not None else None
    same = isinstance(was, dict) and {k: v for k, v in was.items() if k != "timeAdded"} == taint
    taint["timeAdded"] = (
        was["timeAdded"] if same and isinstance(was, dict) and was.get("timeAdded") else timestamp()
    )
