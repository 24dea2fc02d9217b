"""The fake node as the kubelet's protobuf answers, with the real kubelet's quirks.

Every answer comes in a fresh order (the caller's `shuffle` decides, so a seeded
fake repeats itself), one device entry per device per NUMA node; unhealthy or
unplugged devices vanish from allocatable but stay in the pods' allocations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from watcher.kubeletapi.v1 import api_pb2
from watcher.sim.fake_node import FakeMemory, FakeNode, FakePod

__all__ = ["Shuffle", "allocatable_response", "list_response", "pod_resources"]

# Reorders a list in place (or leaves it), as the kubelet's Go maps do.
Shuffle = Callable[[list[Any]], None]


def _topology(numa: Iterable[int]) -> api_pb2.TopologyInfo:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa])


def allocatable_response(node: FakeNode, shuffle: Shuffle) -> api_pb2.AllocatableResourcesResponse:
    """What GetAllocatableResources answers: healthy devices only, one entry per device per NUMA node."""
    entries = []
    for dev in node.devices.values():
        if not dev.healthy:
            continue
        entries.extend(_device_entries(dev.resource, dev.id, dev.numa))
    cpus = list(node.cpu_ids)
    memory = [_memory(m) for m in node.memory]
    for seq in (entries, cpus, memory):
        shuffle(seq)
    return api_pb2.AllocatableResourcesResponse(devices=entries, cpu_ids=cpus, memory=memory)


def list_response(node: FakeNode, shuffle: Shuffle) -> api_pb2.ListPodResourcesResponse:
    """What List answers: every pod, unhealthy or unplugged devices included."""
    pods = [pod_resources(node, p, shuffle) for p in node.pods.values()]
    shuffle(pods)
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


def _device_entries(resource: str, device_id: str, numa: tuple[int, ...]) -> list[api_pb2.ContainerDevices]:
    if not numa:
        return [api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [
        api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id], topology=_topology([n]))
        for n in numa
    ]


def _memory(m: FakeMemory) -> api_pb2.ContainerMemory:
    if not m.numa:
        return api_pb2.ContainerMemory(memory_type=m.type, size=m.size)
    return api_pb2.ContainerMemory(memory_type=m.type, size=m.size, topology=_topology(m.numa))


def pod_resources(node: FakeNode, pod: FakePod, shuffle: Shuffle) -> api_pb2.PodResources:
    """One pod as List and Get answer it."""
    containers = []
    for c in pod.containers:
        devices = [
            entry
            for resource, ids in c.devices.items()
            for dev_id in ids
            for entry in _device_entries(resource, dev_id, node.device_numa(resource, dev_id))
        ]
        cpus = list(c.cpu_ids)
        memory = [_memory(m) for m in c.memory]
        dynamic = [
            api_pb2.DynamicResource(
                claim_name=claim.name,
                claim_namespace=claim.namespace,
                claim_resources=[
                    api_pb2.ClaimResource(
                        cdi_devices=[api_pb2.CDIDevice(name=n) for n in d.cdi_devices],
                        driver_name=d.driver,
                        pool_name=d.pool,
                        device_name=d.device,
                        share_id=d.share_id,
                    )
                    for d in claim.devices
                ],
            )
            for claim in c.claims
        ]
        for seq in (devices, cpus, memory, dynamic):
            shuffle(seq)
        containers.append(
            api_pb2.ContainerResources(
                name=c.name, devices=devices, cpu_ids=cpus, memory=memory, dynamic_resources=dynamic
            )
        )
    # The kubelet lists sidecars before app containers, but it is a map
    # underneath and consumers must not rely on any order: shuffle.
    shuffle(containers)
    pod_cpus = list(pod.cpu_ids)
    shuffle(pod_cpus)
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=containers,
        cpu_ids=pod_cpus,
        memory=[_memory(m) for m in pod.memory],
    )
