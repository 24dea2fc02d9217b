"""The kinds the fake API server serves, the discovery documents that list them, and the core v1
view of an events.k8s.io/v1 Event (pkg/apis/events/v1/conversion.go): one store, two views."""

from __future__ import annotations

import copy
import dataclasses

from watcher.sim.apiserver.patch import MergeKeys
from watcher.sim.apiserver.values import Json

__all__ = [
    "CORE_EVENTS",
    "DEVICE_TAINT_RULES",
    "EVENTS",
    "KINDS",
    "MERGE_KEYS",
    "RESOURCE_SLICES",
    "VERSION",
    "Kind",
    "core_event",
    "discovery",
    "resource_list",
]


@dataclasses.dataclass(frozen=True)
class Kind:
    group: str
    resource: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified_resource(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
KINDS: dict[tuple[str, str], Kind] = {
    k: v
    for v in (
        Kind("", "nodes", "Node", False, _ALL_VERBS, ("no",), ("status",)),
        Kind("", "pods", "Pod", True, _ALL_VERBS, ("po",)),
        Kind(
            "",
            "namespaces",
            "Namespace",
            False,
            ("create", "delete", "get", "list", "patch", "update"),
            ("ns",),
        ),
        Kind("", "events", "Event", True, _ALL_VERBS, ("ev",)),
        Kind("events.k8s.io", "events", "Event", True, _ALL_VERBS, ("ev",)),
        Kind("coordination.k8s.io", "leases", "Lease", True, _ALL_VERBS),
        # DRA drivers publish their devices (and the devices' taints) in cluster-scoped slices.
        Kind("resource.k8s.io", "resourceslices", "ResourceSlice", False, _ALL_VERBS),
        # An admin's taints on DRA devices, never written into the slices (cluster-scoped).
        Kind("resource.k8s.io", "devicetaintrules", "DeviceTaintRule", False, _ALL_VERBS, (), ("status",)),
    )
    for k in [(v.group, v.resource)]
}
EVENTS = KINDS[("events.k8s.io", "events")]
RESOURCE_SLICES = KINDS[("resource.k8s.io", "resourceslices")]
DEVICE_TAINT_RULES = KINDS[("resource.k8s.io", "devicetaintrules")]
CORE_EVENTS = KINDS[("", "events")]

# Lists merged by key under a strategic merge patch (the patchMergeKey tags of k8s.io/api).
MERGE_KEYS: dict[str, MergeKeys] = {
    "Node": {
        ("metadata", "ownerReferences"): "uid",
        ("metadata", "finalizers"): "",
        ("spec", "taints"): "key",
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
        ("status", "volumesAttached"): "name",
    },
    "Event": {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""},
    "Lease": {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""},
    # spec.devices is an atomic list (listType=atomic): a patch replaces it whole.
    "ResourceSlice": {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""},
    "DeviceTaintRule": {
        ("metadata", "ownerReferences"): "uid",
        ("metadata", "finalizers"): "",
        ("status", "conditions"): "type",
    },
}


def resource_list(group: str) -> Json:
    resources: list[Json] = []
    for k in KINDS.values():
        if k.group != group:
            continue
        entry: Json = {
            "name": k.resource,
            "singularName": k.kind.lower(),
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": list(k.verbs),
        }
        if k.short_names:
            entry["shortNames"] = list(k.short_names)
        resources.append(entry)
        for sub in k.subresources:
            resources.append(
                {
                    "name": f"{k.resource}/{sub}",
                    "singularName": "",
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1" if group else "v1",
        "resources": resources,
    }


VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.8",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def core_event(event: Json) -> Json:
    """The core v1 view of a stored events.k8s.io/v1 Event (pkg/apis/events/v1/conversion.go)."""
    out: Json = {"kind": "Event", "apiVersion": "v1", "metadata": copy.deepcopy(event.get("metadata", {}))}
    out["involvedObject"] = copy.deepcopy(event.get("regarding", {}))
    out["reason"] = event.get("reason", "")
    out["message"] = event.get("note", "")
    out["source"] = copy.deepcopy(event.get("deprecatedSource", {}))
    out["firstTimestamp"] = event.get("deprecatedFirstTimestamp")
    out["lastTimestamp"] = event.get("deprecatedLastTimestamp")
    if event.get("deprecatedCount"):
        out["count"] = event["deprecatedCount"]
    if event.get("type"):
        out["type"] = event["type"]
    out["eventTime"] = event.get("eventTime")
    for field in ("series", "related"):
        if field in event:
            out[field] = copy.deepcopy(event[field])
    if event.get("action"):
        out["action"] = event["action"]
    out["reportingComponent"] = event.get("reportingController", "")
    out["reportingInstance"] = event.get("reportingInstance", "")
    return out


def discovery(path: str, url: str) -> Json | None:
    """The legacy discovery document at `path` (kubectl falls back to it from aggregated
    discovery), None when `path` is not one."""
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": url.removeprefix("https://")}
            ],
        }
    if path == "/apis":
        groups = sorted({k.group for k in KINDS.values() if k.group})
        gv = [{"groupVersion": f"{g}/v1", "version": "v1"} for g in groups]
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": g, "versions": [v], "preferredVersion": v} for g, v in zip(groups, gv, strict=True)
            ],
        }
    for group in {k.group for k in KINDS.values()}:
        prefix = f"/apis/{group}/v1" if group else "/api/v1"
        if path == prefix:
            return resource_list(group)
    return None
