"""diff(): every real change once, in a fixed order, with JSON-ready details; nothing for mere reordering."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.changes import DIFF_KINDS, Change, Kind
from watcher.model.diff import KIND_ORDER, diff, inventory_summary
from watcher.model.inventory import Inventory
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import GIB, FakeClaim, FakeClaimDevice, FakeMemory, FakePod, default_node

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
FUSE = "smarter-devices/fuse"


def _kubelet(seed: int = 0) -> FakeKubelet:
    # Never started: only the response builders and the scripting methods are used.
    return FakeKubelet("/nonexistent", default_node(), seed=seed)


def _inv(k: FakeKubelet, *, known: bool = True) -> Inventory:
    return build(k.allocatable_response() if known else None, k.list_response())


def _kinds(changes: Iterable[Change]) -> set[tuple[str, str]]:
    return {(c.kind.value, c.severity.value) for c in changes}


def _one(changes: Iterable[Change], kind: Kind) -> Change:
    found = [c for c in changes if c.kind is kind]
    assert len(found) == 1, found
    return found[0]


def _gpus(k: FakeKubelet, pod: tuple[str, str], container: str) -> list[str]:
    return k.node.pods[pod].container(container).devices[GPU]


def _free_gpu(k: FakeKubelet) -> str:
    held = {d for p in k.node.pods.values() for c in p.containers for d in c.devices.get(GPU, [])}
    return sorted(d for r, d in k.node.devices if r == GPU and d not in held)[0]


def _assert_json_ready(value: Any) -> None:
    if isinstance(value, dict):
        assert all(isinstance(key, str) for key in value)
        for v in value.values():
            _assert_json_ready(v)
    elif isinstance(value, list):
        for v in value:
            _assert_json_ready(v)
    else:
        assert value is None or isinstance(value, (str, int, bool)), type(value)


def _assert_well_formed(changes: tuple[Change, ...]) -> None:
    ranks = [KIND_ORDER.index(c.kind) for c in changes]
    assert ranks == sorted(ranks)
    for c in changes:
        assert c.kind in DIFF_KINDS
        assert c.summary and "\n" not in c.summary
        details = dict(c.details)
        _assert_json_ready(details)
        assert json.loads(json.dumps(details)) == details


# --- nothing changed ---


def test_identical_inventories_give_nothing() -> None:
    inv = _inv(_kubelet())
    assert diff(inv, inv) == ()
    listed = _inv(_kubelet(), known=False)
    assert diff(listed, listed) == ()


def test_rebuilt_shuffled_responses_give_nothing() -> None:
    k = _kubelet(seed=1)
    k.make_unhealthy(GPU, _gpus(k, ("ml", "trainer-0"), "trainer")[0])
    first = _inv(k)
    for seed in range(2, 6):
        other = FakeKubelet("/nonexistent", k.node, seed=seed)
        again = _inv(other)
        assert again is not first and again == first
        assert diff(first, again) == ()


def test_split_and_reordered_protobuf_entries_give_nothing() -> None:
    def topo(*nodes: int) -> api_pb2.TopologyInfo:
        return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in nodes])

    one = api_pb2.AllocatableResourcesResponse(
        devices=[api_pb2.ContainerDevices(resource_name=GPU, device_ids=["a", "b"], topology=topo(0, 1))],
        cpu_ids=[1, 2, 3],
        memory=[api_pb2.ContainerMemory(memory_type="memory", size=4 * GIB, topology=topo(0))],
    )
    other = api_pb2.AllocatableResourcesResponse(
        devices=[
            api_pb2.ContainerDevices(resource_name=GPU, device_ids=["b"], topology=topo(1)),
            api_pb2.ContainerDevices(resource_name=GPU, device_ids=["a"], topology=topo(1)),
            api_pb2.ContainerDevices(resource_name=GPU, device_ids=["b", "a"], topology=topo(0)),
        ],
        cpu_ids=[3, 1, 2, 2],
        memory=[
            api_pb2.ContainerMemory(memory_type="memory", size=GIB, topology=topo(0)),
            api_pb2.ContainerMemory(memory_type="memory", size=3 * GIB, topology=topo(0)),
        ],
    )
    empty = api_pb2.ListPodResourcesResponse()
    assert diff(build(one, empty), build(other, empty)) == ()


# --- devices ---


def test_hot_plug() -> None:
    k = _kubelet()
    before = _inv(k)
    k.add_device(GPU, "GPU-new", (1,))
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("device.added", "info"), ("capacity.changed", "info")}
    _assert_well_formed(changes)
    added = _one(changes, Kind.DEVICE_ADDED)
    assert dict(added.details) == {"resource": GPU, "device": "GPU-new", "numa": [1]}
    assert "GPU-new" in added.summary
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["resource"] == GPU
    assert cap.details["before"] == {"allocatable": 8, "allocated": 5, "free": 3, "unavailable": 0}
    assert cap.details["after"] == {"allocatable": 9, "allocated": 5, "free": 4, "unavailable": 0}
    assert cap.details["per_numa"] == [
        {
            "numa": 1,
            "before": {"allocatable": 4, "allocated": 1, "free": 3},
            "after": {"allocatable": 5, "allocated": 1, "free": 4},
        }
    ]
    assert cap.summary == f"{GPU} free 3 -> 4 (allocatable 8 -> 9, allocated 5 -> 5)"


def test_unplug_of_a_free_device() -> None:
    k = _kubelet()
    before = _inv(k)
    k.remove_device(FUSE, "fuse2")
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("device.removed", "warning"), ("capacity.changed", "info")}
    removed = _one(changes, Kind.DEVICE_REMOVED)
    assert dict(removed.details) == {
        "resource": FUSE,
        "device": "fuse2",
        "numa": [],
        "allocated_to": [],
        "namespaces": [],
    }
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["per_numa"] == [
        {
            "numa": None,
            "before": {"allocatable": 4, "allocated": 0, "free": 4},
            "after": {"allocatable": 3, "allocated": 0, "free": 3},
        }
    ]


def test_health_loss_of_an_allocated_device_is_critical_and_names_the_pod() -> None:
    k = _kubelet()
    gpu = _gpus(k, ("ml", "trainer-0"), "trainer")[2]
    before = _inv(k)
    k.make_unhealthy(GPU, gpu)
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("device.removed", "critical"), ("capacity.changed", "info")}
    _assert_well_formed(changes)
    removed = _one(changes, Kind.DEVICE_REMOVED)
    assert dict(removed.details) == {
        "resource": GPU,
        "device": gpu,
        "numa": [0],
        "allocated_to": ["ml/trainer-0/trainer"],
        "namespaces": ["ml"],
    }
    assert removed.summary == (
        f"{GPU} {gpu} left allocatable while allocated to ml/trainer-0/trainer (unhealthy or unplugged)"
    )
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["after"] == {"allocatable": 7, "allocated": 5, "free": 3, "unavailable": 1}
    assert "unavailable 0 -> 1" in cap.summary


def test_healing() -> None:
    k = _kubelet()
    gpu = _gpus(k, ("ml", "trainer-0"), "trainer")[0]
    k.make_unhealthy(GPU, gpu)
    before = _inv(k)
    k.heal(GPU, gpu)
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("device.added", "info"), ("capacity.changed", "info")}
    assert dict(_one(changes, Kind.DEVICE_ADDED).details) == {"resource": GPU, "device": gpu, "numa": [0]}
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert (cap.details["before"]["unavailable"], cap.details["after"]["unavailable"]) == (1, 0)


def test_topology_change() -> None:
    k = _kubelet()
    before = _inv(k)
    k.add_device(NIC, "0000:3b:02.2", (0, 1))  # re-registered with a different topology
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("device.topology_changed", "warning"), ("capacity.changed", "info")}
    moved = _one(changes, Kind.DEVICE_TOPOLOGY_CHANGED)
    assert dict(moved.details) == {
        "resource": NIC,
        "device": "0000:3b:02.2",
        "numa_before": [0],
        "numa_after": [0, 1],
    }
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["before"] == cap.details["after"]  # totals unchanged, per-NUMA moved
    assert [n["numa"] for n in cap.details["per_numa"]] == [1]
    assert "per-NUMA figures changed on NUMA 1" in cap.summary


# --- CPUs and memory ---


def test_cpu_change_across_restart() -> None:
    k = _kubelet()
    before = _inv(k)
    # What FakeKubelet.restart(cpu_ids=...) does between stop and start.
    k.node.cpu_ids = (k.node.cpu_ids - {90, 91, 92}) | {0, 48}
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {
        ("cpu.removed", "warning"),
        ("cpu.added", "info"),
        ("capacity.changed", "info"),
    }
    assert [c.kind for c in changes] == [Kind.CPU_REMOVED, Kind.CPU_ADDED, Kind.CAPACITY_CHANGED]
    assert dict(changes[0].details) == {
        "resource": "cpu",
        "cpu_ids": [90, 91, 92],
        "cpuset": "90-92",
        "count": 3,
        "allocatable_before": 92,
        "allocatable_after": 91,
        "allocated_to": [],
    }
    assert dict(changes[1].details) == {
        "resource": "cpu",
        "cpu_ids": [0, 48],
        "cpuset": "0,48",
        "count": 2,
        "allocatable_before": 92,
        "allocatable_after": 91,
    }
    assert dict(changes[2].details) == {
        "resource": "cpu",
        "before": {"allocatable": 92, "allocated": 24, "free": 68, "unavailable": 0},
        "after": {"allocatable": 91, "allocated": 24, "free": 67, "unavailable": 0},
        "per_numa": [],
    }


def test_removing_an_allocated_cpu_is_critical() -> None:
    k = _kubelet()
    before = _inv(k)
    k.node.cpu_ids -= {17, 18}
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("cpu.removed", "critical"), ("capacity.changed", "info")}
    removed = _one(changes, Kind.CPU_REMOVED)
    assert removed.details["allocated_to"] == ["ml/trainer-0/trainer", "net/dpdk-router/router"]
    assert "ml/trainer-0/trainer" in removed.summary


def test_memory_change() -> None:
    k = _kubelet()
    before = _inv(k)
    for m in k.node.memory:
        if m.type == "hugepages-1Gi" and m.numa == (1,):
            m.size = 16 * GIB
    k.node.memory.append(FakeMemory("hugepages-2Mi", GIB, (2,)))
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {
        ("memory.changed", "warning"),
        ("memory.changed", "info"),
        ("capacity.changed", "info"),
    }
    assert [(c.kind.value, c.details["resource"]) for c in changes] == [
        ("memory.changed", "hugepages-1Gi"),
        ("memory.changed", "hugepages-2Mi"),
        ("capacity.changed", "hugepages-1Gi"),
        ("capacity.changed", "hugepages-2Mi"),
    ]
    assert dict(changes[0].details) == {
        "resource": "hugepages-1Gi",
        "changes": [{"numa": [1], "before": 32 * GIB, "after": 16 * GIB}],
    }
    assert dict(changes[1].details) == {
        "resource": "hugepages-2Mi",
        "changes": [{"numa": [2], "before": 0, "after": GIB}],
    }
    cap = changes[3]
    assert cap.details["per_numa"] == [
        {
            "numa": [2],
            "before": {"allocatable": 0, "allocated": 0, "free": 0},
            "after": {"allocatable": GIB, "allocated": 0, "free": GIB},
        }
    ]
    assert (
        cap.summary == "hugepages-2Mi free 4 GiB -> 5 GiB (allocatable 4 GiB -> 5 GiB, allocated 0 B -> 0 B)"
    )


# --- allocations ---


def test_allocation_of_a_new_pod_with_a_nic() -> None:
    k = _kubelet()
    before = _inv(k)
    k.allocate("net", "fw-0", "fw", devices={NIC: ["0000:3b:02.2"]})
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("allocation.added", "info"), ("capacity.changed", "info")}
    added = _one(changes, Kind.ALLOCATION_ADDED)
    assert dict(added.details) == {
        "namespace": "net",
        "pod": "fw-0",
        "container": "fw",
        "resources": [NIC],
        "devices": {NIC: ["0000:3b:02.2"]},
        "cpu_ids": [],
        "cpuset": "",
        "memory": [],
        "claims": [],
    }
    assert "net/fw-0/fw" in added.summary and "0000:3b:02.2" in added.summary
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["resource"] == NIC


def test_release() -> None:
    k = _kubelet()
    gpu = _gpus(k, ("ml", "inference-7f9c"), "server")[0]
    before = _inv(k)
    k.free("ml", "inference-7f9c")
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("allocation.removed", "info"), ("capacity.changed", "info")}
    removed = _one(changes, Kind.ALLOCATION_REMOVED)
    assert dict(removed.details) == {
        "namespace": "ml",
        "pod": "inference-7f9c",
        "container": "server",
        "resources": ["cpu", NIC, GPU],
        "devices": {NIC: ["0000:86:02.0"], GPU: [gpu]},
        "cpu_ids": [50, 51, 52, 53],
        "cpuset": "50-53",
        "memory": [],
        "claims": [],
    }
    assert [c.details["resource"] for c in changes if c.kind is Kind.CAPACITY_CHANGED] == ["cpu", NIC, GPU]


def test_a_container_gaining_a_device() -> None:
    k = _kubelet()
    before = _inv(k)
    k.allocate("net", "dpdk-router", "router", devices={FUSE: ["fuse1"]}, cpu_ids=[22])
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("allocation.changed", "info"), ("capacity.changed", "info")}
    changed = _one(changes, Kind.ALLOCATION_CHANGED)
    assert dict(changed.details) == {
        "namespace": "net",
        "pod": "dpdk-router",
        "container": "router",
        "resources": ["cpu", FUSE],
        "gained": {"devices": {FUSE: ["fuse1"]}, "cpu_ids": [22], "memory": [], "claims": []},
        "lost": {"devices": {}, "cpu_ids": [], "memory": [], "claims": []},
    }
    assert (
        changed.summary
        == "net/dpdk-router/router allocation changed: gained smarter-devices/fuse fuse1, CPUs 22"
    )


def test_container_memory_and_claim_changes() -> None:
    k = _kubelet()
    before = _inv(k)
    trainer = k.node.pods[("ml", "trainer-0")].container("trainer")
    trainer.memory = [FakeMemory("memory", 48 * GIB, (0,)), FakeMemory("hugepages-1Gi", 8 * GIB, (0,))]
    app = k.node.pods[("dra", "claimed-gpu")].container("app")
    app.claims[0].devices.append(
        FakeClaimDevice("gpu.example.com", "node-a", "gpu-9", ["gpu.example.com/gpu=gpu-9"])
    )
    changes = diff(before, _inv(k))
    # No capacity.changed: the pod-level 64 GiB still overlaps the container and counts as the larger.
    assert [c.kind for c in changes] == [Kind.ALLOCATION_CHANGED, Kind.ALLOCATION_CHANGED]
    claim, memory = changes[0], changes[1]
    assert claim.details["resources"] == ["gpu.example.com"]
    assert claim.details["gained"]["claims"] == [
        {
            "namespace": "dra",
            "name": "gpu-claim",
            "devices": [
                {
                    "driver": "gpu.example.com",
                    "pool": "node-a",
                    "device": "gpu-9",
                    "cdi_devices": ["gpu.example.com/gpu=gpu-9"],
                    "share_id": None,
                }
            ],
        }
    ]
    assert claim.details["lost"]["claims"] == []
    assert memory.details["resources"] == ["memory"]
    assert memory.details["lost"]["memory"] == [{"type": "memory", "numa": [0], "size": 16 * GIB}]
    assert memory.details["gained"]["memory"] == []
    _assert_well_formed(changes)


def test_sidecar_gaining_its_first_device_is_an_added_allocation() -> None:
    k = _kubelet()
    before = _inv(k)
    k.allocate("ml", "trainer-0", "log-shipper", devices={FUSE: ["fuse0"]})
    changes = diff(before, _inv(k))
    assert _kinds(changes) == {("allocation.added", "info"), ("capacity.changed", "info")}
    assert _one(changes, Kind.ALLOCATION_ADDED).details["container"] == "log-shipper"


def test_pods_without_exclusive_resources_never_produce_events() -> None:
    k = _kubelet()
    before = _inv(k)
    k.free("kube-system", "node-exporter-x2x9q")
    k.add_pod(FakePod("web", "nginx", []))
    k.allocate("web", "frontend", "nginx")  # a container holding nothing
    after = _inv(k)
    assert before.content_hash != after.content_hash
    assert diff(before, after) == ()


def test_pod_level_values_are_not_allocations() -> None:
    k = _kubelet()
    before = _inv(k)
    pod = k.node.pods[("ml", "trainer-0")]
    pod.cpu_ids = pod.cpu_ids - {17}  # still covered by the container: no figure moves
    assert diff(before, _inv(k)) == ()
    pod.cpu_ids = pod.cpu_ids | {40}  # pod-level only: only the CPU figures move
    changes = diff(before, _inv(k))
    assert [(c.kind, c.details["resource"]) for c in changes] == [(Kind.CAPACITY_CHANGED, "cpu")]


def test_dra_claim_allocation_added() -> None:
    k = _kubelet()
    before = _inv(k)
    claim = FakeClaim(
        "dra", "nic-claim", [FakeClaimDevice("nic.example.com", "pool", "eth7", share_id="s-1")]
    )
    k.node.add_pod(FakePod("dra", "claimer", []))
    k.node.pods[("dra", "claimer")].container("main").claims.append(claim)
    changes = diff(before, _inv(k))
    assert [c.kind for c in changes] == [Kind.ALLOCATION_ADDED]
    details = dict(changes[0].details)
    assert details["resources"] == ["nic.example.com"]
    assert details["claims"] == [
        {
            "namespace": "dra",
            "name": "nic-claim",
            "devices": [
                {
                    "driver": "nic.example.com",
                    "pool": "pool",
                    "device": "eth7",
                    "cdi_devices": [],
                    "share_id": "s-1",
                }
            ],
        }
    ]
    assert "claim dra/nic-claim" in changes[0].summary


# --- List-only mode ---


def test_list_only_mode_suppresses_the_allocatable_side() -> None:
    k = _kubelet()
    full_before, list_before = _inv(k), _inv(k, known=False)
    k.add_device(GPU, "GPU-new", (1,))
    k.make_unhealthy(GPU, _gpus(k, ("ml", "trainer-0"), "trainer")[0])
    k.node.cpu_ids -= {95}
    k.node.memory.pop()
    assert diff(list_before, _inv(k, known=False)) == ()
    # One side unknown (the API degraded or came back): still nothing from the allocatable side.
    assert diff(full_before, _inv(k, known=False)) == ()
    assert diff(list_before, _inv(k)) == ()
    assert diff(full_before, _inv(k)) != ()


def test_list_only_mode_still_reports_allocations() -> None:
    k = _kubelet()
    before = _inv(k, known=False)
    k.allocate("net", "fw-0", "fw", devices={NIC: ["0000:3b:02.2"]})
    changes = diff(before, _inv(k, known=False))
    assert _kinds(changes) == {("allocation.added", "info"), ("capacity.changed", "info")}
    cap = _one(changes, Kind.CAPACITY_CHANGED)
    assert cap.details["before"] == {"allocatable": None, "allocated": 3, "free": None, "unavailable": 0}
    assert cap.details["after"] == {"allocatable": None, "allocated": 4, "free": None, "unavailable": 0}
    assert cap.summary == f"{NIC} allocated 3 -> 4 (allocatable unknown)"
    _assert_well_formed(changes)


# --- order, JSON, summary ---


def test_everything_at_once_is_ordered_and_json_ready() -> None:
    k = _kubelet()
    before = _inv(k)
    k.add_device(GPU, "GPU-new", (1,))
    k.remove_device(FUSE, "fuse3")
    k.make_unhealthy(GPU, _gpus(k, ("ml", "trainer-0"), "trainer")[1])
    k.add_device(NIC, "0000:86:02.2", (0,))
    k.node.cpu_ids = (k.node.cpu_ids - {2}) | {0}
    k.node.memory[0].size += GIB
    k.free("net", "dpdk-router")
    k.allocate(
        "web", "cache", "redis", cpu_ids=[70, 71], memory=[FakeMemory("hugepages-2Mi", 512 * 1024**2, (1,))]
    )
    k.allocate("ml", "inference-7f9c", "server", devices={GPU: [_free_gpu(k)]})
    changes = diff(before, _inv(k))
    _assert_well_formed(changes)
    assert {c.kind for c in changes} == set(KIND_ORDER)
    capacity = [c.details["resource"] for c in changes if c.kind is Kind.CAPACITY_CHANGED]
    assert capacity == sorted(capacity)
    removed = [c.details["device"] for c in changes if c.kind is Kind.DEVICE_REMOVED]
    assert removed == sorted(removed)
    assert diff(before, _inv(k)) == changes  # deterministic


def test_inventory_summary() -> None:
    k = _kubelet()
    gpu = _gpus(k, ("ml", "trainer-0"), "trainer")[0]
    k.make_unhealthy(GPU, gpu)
    inv = _inv(k)
    summary = inventory_summary(inv)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["hash"] == inv.content_hash
    assert summary["allocatable_known"] is True
    assert summary["devices"] == {NIC: 6, GPU: 7, FUSE: 4}
    assert summary["free"] == {NIC: 3, GPU: 3, FUSE: 4}
    assert summary["cpus"] == {"allocatable": 92, "allocated": 24, "free": 68}
    assert summary["memory"] == {"memory": 360 * GIB, "hugepages-1Gi": 64 * GIB, "hugepages-2Mi": 4 * GIB}
    assert (summary["pods"], summary["containers"]) == (5, 7)
    assert summary["missing_devices"] == [
        {"resource": GPU, "device": gpu, "allocated_to": ["ml/trainer-0/trainer"]}
    ]
    listed = inventory_summary(_inv(k, known=False))
    assert listed["allocatable_known"] is False
    assert listed["free"] == {NIC: None, GPU: None}
    assert listed["missing_devices"] == []


# --- property ---

_RESOURCES = (GPU, NIC, FUSE, "example.com/new")
_NUMA = st.sampled_from([(), (0,), (1,), (0, 1)])
_mutation = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(_RESOURCES), st.sampled_from(["d0", "d1", "fuse0"]), _NUMA),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("unhealthy"), st.integers(0, 50)),
    st.tuples(st.just("heal"), st.integers(0, 50)),
    st.tuples(
        st.just("allocate"),
        st.sampled_from([("ml", "trainer-0"), ("net", "dpdk-router"), ("t", "p0"), ("t", "p1")]),
        st.sampled_from(["trainer", "router", "envoy", "c"]),
        st.integers(0, 50),
        st.frozensets(st.integers(0, 95), max_size=3),
        st.sampled_from([0, GIB, 2 * GIB]),
    ),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("cpus"), st.frozensets(st.integers(0, 97), min_size=1, max_size=4)),
    st.tuples(st.just("memory"), st.integers(0, 5), st.sampled_from([GIB, 2 * GIB, 180 * GIB])),
)


def _apply(k: FakeKubelet, mutation: tuple[Any, ...]) -> None:
    node = k.node
    devices = sorted(node.devices)
    op = mutation[0]
    if op == "add":
        k.add_device(mutation[1], mutation[2], mutation[3])
    elif op in ("remove", "unhealthy", "heal") and devices:
        res, dev_id = devices[mutation[1] % len(devices)]
        {"remove": k.remove_device, "unhealthy": k.make_unhealthy, "heal": k.heal}[op](res, dev_id)
    elif op == "allocate":
        (ns, pod), container, index, cpus, mem = mutation[1:]
        res, dev_id = devices[index % len(devices)] if devices else (GPU, "ghost")
        memory = [FakeMemory("memory", mem, (0,))] if mem else []
        k.allocate(ns, pod, container, devices={res: [dev_id]}, cpu_ids=cpus, memory=memory)
    elif op == "free":
        # Only pods that hold something: the others are invisible to diff by design.
        holding = sorted(
            key
            for key, p in node.pods.items()
            if any(c.devices or c.cpu_ids or c.memory or c.claims for c in p.containers)
        )
        if holding:
            k.free(*holding[mutation[1] % len(holding)])
    elif op == "cpus":
        node.cpu_ids ^= set(mutation[1])
    elif op == "memory":
        node.memory[mutation[1] % len(node.memory)].size = mutation[2]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.lists(_mutation, max_size=3),
    second=st.lists(_mutation, max_size=4),
    known=st.booleans(),
)
def test_diff_is_empty_exactly_when_nothing_changed(
    first: list[tuple[Any, ...]], second: list[tuple[Any, ...]], known: bool
) -> None:
    k = _kubelet()
    for m in first:
        _apply(k, m)
    a = _inv(k, known=known)
    assert diff(a, a) == ()
    assert diff(a, _inv(k, known=known)) == ()  # a fresh, reshuffled build
    for m in second:
        _apply(k, m)
    b = _inv(k, known=known)
    changes = diff(a, b)
    assert (changes == ()) == (a.content_hash == b.content_hash)
    assert (diff(b, a) == ()) == (changes == ())
    _assert_well_formed(changes)
    keys = [(c.kind, json.dumps(dict(c.details), sort_keys=True)) for c in changes]
    assert len(set(keys)) == len(keys)  # nothing reported twice
