"""The fake node's pods as the kubelet's Pods API sends them: k8s.io.api.core.v1.Pod messages.

What the kubelet puts there and the fake copies: the pod's metadata (uid, labels, owner references,
creation time), each container with its extended resources as limits and requests (equal: those
cannot be overcommitted) and its DRA claims, the node name, the phase, and per container the
kubelet's own verdict on each device-plugin device it holds (`allocatedResourcesStatus`, the
ResourceHealthStatus gate, on by default since 1.36). That verdict is the device manager's: Healthy
or Unhealthy as its plugin last said, and Healthy for a device the plugin no longer lists at all (the
manager finds no health to copy and keeps its default). Init containers get none.

The kubelet lists resources and devices in Go map order; the fake sorts them, so that one pod's
bytes change only when the pod does (which is how the fake's watch finds its MODIFIED events).
"""

from __future__ import annotations

from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.sim.fake_node import FakeContainer, FakeNode, FakePod

__all__ = ["HEALTHY", "UNHEALTHY", "deleted_pod", "pod_object", "pod_objects"]

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def _health(node: FakeNode, resource: str, device_id: str) -> str:
    device = node.devices.get((resource, device_id))
    return UNHEALTHY if device is not None and not device.healthy else HEALTHY


def _container(c: FakeContainer) -> core_v1_pb2.Container:
    out = core_v1_pb2.Container(name=c.name)
    resources = out.resources
    for resource, ids in sorted(c.devices.items()):
        if ids:
            resources.limits[resource].string = str(len(ids))
            resources.requests[resource].string = str(len(ids))
    for claim in c.claims:
        resources.claims.add(name=claim.name)
    return out


def _status(node: FakeNode, c: FakeContainer) -> core_v1_pb2.ContainerStatus:
    out = core_v1_pb2.ContainerStatus(name=c.name, ready=True, started=True, restartCount=0)
    for resource, ids in sorted(c.devices.items()):
        if not ids:
            continue
        status = out.allocatedResourcesStatus.add(name=resource)
        for device_id in sorted(ids):
            status.resources.add(resourceID=device_id, health=_health(node, resource, device_id))
    return out


def pod_object(node: FakeNode, pod: FakePod, node_name: str) -> core_v1_pb2.Pod:
    """`pod` as the Pods API's ListPods, GetPod and ADDED/MODIFIED events carry it."""
    meta = meta_v1_pb2.ObjectMeta(
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        creationTimestamp=meta_v1_pb2.Time(seconds=int(pod.created)),
    )
    for key, value in sorted(pod.labels.items()):
        meta.labels[key] = value
    for owner in pod.owners:
        meta.ownerReferences.add(
            apiVersion=owner.api_version,
            kind=owner.kind,
            name=owner.name,
            uid=owner.uid,
            controller=owner.controller,
            blockOwnerDeletion=True,
        )
    spec = core_v1_pb2.PodSpec(nodeName=node_name, containers=[_container(c) for c in pod.containers])
    claims = sorted({claim.name for c in pod.containers for claim in c.claims})
    for name in claims:
        spec.resourceClaims.add(name=name, resourceClaimName=name)
    status = core_v1_pb2.PodStatus(
        phase=pod.phase, containerStatuses=[_status(node, c) for c in pod.containers]
    )
    for name in claims:
        status.resourceClaimStatuses.add(name=name, resourceClaimName=name)
    return core_v1_pb2.Pod(metadata=meta, spec=spec, status=status)


def pod_objects(node: FakeNode, hidden: set[tuple[str, str]], node_name: str) -> list[core_v1_pb2.Pod]:
    """Every pod of `node` but the `hidden` ones (those the warm-up does not show yet)."""
    return [pod_object(node, pod, node_name) for key, pod in node.pods.items() if key not in hidden]


def deleted_pod(namespace: str, name: str, uid: str) -> core_v1_pb2.Pod:
    """What a DELETED event carries: the pod's name, namespace and uid, nothing else."""
    return core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name=name, namespace=namespace, uid=uid))
