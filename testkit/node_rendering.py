"""A `Model` rendered into kubelet responses, a different way each time: every repeated field at every
level shuffled, device entries regrouped, memory blocks split, pods, containers and claims split
across several entries with the same key. Every rendering must build the same Inventory."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TypeVar

from testkit.node_model import ClaimDev, ClaimKey, DevKey, MContainer, MemKey, Model, MPod, Numa
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.inventory import Inventory

__all__ = ["build_from", "render", "render_claim_resource", "shuffled"]

T = TypeVar("T")


def shuffled(rng: random.Random, items: Iterable[T]) -> list[T]:
    out = list(items)
    rng.shuffle(out)
    return out


def _chunks(rng: random.Random, items: Sequence[T]) -> list[list[T]]:
    """Split `items` into consecutive non-empty chunks at random cut points."""
    if not items:
        return []
    cuts = sorted(rng.sample(range(1, len(items)), rng.randint(0, len(items) - 1)))
    bounds = [0, *cuts, len(items)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


def _deal(rng: random.Random, items: Iterable[T], hands: int) -> list[list[T]]:
    """Deal `items` at random into `hands` lists (some possibly empty)."""
    out: list[list[T]] = [[] for _ in range(hands)]
    for item in items:
        out[rng.randrange(hands)].append(item)
    return out


def _topology(rng: random.Random, nodes: Numa) -> api_pb2.TopologyInfo | None:
    """The NUMA nodes in random order; no nodes is sometimes an unset topology, sometimes an empty one."""
    if not nodes and rng.random() < 0.5:
        return None
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in shuffled(rng, nodes)])


def render_devices(rng: random.Random, devices: dict[DevKey, Numa]) -> list[api_pb2.ContainerDevices]:
    # Start from the kubelet's shape: one (resource, NUMA nodes, id) per device per NUMA node...
    atoms: list[tuple[str, Numa, str]] = []
    for (resource, dev_id), numa in devices.items():
        if not numa:
            atoms.append((resource, (), dev_id))
        elif len(numa) > 1 and rng.random() < 0.3:
            atoms.append((resource, numa, dev_id))  # ...or one entry naming all its nodes
        else:
            atoms.extend((resource, (n,), dev_id) for n in numa)
    # ...then regroup ids of the same resource and topology into multi-id entries at random.
    grouped: dict[tuple[str, Numa], list[str]] = defaultdict(list)
    for resource, numa, dev_id in atoms:
        grouped[(resource, numa)].append(dev_id)
    entries: list[api_pb2.ContainerDevices] = []
    for (resource, numa), ids in grouped.items():
        for chunk in _chunks(rng, shuffled(rng, ids)):
            topology = _topology(rng, numa)
            if topology is None:
                entries.append(api_pb2.ContainerDevices(resource_name=resource, device_ids=chunk))
            else:
                entries.append(
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=chunk, topology=topology)
                )
    if entries and rng.random() < 0.2:
        entries.append(entries[rng.randrange(len(entries))])  # a repeated entry changes nothing
    return shuffled(rng, entries)


def render_memory(rng: random.Random, memory: dict[MemKey, int]) -> list[api_pb2.ContainerMemory]:
    entries: list[api_pb2.ContainerMemory] = []
    for (memory_type, numa), size in memory.items():
        # Split into 1-3 blocks of the same type and NUMA nodes whose sizes sum to the original.
        cuts = sorted(rng.randint(0, size) for _ in range(rng.randint(0, 2)))
        for part in (b - a for a, b in zip([0, *cuts], [*cuts, size], strict=True)):
            topology = _topology(rng, numa)
            if topology is None:
                entries.append(api_pb2.ContainerMemory(memory_type=memory_type, size=part))
            else:
                entries.append(api_pb2.ContainerMemory(memory_type=memory_type, size=part, topology=topology))
    return shuffled(rng, entries)


def render_cpus(rng: random.Random, cpu_ids: frozenset[int]) -> list[int]:
    ids = list(cpu_ids)
    if ids and rng.random() < 0.2:
        ids.append(rng.choice(ids))  # a repeated id changes nothing
    return shuffled(rng, ids)


def render_claim_resource(rng: random.Random, dev: ClaimDev) -> api_pb2.ClaimResource:
    driver, pool, device, cdi, share_id = dev
    r = api_pb2.ClaimResource(
        driver_name=driver,
        pool_name=pool,
        device_name=device,
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in shuffled(rng, cdi)],
    )
    if share_id is not None:
        r.share_id = share_id
    return r


def render_claims(
    rng: random.Random, claims: dict[ClaimKey, frozenset[ClaimDev]]
) -> list[api_pb2.DynamicResource]:
    entries: list[api_pb2.DynamicResource] = []
    for (namespace, name), devices in claims.items():
        resources = [render_claim_resource(rng, dev) for dev in devices]
        # The claim in one entry, or its resources spread over 2-3 entries with the same name.
        parts = _deal(rng, shuffled(rng, resources), rng.choice((1, 1, 2, 3)))
        entries.extend(
            api_pb2.DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=part)
            for part in parts
        )
    return shuffled(rng, entries)


def render_container(rng: random.Random, name: str, c: MContainer) -> list[api_pb2.ContainerResources]:
    """One ContainerResources, or (sometimes) its entries dealt over two with the same name."""
    hands = 2 if rng.random() < 0.25 else 1
    devices = _deal(rng, render_devices(rng, c.devices), hands)
    cpus = _deal(rng, render_cpus(rng, c.cpu_ids), hands)
    memory = _deal(rng, render_memory(rng, c.memory), hands)
    claims = _deal(rng, render_claims(rng, c.claims), hands)
    return [
        api_pb2.ContainerResources(
            name=name, devices=devices[i], cpu_ids=cpus[i], memory=memory[i], dynamic_resources=claims[i]
        )
        for i in range(hands)
    ]


def render_pod(rng: random.Random, key: tuple[str, str], p: MPod) -> list[api_pb2.PodResources]:
    """One PodResources, or its containers and pod-level values dealt over 2-3 with the same name."""
    hands = rng.choice((1, 1, 2, 3))
    containers = _deal(
        rng, [entry for name, c in p.containers.items() for entry in render_container(rng, name, c)], hands
    )
    cpus = _deal(rng, render_cpus(rng, p.cpu_ids), hands)
    memory = _deal(rng, render_memory(rng, p.memory), hands)
    namespace, name = key
    return [
        api_pb2.PodResources(
            namespace=namespace,
            name=name,
            containers=shuffled(rng, containers[i]),
            cpu_ids=cpus[i],
            memory=memory[i],
        )
        for i in range(hands)
    ]


def render(
    model: Model, rng: random.Random
) -> tuple[api_pb2.AllocatableResourcesResponse | None, api_pb2.ListPodResourcesResponse]:
    allocatable = None
    if model.known:
        allocatable = api_pb2.AllocatableResourcesResponse(
            devices=render_devices(rng, model.devices),
            cpu_ids=render_cpus(rng, model.cpu_ids),
            memory=render_memory(rng, model.memory),
        )
    entries = [entry for key, p in model.pods.items() for entry in render_pod(rng, key, p)]
    return allocatable, api_pb2.ListPodResourcesResponse(pod_resources=shuffled(rng, entries))


def build_from(model: Model, rng: random.Random) -> Inventory:
    return build(*render(model, rng))
