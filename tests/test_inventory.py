"""Example tests for the inventory model: protobuf responses built by hand, checked field by field."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.capacity import CpuCapacity, MemoryCapacity, MissingDevice, NumaCapacity, ResourceCapacity
from watcher.model.inventory import FORMAT, Inventory
from watcher.model.records import Claim, ClaimDevice, Container, Device, Memory, Pod
from watcher.model.restore import from_canonical
from watcher.model.wording import cpuset_string
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import large_node

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
FUSE = "smarter-devices/fuse"
GIB = 1024**3


# --- helpers: protobuf messages by hand ---


def topo(*nodes: int) -> api_pb2.TopologyInfo:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in nodes])


def devs(resource: str, *ids: str, numa: Iterable[int] | None = None) -> api_pb2.ContainerDevices:
    """One ContainerDevices entry; `numa=None` leaves `topology` unset."""
    if numa is None:
        return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids), topology=topo(*numa))


def mem(memory_type: str, size: int, *numa: int) -> api_pb2.ContainerMemory:
    if not numa:
        return api_pb2.ContainerMemory(memory_type=memory_type, size=size)
    return api_pb2.ContainerMemory(memory_type=memory_type, size=size, topology=topo(*numa))


def alloc(
    devices: Iterable[api_pb2.ContainerDevices] = (),
    cpu_ids: Iterable[int] = (),
    memory: Iterable[api_pb2.ContainerMemory] = (),
) -> api_pb2.AllocatableResourcesResponse:
    return api_pb2.AllocatableResourcesResponse(
        devices=list(devices), cpu_ids=list(cpu_ids), memory=list(memory)
    )


def ctr(
    name: str,
    devices: Iterable[api_pb2.ContainerDevices] = (),
    cpu_ids: Iterable[int] = (),
    memory: Iterable[api_pb2.ContainerMemory] = (),
    dynamic: Iterable[api_pb2.DynamicResource] = (),
) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name,
        devices=list(devices),
        cpu_ids=list(cpu_ids),
        memory=list(memory),
        dynamic_resources=list(dynamic),
    )


def pod(
    namespace: str,
    name: str,
    *containers: api_pb2.ContainerResources,
    cpu_ids: Iterable[int] = (),
    memory: Iterable[api_pb2.ContainerMemory] = (),
) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=list(containers),
        cpu_ids=list(cpu_ids),
        memory=list(memory),
    )


def listing(*pods: api_pb2.PodResources) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(pod_resources=list(pods))


def claim_res(
    driver: str,
    pool: str,
    device: str,
    cdi: Iterable[str] = (),
    share_id: str | None = None,
) -> api_pb2.ClaimResource:
    r = api_pb2.ClaimResource(
        driver_name=driver,
        pool_name=pool,
        device_name=device,
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi],
    )
    if share_id is not None:
        r.share_id = share_id
    return r


def capacity_of(inv: Inventory, resource: str) -> ResourceCapacity:
    found = [c for c in inv.capacity if c.resource == resource]
    assert len(found) == 1, f"{resource} appears {len(found)} times in capacity"
    return found[0]


def per_numa(cap: ResourceCapacity) -> dict[int | None, tuple[int | None, int, int | None]]:
    return {n.numa: (n.allocatable, n.allocated, n.free) for n in cap.per_numa}


def memory_capacity_of(inv: Inventory, memory_type: str, numa: tuple[int, ...]) -> MemoryCapacity:
    found = [m for m in inv.memory_capacity if m.type == memory_type and m.numa == numa]
    assert len(found) == 1, f"{memory_type}{numa} appears {len(found)} times in memory_capacity"
    return found[0]


def rich_inventory() -> Inventory:
    """An inventory using every feature: NUMA merge, sidecars, DRA, pod-level values, a missing device."""
    allocatable = alloc(
        devices=[
            devs(GPU, "gpu-1", numa=[1]),
            devs(GPU, "gpu-0", numa=[0]),
            devs(GPU, "gpu-1", numa=[0]),
            devs(NIC, "0000:3b:02.0", numa=[0]),
            devs(FUSE, "fuse0"),
            devs(FUSE, "fuse1"),
        ],
        cpu_ids=[7, 2, 3, 4, 5, 6],
        memory=[mem("memory", 64 * GIB, 0), mem("memory", 64 * GIB, 1), mem("hugepages-1Gi", 8 * GIB, 0)],
    )
    pods = listing(
        pod(
            "ml",
            "trainer-0",
            ctr("trainer", [devs(GPU, "gpu-1", numa=[1]), devs(GPU, "gpu-1", numa=[0])], [3, 2]),
            ctr("log-shipper"),
            cpu_ids=[2, 3],
            memory=[mem("memory", 4 * GIB, 0)],
        ),
        pod(
            "dra",
            "claimed",
            ctr(
                "app",
                [devs(GPU, "gpu-9", numa=[1])],  # absent from allocatable: failed while in use
                memory=[mem("hugepages-1Gi", 2 * GIB, 0)],
                dynamic=[
                    api_pb2.DynamicResource(
                        claim_name="gpu-claim",
                        claim_namespace="dra",
                        claim_resources=[
                            claim_res(
                                "gpu.example.com", "node-a", "gpu-8", ["v.com/gpu=b", "v.com/gpu=a"], "s1"
                            ),
                            claim_res("gpu.example.com", "node-a", "gpu-7"),
                        ],
                    )
                ],
            ),
        ),
    )
    return build(allocatable, pods)


# --- devices and NUMA ---


def test_one_entry_per_numa_node_merges_into_one_device_with_both_nodes() -> None:
    inv = build(
        alloc(
            devices=[
                devs(GPU, "gpu-0", numa=[1]),
                devs(FUSE, "fuse0"),
                devs(GPU, "gpu-0", numa=[0]),
                devs(GPU, "gpu-1", numa=[1]),
            ]
        ),
        listing(),
    )
    assert inv.devices == (
        Device(GPU, "gpu-0", (0, 1)),
        Device(GPU, "gpu-1", (1,)),
        Device(FUSE, "fuse0", ()),
    )
    assert inv.devices_by_resource == {GPU: {"gpu-0": (0, 1), "gpu-1": (1,)}, FUSE: {"fuse0": ()}}


def test_multi_id_entry_and_multi_node_topology_are_merged_too() -> None:
    inv = build(
        alloc(devices=[devs(NIC, "b", "a", numa=[1, 0]), devs(NIC, "a", numa=[2]), devs(NIC, "b", "b")]),
        listing(),
    )
    assert inv.devices == (Device(NIC, "a", (0, 1, 2)), Device(NIC, "b", (0, 1)))


def test_device_entry_with_empty_topology_means_no_numa() -> None:
    inv = build(alloc(devices=[devs(FUSE, "fuse0", numa=[])]), listing())
    assert inv.devices == (Device(FUSE, "fuse0", ()),)


# --- allocatable CPUs and memory ---


def test_allocatable_cpu_ids_are_sorted_and_deduplicated() -> None:
    inv = build(alloc(cpu_ids=[9, 3, 4, 3, 0]), listing())
    assert inv.cpu_ids == (0, 3, 4, 9)
    assert inv.cpus == CpuCapacity(allocatable=4, allocated=0, free=4, allocated_ids=())


def test_allocatable_memory_per_type_and_numa_with_same_blocks_summed() -> None:
    inv = build(
        alloc(
            memory=[
                mem("memory", 10 * GIB, 0),
                mem("memory", 7 * GIB, 1),
                mem("hugepages-1Gi", 2 * GIB, 0),
                mem("memory", 5 * GIB, 0),
                mem("memory", 1 * GIB, 1, 0),
                mem("memory", 3 * GIB, 0, 1),
                mem("hugepages-2Mi", 6),
            ]
        ),
        listing(),
    )
    assert inv.memory == (
        Memory("hugepages-1Gi", (0,), 2 * GIB),
        Memory("hugepages-2Mi", (), 6),
        Memory("memory", (0,), 15 * GIB),
        Memory("memory", (0, 1), 4 * GIB),
        Memory("memory", (1,), 7 * GIB),
    )


# --- pods and containers ---


def test_pods_hold_containers_including_sidecars_with_devices_cpus_and_memory() -> None:
    inv = build(
        alloc(devices=[devs(GPU, "gpu-0", numa=[0]), devs(GPU, "gpu-1", numa=[0])]),
        listing(
            pod(
                "ml",
                "trainer-0",
                # The kubelet lists a restartable init container first; it holds nothing here.
                ctr("log-shipper"),
                ctr(
                    "trainer",
                    [devs(GPU, "gpu-1", numa=[0]), devs(GPU, "gpu-0", numa=[0])],
                    [5, 4],
                    [mem("memory", 2 * GIB, 0), mem("hugepages-1Gi", GIB, 0)],
                ),
            ),
            pod("kube-system", "exporter", ctr("exporter", cpu_ids=[8])),
        ),
    )
    assert [p.key for p in inv.pods] == ["kube-system/exporter", "ml/trainer-0"]
    trainer_pod = inv.pod("ml", "trainer-0")
    assert trainer_pod is not None
    assert trainer_pod.containers == (
        Container("log-shipper", (), (), (), ()),
        Container(
            "trainer",
            (Device(GPU, "gpu-0", (0,)), Device(GPU, "gpu-1", (0,))),
            (4, 5),
            (Memory("hugepages-1Gi", (0,), GIB), Memory("memory", (0,), 2 * GIB)),
            (),
        ),
    )
    assert trainer_pod.cpu_ids == () and trainer_pod.memory == ()
    exporter = inv.pod("kube-system", "exporter")
    assert exporter is not None and exporter.containers[0].cpu_ids == (8,)
    assert inv.pod("ml", "exporter") is None
    assert inv.cpus.allocated_ids == (4, 5, 8)


def test_container_split_across_two_pod_entries_is_merged() -> None:
    inv = build(
        None,
        listing(
            pod("ns", "p", ctr("a", cpu_ids=[1], memory=[mem("memory", 1, 0)])),
            pod("ns", "p", ctr("a", cpu_ids=[2], memory=[mem("memory", 2, 0)]), ctr("b")),
        ),
    )
    assert len(inv.pods) == 1
    assert [c.name for c in inv.pods[0].containers] == ["a", "b"]
    assert inv.pods[0].containers[0].cpu_ids == (1, 2)
    assert inv.pods[0].containers[0].memory == (Memory("memory", (0,), 3),)


# --- dynamic resources (DRA) ---


def test_dynamic_resources_claims_with_share_id_set_unset_and_empty() -> None:
    inv = build(
        None,
        listing(
            pod(
                "dra",
                "p",
                ctr(
                    "app",
                    dynamic=[
                        api_pb2.DynamicResource(
                            claim_name="gpu-claim",
                            claim_namespace="team-a",
                            claim_resources=[
                                claim_res(
                                    "gpu.example.com",
                                    "node-a",
                                    "gpu-8",
                                    ["gpu.example.com/gpu=gpu-8", "gpu.example.com/gpu=all"],
                                    share_id="2f7c3c1e-6c1d-4e55-9d0f-8a6d2b1f0c11",
                                ),
                                claim_res("gpu.example.com", "node-a", "gpu-7"),
                            ],
                        ),
                        # The same claim in a second entry: merged into one Claim.
                        api_pb2.DynamicResource(
                            claim_name="gpu-claim",
                            claim_namespace="team-a",
                            claim_resources=[claim_res("gpu.example.com", "node-a", "gpu-6", share_id="")],
                        ),
                        api_pb2.DynamicResource(claim_name="empty", claim_namespace="team-a"),
                    ],
                ),
            )
        ),
    )
    claims = inv.pods[0].containers[0].claims
    assert [(c.namespace, c.name) for c in claims] == [("team-a", "empty"), ("team-a", "gpu-claim")]
    assert claims[0] == Claim("team-a", "empty", ())
    by_device = {d.device: d for d in claims[1].devices}
    assert set(by_device) == {"gpu-6", "gpu-7", "gpu-8"}
    assert by_device["gpu-8"] == ClaimDevice(
        driver="gpu.example.com",
        pool="node-a",
        device="gpu-8",
        cdi_devices=("gpu.example.com/gpu=all", "gpu.example.com/gpu=gpu-8"),
        share_id="2f7c3c1e-6c1d-4e55-9d0f-8a6d2b1f0c11",
    )
    assert by_device["gpu-7"].share_id is None
    assert by_device["gpu-7"].cdi_devices == ()
    # Present but empty is not the same as absent.
    assert by_device["gpu-6"].share_id == ""


def test_share_id_unset_and_empty_give_different_hashes() -> None:
    def one(share_id: str | None) -> Inventory:
        dr = api_pb2.DynamicResource(
            claim_name="c",
            claim_namespace="ns",
            claim_resources=[claim_res("d", "p", "x", share_id=share_id)],
        )
        return build(None, listing(pod("ns", "p", ctr("a", dynamic=[dr]))))

    assert one(None).content_hash != one("").content_hash
    assert one("").content_hash != one("s").content_hash


# --- pod-level CPUs and memory ---


def test_pod_level_cpu_ids_and_memory_are_kept_on_the_pod() -> None:
    inv = build(
        None,
        listing(
            pod(
                "ns",
                "p",
                ctr("a", cpu_ids=[2]),
                cpu_ids=[3, 2],
                memory=[mem("memory", GIB, 0), mem("memory", GIB, 0), mem("hugepages-1Gi", GIB, 1)],
            )
        ),
    )
    p = inv.pods[0]
    assert p.cpu_ids == (2, 3)
    assert p.memory == (Memory("hugepages-1Gi", (1,), GIB), Memory("memory", (0,), 2 * GIB))
    # Pod-level CPUs overlap the containers': counted once, pod-only ones counted too.
    assert inv.cpus.allocated == 2 and inv.cpus.allocated_ids == (2, 3)


def test_memory_capacity_counts_the_larger_of_pod_level_and_container_sum_per_pod() -> None:
    inv = build(
        alloc(memory=[mem("memory", 100 * GIB, 0)]),
        listing(
            # containers 4 + 2 = 6, pod-level 8: counts 8
            pod(
                "ns",
                "pod-larger",
                ctr("a", memory=[mem("memory", 4 * GIB, 0)]),
                ctr("b", memory=[mem("memory", 2 * GIB, 0)]),
                memory=[mem("memory", 8 * GIB, 0)],
            ),
            # containers 5, pod-level 3: counts 5
            pod(
                "ns",
                "containers-larger",
                ctr("a", memory=[mem("memory", 5 * GIB, 0)]),
                memory=[mem("memory", 3 * GIB, 0)],
            ),
            # containers 3 + 3 = 6, pod-level 6 (the usual overlap): counts 6, not 12
            pod(
                "ns",
                "equal",
                ctr("a", memory=[mem("memory", 3 * GIB, 0)]),
                ctr("b", memory=[mem("memory", 3 * GIB, 0)]),
                memory=[mem("memory", 6 * GIB, 0)],
            ),
            # no pod-level values: counts 2
            pod("ns", "old-kubelet", ctr("a", memory=[mem("memory", 2 * GIB, 0)])),
        ),
    )
    assert memory_capacity_of(inv, "memory", (0,)) == MemoryCapacity(
        "memory", (0,), allocatable=100 * GIB, allocated=21 * GIB, free=79 * GIB
    )


def test_memory_capacity_keeps_types_and_numa_nodes_apart() -> None:
    inv = build(
        alloc(memory=[mem("memory", 10, 0), mem("memory", 20, 1), mem("hugepages-1Gi", 4, 0)]),
        listing(pod("ns", "p", ctr("a", memory=[mem("memory", 3, 1), mem("hugepages-1Gi", 1, 0)]))),
    )
    assert inv.memory_capacity == (
        MemoryCapacity("hugepages-1Gi", (0,), 4, 1, 3),
        MemoryCapacity("memory", (0,), 10, 0, 10),
        MemoryCapacity("memory", (1,), 20, 3, 17),
    )


# --- free-capacity arithmetic ---


def test_device_capacity_per_resource_and_per_numa_node() -> None:
    inv = build(
        alloc(
            devices=[
                devs(GPU, "g0", numa=[0]),
                devs(GPU, "g1", numa=[0]),
                devs(GPU, "g2", numa=[1]),
                devs(GPU, "g3", numa=[0]),
                devs(GPU, "g3", numa=[1]),
                devs(FUSE, "f0"),
                devs(FUSE, "f1"),
            ]
        ),
        listing(
            pod("ns", "a", ctr("c", [devs(GPU, "g0", numa=[0]), devs(FUSE, "f0")])),
            pod("ns", "b", ctr("c", [devs(GPU, "g3", numa=[0]), devs(GPU, "g3", numa=[1])])),
        ),
    )
    assert [c.resource for c in inv.capacity] == [GPU, FUSE]
    gpu = capacity_of(inv, GPU)
    assert (gpu.allocatable, gpu.allocated, gpu.free, gpu.unavailable) == (4, 2, 2, 0)
    # g3 sits on both nodes: it counts (allocatable and allocated) on each of them.
    assert per_numa(gpu) == {0: (3, 2, 1), 1: (2, 1, 1)}
    assert [n.numa for n in gpu.per_numa] == [0, 1]
    fuse = capacity_of(inv, FUSE)
    assert (fuse.allocatable, fuse.allocated, fuse.free, fuse.unavailable) == (2, 1, 1, 0)
    assert fuse.per_numa == (NumaCapacity(None, 2, 1, 1),)


def test_per_numa_trusts_allocatable_topology_for_held_devices() -> None:
    inv = build(
        alloc(devices=[devs(GPU, "g0", numa=[1])]),
        listing(pod("ns", "p", ctr("c", [devs(GPU, "g0", numa=[0])]))),
    )
    assert per_numa(capacity_of(inv, GPU)) == {1: (1, 1, 0)}


def test_cpu_capacity() -> None:
    inv = build(
        alloc(cpu_ids=range(8)),
        listing(
            pod("ns", "a", ctr("c", cpu_ids=[1, 2])), pod("ns", "b", ctr("c", cpu_ids=[5]), cpu_ids=[5, 6])
        ),
    )
    assert inv.cpus == CpuCapacity(allocatable=8, allocated=4, free=4, allocated_ids=(1, 2, 5, 6))


def test_free_is_never_negative() -> None:
    inv = build(
        alloc(devices=[devs(GPU, "g0", numa=[0])], cpu_ids=[0, 1], memory=[mem("memory", GIB, 0)]),
        listing(
            pod(
                "ns",
                "p",
                ctr(
                    "c",
                    [devs(GPU, "g0", numa=[0]), devs(GPU, "g1", numa=[0]), devs(GPU, "g2", numa=[0])],
                    cpu_ids=[0, 1, 2, 3],
                    memory=[mem("memory", 3 * GIB, 0), mem("hugepages-2Mi", 4, 0)],
                ),
            )
        ),
    )
    gpu = capacity_of(inv, GPU)
    assert (gpu.allocatable, gpu.allocated, gpu.free, gpu.unavailable) == (1, 3, 0, 2)
    assert per_numa(gpu) == {0: (1, 3, 0)}
    assert inv.cpus == CpuCapacity(allocatable=2, allocated=4, free=0, allocated_ids=(0, 1, 2, 3))
    assert memory_capacity_of(inv, "memory", (0,)) == MemoryCapacity("memory", (0,), GIB, 3 * GIB, 0)
    # Allocated memory of a type that is not allocatable at all.
    assert memory_capacity_of(inv, "hugepages-2Mi", (0,)) == MemoryCapacity("hugepages-2Mi", (0,), 0, 4, 0)


# --- allocated but not allocatable (unhealthy / unplugged while in use) ---


def test_device_allocated_but_absent_from_allocatable_is_missing() -> None:
    inv = build(
        alloc(devices=[devs(GPU, "g0", numa=[0]), devs(GPU, "g1", numa=[1])]),
        listing(
            pod("ml", "train", ctr("app", [devs(GPU, "g1", numa=[1]), devs(GPU, "g2", numa=[1])])),
            pod("net", "router", ctr("dpdk", [devs(NIC, "0000:3b:02.1", numa=[0])])),
        ),
    )
    assert inv.missing_devices == (
        MissingDevice(NIC, "0000:3b:02.1", (0,), ("net/router/dpdk",)),
        MissingDevice(GPU, "g2", (1,), ("ml/train/app",)),
    )
    gpu = capacity_of(inv, GPU)
    # g2 is allocated and unavailable; free (g0) is not reduced by it.
    assert (gpu.allocatable, gpu.allocated, gpu.free, gpu.unavailable) == (2, 2, 1, 1)
    assert per_numa(gpu) == {0: (1, 0, 1), 1: (1, 2, 0)}
    nic = capacity_of(inv, NIC)
    assert (nic.allocatable, nic.allocated, nic.free, nic.unavailable) == (0, 1, 0, 1)


def test_missing_device_lists_every_holder() -> None:
    inv = build(
        alloc(devices=[devs(GPU, "g0", numa=[0])]),
        listing(
            pod("b", "p", ctr("c", [devs(GPU, "gx", numa=[1])])),
            pod("a", "p", ctr("d", [devs(GPU, "gx", numa=[0])]), ctr("c", [devs(GPU, "gx")])),
        ),
    )
    assert inv.missing_devices == (MissingDevice(GPU, "gx", (0, 1), ("a/p/c", "a/p/d", "b/p/c")),)


def test_healthy_devices_are_not_missing() -> None:
    inv = rich_inventory()
    assert [(m.resource, m.id) for m in inv.missing_devices] == [(GPU, "gpu-9")]


# --- List-only mode ---


def test_list_only_mode_leaves_allocatable_unknown() -> None:
    pods = listing(
        pod(
            "ns",
            "p",
            ctr(
                "c",
                [devs(GPU, "g0", numa=[0]), devs(FUSE, "f0")],
                cpu_ids=[1, 2],
                memory=[mem("memory", 5, 0)],
            ),
        )
    )
    inv = build(None, pods)
    assert inv.allocatable_known is False
    assert inv.devices == () and inv.cpu_ids == () and inv.memory == ()
    assert inv.missing_devices == ()
    gpu = capacity_of(inv, GPU)
    assert gpu == ResourceCapacity(GPU, None, 1, None, 0, (NumaCapacity(0, None, 1, None),))
    assert capacity_of(inv, FUSE).per_numa == (NumaCapacity(None, None, 1, None),)
    assert inv.cpus == CpuCapacity(None, 2, None, (1, 2))
    assert inv.memory_capacity == (MemoryCapacity("memory", (0,), None, 5, None),)
    assert inv.canonical["allocatable"]["known"] is False
    # Unknown allocatable is not the same state as an empty one.
    known_empty = build(alloc(), pods)
    assert known_empty.allocatable_known is True
    assert known_empty != inv and known_empty.content_hash != inv.content_hash
    assert len(known_empty.missing_devices) == 2


# --- canonical form, hash and round trip ---


def test_equal_inputs_in_different_order_give_equal_inventories() -> None:
    a = build(
        alloc(devices=[devs(GPU, "g0", numa=[0]), devs(GPU, "g0", numa=[1])], cpu_ids=[1, 0]),
        listing(pod("ns", "a", ctr("x", cpu_ids=[1])), pod("ns", "b", ctr("y"), ctr("z"))),
    )
    b = build(
        alloc(devices=[devs(GPU, "g0", numa=[1]), devs(GPU, "g0", numa=[0])], cpu_ids=[0, 1]),
        listing(pod("ns", "b", ctr("z"), ctr("y")), pod("ns", "a", ctr("x", cpu_ids=[1]))),
    )
    assert a == b and a.content_hash == b.content_hash
    assert a.content_hash.startswith("sha256:") and len(a.content_hash) == len("sha256:") + 64


def test_content_hash_changes_with_content() -> None:
    base = rich_inventory()
    other = build(
        alloc(devices=[devs(GPU, "gpu-0", numa=[0])]),
        listing(),
    )
    assert base.content_hash != other.content_hash
    assert base.canonical["format"] == FORMAT


def test_from_canonical_round_trips_to_an_equal_inventory() -> None:
    inv = rich_inventory()
    back = from_canonical(inv.canonical)
    assert back == inv
    assert back.content_hash == inv.content_hash
    # Through JSON, as the state file stores it.
    from_json = from_canonical(json.loads(inv.canonical_bytes))
    assert from_json == inv and from_json.content_hash == inv.content_hash
    assert from_json.missing_devices == inv.missing_devices
    assert from_json.derived() == inv.derived()


def test_canonical_is_a_fresh_copy_that_callers_cannot_corrupt() -> None:
    inv = rich_inventory()
    digest = inv.content_hash
    first = inv.canonical
    first["pods"].clear()
    first["allocatable"]["cpu_ids"].append(999)
    assert len(inv.canonical["pods"]) == 2 and 999 not in inv.canonical["allocatable"]["cpu_ids"]
    assert from_canonical(inv.canonical) == inv and inv.content_hash == digest


def test_from_canonical_round_trips_list_only_mode() -> None:
    inv = build(None, listing(pod("ns", "p", ctr("c", [devs(GPU, "g0", numa=[0])]))))
    back = from_canonical(json.loads(inv.canonical_bytes))
    assert back == inv and back.allocatable_known is False and back.missing_devices == ()


def test_large_node_is_order_independent_and_round_trips(tmp_path: Path) -> None:
    node = large_node()
    one = FakeKubelet(tmp_path, node, seed=1)
    two = FakeKubelet(tmp_path, node, seed=2)
    a = build(one.allocatable_response(), one.list_response())
    b = build(two.allocatable_response(), two.list_response())
    assert a == b and a.content_hash == b.content_hash
    assert from_canonical(json.loads(a.canonical_bytes)).content_hash == a.content_hash
    assert len(a.devices) == 4 * 64 and len(a.pods) == 250
    # 250 pods take one device each, in order: three resources full, the fourth has 6 left.
    assert [(c.allocatable, c.allocated, c.free) for c in a.capacity] == [(64, 64, 0)] * 3 + [(64, 58, 6)]
    assert a.cpus.allocatable == 512 and a.cpus.free == 0
    assert a.missing_devices == ()


def _valid_canonical() -> dict[str, Any]:
    return copy.deepcopy(rich_inventory().canonical)


def test_from_canonical_accepts_the_valid_fixture() -> None:
    # Guards the parametrized rejections below: they fail for their mutation, not the base.
    assert from_canonical(_valid_canonical()) == rich_inventory()


@pytest.mark.parametrize("fmt", [FORMAT + 1, 0, "1", None])
def test_from_canonical_rejects_other_formats(fmt: object) -> None:
    data = _valid_canonical()
    data["format"] = fmt
    with pytest.raises(ValueError, match="format"):
        from_canonical(data)


def test_from_canonical_rejects_a_missing_format() -> None:
    data = _valid_canonical()
    del data["format"]
    with pytest.raises(ValueError, match="format"):
        from_canonical(data)


def _drop(key: str) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        del d[key]

    return mutate


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(_drop("pods"), id="no-pods"),
        pytest.param(_drop("allocatable"), id="no-allocatable"),
        pytest.param(lambda d: d["allocatable"].pop("devices"), id="no-devices"),
        pytest.param(lambda d: d["allocatable"].pop("known"), id="no-known"),
        pytest.param(lambda d: d["pods"][0].pop("containers"), id="pod-without-containers"),
        pytest.param(lambda d: d["pods"][0]["containers"][0].pop("dynamic_resources"), id="no-dra-key"),
        pytest.param(lambda d: d["pods"][0]["memory"].append({"type": "memory"}), id="memory-no-size"),
        pytest.param(lambda d: d.update(pods=[1, 2]), id="pods-not-dicts"),
        pytest.param(lambda d: d.update(allocatable=[]), id="allocatable-a-list"),
        pytest.param(lambda d: d["allocatable"].update(devices=[["gpu", "g0"]]), id="devices-a-list"),
        pytest.param(lambda d: d["allocatable"]["devices"][GPU].update({"g5": 3}), id="numa-an-int"),
        pytest.param(lambda d: d["allocatable"].update(cpu_ids=None), id="cpu-ids-none"),
        pytest.param(
            lambda d: d["allocatable"]["memory"].append({"type": "m", "numa": [], "size": "big"}),
            id="size-not-a-number",
        ),
    ],
)
def test_from_canonical_rejects_malformed_data(mutate: Any) -> None:
    data = _valid_canonical()
    mutate(data)
    with pytest.raises(ValueError, match=r"malformed inventory|invalid literal"):
        from_canonical(data)


@pytest.mark.parametrize("data", [[], None], ids=["list", "null"])
def test_from_canonical_rejects_a_non_object_document(data: Any) -> None:
    # A state file holding valid JSON that is not an object is malformed too. (Regression: this
    # once escaped as AttributeError from `data.get`.)
    with pytest.raises(ValueError, match="inventory"):
        from_canonical(data)


# --- derived figures ---


def test_derived_is_json_ready_and_matches_the_views() -> None:
    inv = rich_inventory()
    derived = json.loads(json.dumps(inv.derived()))
    gpu = next(c for c in derived["capacity"] if c["resource"] == GPU)
    assert (gpu["allocatable"], gpu["allocated"], gpu["free"], gpu["unavailable"]) == (2, 2, 1, 1)
    assert derived["cpus"] == {"allocatable": 6, "allocated": 2, "free": 4}
    assert derived["missing_devices"] == [
        {"resource": GPU, "id": "gpu-9", "numa": [1], "holders": ["dra/claimed/app"]}
    ]
    hp = next(m for m in derived["memory"] if m["type"] == "hugepages-1Gi")
    assert hp == {
        "type": "hugepages-1Gi",
        "numa": [0],
        "allocatable": 8 * GIB,
        "allocated": 2 * GIB,
        "free": 6 * GIB,
    }


def test_inventory_is_immutable() -> None:
    inv = rich_inventory()
    with pytest.raises(AttributeError):
        inv.pods = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        inv.pods[0].name = "x"  # type: ignore[misc]
    assert isinstance(inv.pods[0], Pod)


# --- cpuset notation ---


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([], ""),
        ([5], "5"),
        ([0, 1, 2, 3], "0-3"),
        ([11, 0, 2, 3, 1, 8, 10], "0-3,8,10-11"),
        ([3, 3, 4, 4], "3-4"),
        ([1, 3, 5], "1,3,5"),
        ([0, 1, 47, 48, 49, 95], "0-1,47-49,95"),
    ],
)
def test_cpuset_string(ids: list[int], expected: str) -> None:
    assert cpuset_string(ids) == expected


def test_cpuset_string_accepts_any_iterable() -> None:
    assert cpuset_string(iter({2, 1, 0})) == "0-2"
    assert cpuset_string(range(4, 8)) == "4-7"
