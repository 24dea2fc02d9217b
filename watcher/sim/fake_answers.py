"""The fake node as the kubelet's protobuf answers, with the real kubelet's quirks.

Pods, devices and CPU ids come in a fresh order on every answer (the caller's `shuffle`
decides, so a seeded fake repeats itself); containers, memory blocks and claims keep
their order, as the kubelet's do while it runs. One device entry per device per NUMA node; unhealthy or
unplugged devices vanish from allocatable but stay in the pods' allocations.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from watcher.kubeletapi.v1 import api_pb2
from watcher.sim.fake_node import FakeMemory, FakeNode, FakePod

__all__ = ["Shuffle", "allocatable_response", "list_response", "pod_resources"]

# Reorders a list in place (or leaves it), as the kubelet's Go maps do.
Shuffle = Callable[[list[Any]], None]


def _topology(numa: Iterable[int]) -> api_pb2.TopologyInfo:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa])


def allocatable_response(
    node: FakeNode, shuffle: Shuffle, down: Collection[str] = ()
) -> api_pb2.AllocatableResourcesResponse:
    """What GetAllocatableResources answers: healthy devices only, one entry per device per NUMA node;
    nothing of a resource whose plugin is `down` (not registered)."""
    entries = []
    for dev in node.devices.values():
        if not dev.healthy or dev.resource in down:
            continue
        entries.extend(_device_entries(dev.resource, dev.id, dev.numa))
    cpus = list(node.cpu_ids)
    # Allocatable memory keeps one order while the kubelet runs (it may differ from start to start).
    memory = [_memory(m) for m in node.memory]
    for seq in (entries, cpus):
        shuffle(seq)
    return api_pb2.AllocatableResourcesResponse(devices=entries, cpu_ids=cpus, memory=memory)


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def list_response(
    node: FakeNode, shuffle: Shuffle, hidden: Collection[tuple[str, str]] = ()
) -> api_pb2.ListPodResourcesResponse:
    """What List answers: every active pod the kubelet knows (not the `hidden` ones yet), unhealthy
    or unplugged devices included. A pod that finished (Succeeded, Failed) is not active and not
    listed, though Get still answers it (the kubelet looks it up among all the pods it knows)."""
    pods = [
        pod_resources(node, p, shuffle)
        for key, p in node.pods.items()
        if key not in hidden and p.phase not in TERMINAL_PHASES
    ]
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
    # The kubelet always sets a memory block's topology (its NUMA affinity).
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
        # Devices and CPU ids come in a new order on every call; memory blocks and claims keep
        # theirs while the kubelet runs.
        for seq in (devices, cpus):
            shuffle(seq)
        containers.append(
            api_pb2.ContainerResources(
                name=c.name, devices=devices, cpu_ids=cpus, memory=memory, dynamic_resources=dynamic
            )
        )
    # Containers keep their order (restartable init containers first, then spec order); a
    # consumer must still not rely on it.
    pod_cpus = list(pod.cpu_ids)
    shuffle(pod_cpus)
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=containers,
        cpu_ids=pod_cpus,
        memory=[_memory(m) for m in pod.memory],
    )
