"""The fake node's pods as the kubelet's Pods API sends them: k8s.io.api.core.v1.Pod messages.

What the kubelet puts there and the fake copies: the pod's metadata (uid, generation, labels, owner
references, creation time), each container with its extended resources as limits and requests
(equal: those cannot be overcommitted) and its DRA claims, the node name, the phase, and per
container the kubelet's own verdict on each device it holds (`allocatedResourcesStatus`, the
ResourceHealthStatus gate, on by default since 1.36). Init containers get none.

- A device-plugin device: the device manager's verdict, under the resource's name; Healthy or
  Unhealthy as its plugin last said, and Healthy for a device the plugin no longer lists at all (the
  manager finds no health to copy and keeps its default).
- A DRA device: the DRA manager's, under "claim:<claim>" or "claim:<claim>/<request>", with the
  device's first CDI id (else driver/pool/device) as its id: Healthy, Unhealthy or Unknown and the
  driver's message (ResourceHealthStatusMessage, on by default since 1.36).
- A DRA-backed extended resource (a plain nvidia.com/gpu request a DRA driver serves): the container
  asks for the resource, the pod's status names the claim the scheduler made for it
  (extendedResourceClaimStatus), and there is NO health for it: upstream's DRA manager (1.37.2)
  reports only the claims a container lists in its resources.claims, and this claim is not listed.

The kubelet lists resources and devices in Go map order; the fake sorts them, so that one pod's
bytes change only when the pod does (which is how the fake's watch finds its MODIFIED events).
"""

from __future__ import annotations

from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.sim.fake_node import FakeClaim, FakeContainer, FakeNode, FakePod

__all__ = [
    "DISRUPTION_WORDS",
    "HEALTHY",
    "UNHEALTHY",
    "admission_rejection",
    "deleted_pod",
    "pod_object",
    "pod_objects",
    "rejected",
]

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# What upstream's device taint eviction controller (1.37.2) writes into the condition, whatever the taint.
DISRUPTION_WORDS = "Device Taint manager: deleting due to NoExecute taint"


def _health(node: FakeNode, resource: str, device_id: str) -> str:
    device = node.devices.get((resource, device_id))
    return UNHEALTHY if device is not None and not device.healthy else HEALTHY


def _container(c: FakeContainer) -> core_v1_pb2.Container:
    out = core_v1_pb2.Container(name=c.name)
    resources = out.resources
    counts = {resource: len(ids) for resource, ids in c.devices.items() if ids}
    for claim in c.claims:
        if claim.extended_resource is not None:
            counts[claim.extended_resource] = counts.get(claim.extended_resource, 0) + len(claim.devices)
        elif claim.request:
            resources.claims.add(name=claim.name, request=claim.request)
        else:
            resources.claims.add(name=claim.name)
    for resource, count in sorted(counts.items()):
        resources.limits[resource].string = str(count)
        resources.requests[resource].string = str(count)
    return out


def _claim_status(claim: FakeClaim) -> core_v1_pb2.ResourceStatus:
    name = f"claim:{claim.name}/{claim.request}" if claim.request else f"claim:{claim.name}"
    out = core_v1_pb2.ResourceStatus(name=name)
    seen = set()
    for d in claim.devices:
        resource_id = d.cdi_devices[0] if d.cdi_devices else f"{d.driver}/{d.pool}/{d.device}"
        if resource_id in seen:
            continue
        seen.add(resource_id)
        health = out.resources.add(resourceID=resource_id, health=d.health)
        if d.message:
            health.message = d.message
    return out


def _status(node: FakeNode, c: FakeContainer) -> core_v1_pb2.ContainerStatus:
    out = core_v1_pb2.ContainerStatus(name=c.name, ready=True, started=True, restartCount=0)
    statuses = []
    for resource, ids in c.devices.items():
        if not ids:
            continue
        status = core_v1_pb2.ResourceStatus(name=resource)
        for device_id in sorted(ids):
            status.resources.add(resourceID=device_id, health=_health(node, resource, device_id))
        statuses.append(status)
    statuses += [
        _claim_status(claim) for claim in c.claims if claim.extended_resource is None and claim.devices
    ]
    out.allocatedResourcesStatus.extend(sorted(statuses, key=lambda s: s.name))
    return out


def pod_object(node: FakeNode, pod: FakePod, node_name: str) -> core_v1_pb2.Pod:
    """`pod` as the Pods API's ListPods, GetPod and ADDED/MODIFIED events carry it."""
    meta = meta_v1_pb2.ObjectMeta(
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        # The API server gives a pod generation 1 when it is created (and one more per change of
        # its spec, which the fake never makes), and the kubelet's Pods API passes it on.
        generation=1,
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
    claims = [(c.name, claim) for c in pod.containers for claim in c.claims]
    listed = sorted({claim.name for _, claim in claims if claim.extended_resource is None})
    # Claims made from templates, as Jobs' pods have them. The real kubelet's Pods API serves the
    # status its own status manager keeps, which never has resourceClaimStatuses (the
    # resourceclaim controller owns that field in the API server): the claim object's name is
    # nowhere in the pod, only in pod-resources' answer. The fake serves the same.
    for name in listed:
        spec.resourceClaims.add(name=name, resourceClaimTemplateName=f"{name}-template")
    status = core_v1_pb2.PodStatus(
        phase=pod.phase, containerStatuses=[_status(node, c) for c in pod.containers]
    )
    if pod.reason:  # a pod the kubelet failed (kubelet.go rejectPod): its reason and words
        status.reason, status.message = pod.reason, pod.message
    if pod.disruption:  # as an evicting controller wrote it; the kubelet copies it (not its own)
        status.conditions.add(
            type="DisruptionTarget", status="True", reason=pod.disruption, message=DISRUPTION_WORDS
        )
    for container, claim in claims:
        if claim.extended_resource is not None:
            extended = status.extendedResourceClaimStatus
            extended.resourceClaimName = claim.name
            extended.requestMappings.add(
                containerName=container, resourceName=claim.extended_resource, requestName=claim.request
            )
    return core_v1_pb2.Pod(metadata=meta, spec=spec, status=status)


def admission_rejection(node: FakeNode, resource: str, count: int) -> tuple[str, str]:
    """The reason and message the real kubelet gives a pod asking for `count` of `resource` that
    its device manager cannot allocate (the topology manager's admit handler calls Allocate first:
    cm/admission/errors.go wraps the cause, kubelet.go rejectPod prefixes it), by what the node has:
    no such device at all, none healthy, or too few free."""
    devices = [d for (r, _), d in node.devices.items() if r == resource]
    healthy = {d.id for d in devices if d.healthy}
    held = {i for p in node.pods.values() for c in p.containers for i in c.devices.get(resource, ())}
    if not devices:
        cause = f"cannot allocate unregistered device {resource}"
    elif not healthy:
        cause = f"no healthy devices present; cannot allocate unhealthy devices {resource}"
    else:
        free = len(healthy - held)
        cause = (
            f"requested number of devices unavailable for {resource}. Requested: {count}, Available: {free}"
        )
    return (
        "UnexpectedAdmissionError",
        f"Pod was rejected: Allocate failed due to {cause}, which is unexpected",
    )


def rejected(node: FakeNode, pod: FakePod, resource: str, count: int = 1) -> FakePod:
    """`pod` (asking for `count` of `resource`) as the kubelet leaves a pod it refuses at admission,
    the real one's way when devices went between scheduling and admission: Failed at once, with
    the device manager's reason and words, and no device (List leaves it out). Give it to
    FakeKubelet.add_pod: `fake.add_pod(rejected(fake.node, pod, "nvidia.com/gpu"))`."""
    pod.phase = "Failed"
    pod.reason, pod.message = admission_rejection(node, resource, count)
    return pod


def pod_objects(node: FakeNode, hidden: set[tuple[str, str]], node_name: str) -> list[core_v1_pb2.Pod]:
    """Every pod of `node` but the `hidden` ones (those the warm-up does not show yet)."""
    return [pod_object(node, pod, node_name) for key, pod in node.pods.items() if key not in hidden]


def deleted_pod(namespace: str, name: str, uid: str) -> core_v1_pb2.Pod:
    """What a DELETED event carries: the pod's name, namespace and uid, nothing else."""
    return core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name=name, namespace=namespace, uid=uid))
