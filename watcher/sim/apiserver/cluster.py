"""What the fake API server holds: its objects under one resourceVersion counter, the Nodes,
Pods and Namespaces set up from Python (the kubelet's and the scheduler's part), and reads, a get
or a list with its selectors, in the view asked for (an Event in core v1 or events.k8s.io form)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence

from watcher.sim.apiserver.decoding import defaults
from watcher.sim.apiserver.errors import ApiError, not_found
from watcher.sim.apiserver.kinds import CORE_EVENTS, KINDS, Kind, core_event
from watcher.sim.apiserver.selectors import field_selector, label_selector
from watcher.sim.apiserver.values import Json, micro_time, timestamp

__all__ = ["Cluster"]


class Cluster:
    """The objects, keyed by (group, resource, namespace, name); Events stored in their
    events.k8s.io/v1 form."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], Json] = {}
        self.namespaces: set[str] = set()
        self.rv = 1
        self._conflicts: dict[str, int] = {}
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.add_namespace(ns)

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def new_meta(self, name: str, namespace: str | None = None) -> Json:
        meta: Json = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        meta |= {"uid": str(uuid.uuid4()), "resourceVersion": self.bump(), "creationTimestamp": timestamp()}
        return meta

    def add_namespace(self, name: str) -> Json:
        if name not in self.namespaces:
            self.namespaces.add(name)
            meta = self.new_meta(name) | {"labels": {"kubernetes.io/metadata.name": name}}
            ns: Json = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
            ns |= {"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
            self.objects[("", "namespaces", "", name)] = ns
        return copy.deepcopy(self.objects[("", "namespaces", "", name)])

    def add_node(self, name: str, *, conditions: Sequence[Json] | None = None, kubelet: bool = True) -> Json:
        """A Node as a kubelet registers one (Ready by default), and its Lease; without `kubelet`,
        as an admin creates one by name and then sets its conditions (unstamped): no labels,
        addresses, capacity or node info, and no Lease."""
        if not kubelet:
            bare: Json = {"apiVersion": "v1", "kind": "Node", "metadata": self.new_meta(name), "spec": {}}
            bare["status"] = {"conditions": [dict(c) for c in conditions or []]}
            self.objects[("", "nodes", "", name)] = defaults(KINDS[("", "nodes")], bare)
            return copy.deepcopy(bare)
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
            "metadata": self.new_meta(name) | {"labels": {"kubernetes.io/hostname": name}},
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
        self.objects[("", "nodes", "", name)] = node
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": self.new_meta(name, "kube-node-lease"),
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_time()},
        }
        self.objects[("coordination.k8s.io", "leases", "kube-node-lease", name)] = lease
        return copy.deepcopy(node)

    def add_pod(
        self, namespace: str, name: str, node: str, *, phase: str = "Running", uid: str | None = None
    ) -> Json:
        self.add_namespace(namespace)
        meta = self.new_meta(name, namespace)
        if uid is not None:  # the pod the kubelet runs under that uid (the two agree in a cluster)
            meta["uid"] = uid
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "busybox:1.36"}],
                "restartPolicy": "Always",
            },
            "status": {"phase": phase, "startTime": timestamp()},
        }
        self.objects[("", "pods", namespace, name)] = pod
        return copy.deepcopy(pod)

    def put_resource_slice(self, body: Json) -> Json:
        """A ResourceSlice as a DRA driver publishes (or republishes) one: stored whole, by name."""
        name = body["metadata"]["name"]
        key = ("resource.k8s.io", "resourceslices", "", name)
        old = self.objects.get(key)
        meta = self.new_meta(name) if old is None else dict(old["metadata"], resourceVersion=self.bump())
        obj: Json = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"} | copy.deepcopy(body)
        obj["metadata"] = dict(body["metadata"]) | meta
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def delete_resource_slice(self, name: str) -> None:
        self.objects.pop(("resource.k8s.io", "resourceslices", "", name), None)

    def node(self, name: str) -> Json:
        return copy.deepcopy(self.objects[("", "nodes", "", name)])

    def pod(self, namespace: str, name: str) -> Json:
        return copy.deepcopy(self.objects[("", "pods", namespace, name)])

    def events(self) -> list[Json]:
        """Every Event, in events.k8s.io/v1 form, in the order they were created."""
        return [
            copy.deepcopy(o)
            for (g, r, _, _), o in self.objects.items()
            if (g, r) == ("events.k8s.io", "events")
        ]

    def touch_node(self, name: str) -> Json:
        """Change something unrelated (an annotation), as another writer would: a new resourceVersion."""
        node = self.objects[("", "nodes", "", name)]
        node["metadata"].setdefault("annotations", {})["fake-apiserver/touched"] = str(self.rv)
        node["metadata"]["resourceVersion"] = self.bump()
        return copy.deepcopy(node)

    def conflict_after_reads(self, name: str, count: int = 1) -> None:
        """After each of the next `count` reads of node `name`, another writer changes it
        (`touch_node`): a client that writes what it read, with that resourceVersion, gets a real
        409 and must read again."""
        self._conflicts[name] = self._conflicts.get(name, 0) + count

    def get(self, kind: Kind, namespace: str, name: str) -> Json:
        group, resource = _stored_kind(kind)
        obj = self.objects.get((group, resource, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def read(self, kind: Kind, namespace: str, name: str, query: Mapping[str, str]) -> Json:
        if name:
            seen = _view(kind, self.get(kind, namespace, name))
            if kind.resource == "nodes" and self._conflicts.get(name, 0) > 0:
                # Another writer, right after this read: the reader's resourceVersion is stale now.
                self._conflicts[name] -= 1
                self.touch_node(name)
            return seen
        if query.get("watch") in ("1", "true"):
            raise ApiError(405, "MethodNotAllowed", "watch is not served by the fake API server")
        match = field_selector(kind, query.get("fieldSelector", ""))
        labels = label_selector(query.get("labelSelector", ""))
        group, resource = _stored_kind(kind)
        items = [
            _view(kind, obj)
            for (g, r, ns, _), obj in self.objects.items()
            if (g, r) == (group, resource)
            and (not namespace or ns == namespace)
            and match(obj)
            and labels(obj)
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }


def _stored_kind(kind: Kind) -> tuple[str, str]:
    # One store for events; the core view is a conversion of it.
    return ("events.k8s.io", "events") if kind is CORE_EVENTS else (kind.group, kind.resource)


def _view(kind: Kind, obj: Json) -> Json:
    return core_event(obj) if kind is CORE_EVENTS else copy.deepcopy(obj)
