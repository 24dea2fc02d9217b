"""Property tests: the inventory depends on what the kubelet says, never on how it orders or splits it.

A random abstract node (`Model`) is rendered into protobuf responses many ways: every repeated field
at every level shuffled, device entries regrouped (one entry per device per NUMA node, several ids in
one entry, one entry naming several NUMA nodes), memory blocks split, pods, containers and claims split
across several entries with the same key. Every rendering must build the same Inventory with the same
content hash, and that Inventory must say exactly what the model says.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import defaultdict

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from testkit.node_model import FAST, ClaimDev, DevKey, MemKey, Model, as_model, claim_devices, models
from testkit.node_mutations import MUTATIONS
from testkit.node_rendering import build_from, render_claim_resource, shuffled
from watcher.kubeletapi.v1 import api_pb2
from watcher.model import build as building
from watcher.model.build import build
from watcher.model.inventory import Inventory
from watcher.model.records import ClaimDevice
from watcher.model.restore import from_canonical

# --- properties ---

THOROUGH = settings(FAST, max_examples=200)


@THOROUGH
@given(model=models(), rng=st.randoms(use_true_random=True))
def test_hash_is_independent_of_order_and_splitting(model: Model, rng: random.Random) -> None:
    one = build_from(model, random.Random(rng.getrandbits(64)))
    two = build_from(model, random.Random(rng.getrandbits(64)))
    assert one == two
    assert one.canonical_bytes == two.canonical_bytes
    assert one.content_hash == two.content_hash


@FAST
@given(model=models(), rng=st.randoms(use_true_random=True))
def test_inventory_says_exactly_what_the_node_says(model: Model, rng: random.Random) -> None:
    inv = build_from(model, rng)
    assert as_model(inv) == model
    # Everything comes out sorted, whatever order it went in.
    assert list(inv.devices) == sorted(inv.devices, key=lambda d: (d.resource, d.id))
    assert list(inv.cpu_ids) == sorted(set(inv.cpu_ids))
    assert [p.key for p in inv.pods] == sorted(p.key for p in inv.pods)
    for p in inv.pods:
        assert [c.name for c in p.containers] == sorted(c.name for c in p.containers)


@FAST
@given(model=models(), rng=st.randoms(use_true_random=True))
def test_a_real_change_changes_the_hash(model: Model, rng: random.Random) -> None:
    base = build_from(model, random.Random(rng.getrandbits(64)))
    applied = 0
    for mutate in MUTATIONS:
        changed = mutate(model)
        if changed is None:
            continue
        assert changed != model, mutate.__name__
        applied += 1
        other = build_from(changed, random.Random(rng.getrandbits(64)))
        assert other != base, mutate.__name__
        assert other.content_hash != base.content_hash, mutate.__name__
    assert applied >= 1  # _pod_dropped or _known_toggled applies to any model without allocatable


@settings(FAST, max_examples=40)
@given(model=models(known=True), rng=st.randoms(use_true_random=True))
def test_removing_any_allocatable_device_changes_the_hash(model: Model, rng: random.Random) -> None:
    base = build_from(model, rng)
    hashes = {base.content_hash}
    for key in model.devices:
        smaller = dataclasses.replace(model, devices={k: v for k, v in model.devices.items() if k != key})
        hashes.add(build_from(smaller, rng).content_hash)
    assert len(hashes) == len(model.devices) + 1


@FAST
@given(model=models(), rng=st.randoms(use_true_random=True))
def test_canonical_round_trips_through_json(model: Model, rng: random.Random) -> None:
    inv = build_from(model, rng)
    # Assembled from per-pod fragments, yet byte for byte one compact dump of the whole.
    whole = json.dumps(inv.canonical, separators=(",", ":"), ensure_ascii=False).encode()
    assert inv.canonical_bytes == whole
    back = from_canonical(json.loads(inv.canonical_bytes))
    assert back == inv
    assert back.content_hash == inv.content_hash
    assert back.derived() == inv.derived()


@FAST
@given(model=models(), rng=st.randoms(use_true_random=True))
def test_capacity_arithmetic_holds(model: Model, rng: random.Random) -> None:
    inv = build_from(model, rng)
    known = model.known
    # What pods hold: (resource, id) -> the NUMA nodes the pods reported, and the holders.
    held: dict[DevKey, set[int]] = defaultdict(set)
    holders: dict[DevKey, list[str]] = defaultdict(list)
    for (ns, pod_name), p in model.pods.items():
        for c_name, c in p.containers.items():
            for key, numa in c.devices.items():
                held[key].update(numa)
                holders[key].append(f"{ns}/{pod_name}/{c_name}")

    assert [c.resource for c in inv.capacity] == sorted({r for r, _ in model.devices} | {r for r, _ in held})
    for cap in inv.capacity:
        alloc = {d: numa for (r, d), numa in model.devices.items() if r == cap.resource}
        mine = {d: tuple(sorted(numa)) for (r, d), numa in held.items() if r == cap.resource}
        assert cap.allocated == len(mine)
        assert cap.allocatable == (len(alloc) if known else None)
        assert cap.free == (len(alloc.keys() - mine.keys()) if known else None)
        assert cap.unavailable == (len(mine.keys() - alloc.keys()) if known else 0)
        # Per NUMA node: a device counts on each of its nodes; held ones on allocatable's topology.
        n_alloc: dict[int | None, int] = defaultdict(int)
        n_held: dict[int | None, int] = defaultdict(int)
        n_free: dict[int | None, int] = defaultdict(int)
        for d, numa in alloc.items():
            for node in numa or (None,):
                n_alloc[node] += 1
                n_free[node] += d not in mine
        for d, pod_numa in mine.items():
            for node in alloc.get(d, pod_numa) or (None,):
                n_held[node] += 1
        assert {n.numa: (n.allocatable, n.allocated, n.free) for n in cap.per_numa} == {
            node: (n_alloc[node] if known else None, n_held[node], n_free[node] if known else None)
            for node in n_alloc.keys() | n_held.keys()
        }
        for n in cap.per_numa:
            assert n.free is None or n.allocatable is None or 0 <= n.free <= n.allocatable

    expected_missing = sorted(k for k in held if k not in model.devices) if known else []
    assert [(m.resource, m.id) for m in inv.missing_devices] == expected_missing
    for m in inv.missing_devices:
        assert m.numa == tuple(sorted(held[(m.resource, m.id)]))
        assert m.holders == tuple(sorted(holders[(m.resource, m.id)]))

    cpus = frozenset().union(
        *(p.cpu_ids for p in model.pods.values()),
        *(c.cpu_ids for p in model.pods.values() for c in p.containers.values()),
    )
    assert inv.cpus.allocated_ids == tuple(sorted(cpus))
    assert inv.cpus.allocatable == (len(model.cpu_ids) if known else None)
    assert inv.cpus.free == (len(model.cpu_ids - cpus) if known else None)

    # Memory: per pod the larger of its pod-level value and its containers' sum, never both.
    mem_held: dict[MemKey, int] = defaultdict(int)
    for p in model.pods.values():
        per_pod: dict[MemKey, int] = defaultdict(int)
        for c in p.containers.values():
            for mkey, size in c.memory.items():
                per_pod[mkey] += size
        for mkey in per_pod.keys() | p.memory.keys():
            mem_held[mkey] += max(per_pod.get(mkey, 0), p.memory.get(mkey, 0))
    assert {(m.type, m.numa): (m.allocatable, m.allocated, m.free) for m in inv.memory_capacity} == {
        mkey: (
            model.memory.get(mkey, 0) if known else None,
            mem_held.get(mkey, 0),
            max(0, model.memory.get(mkey, 0) - mem_held.get(mkey, 0)) if known else None,
        )
        for mkey in model.memory.keys() | mem_held.keys()
    }


# --- claim devices: the order must not come from set iteration ---


class _CollidingClaimDevice(ClaimDevice):
    """Every instance hashes alike, so a set of them iterates in insertion (arrival) order.

    With real hashes that order depends on hash(None), an address in 3.11, so a tie in the sort
    key shows up only in some processes; colliding hashes make it show up every time.
    """

    __slots__ = ()

    def __hash__(self) -> int:
        return 0


def _claim_inventory(resources: list[api_pb2.ClaimResource]) -> Inventory:
    dr = api_pb2.DynamicResource(claim_name="c", claim_namespace="ns", claim_resources=resources)
    container = api_pb2.ContainerResources(name="c", dynamic_resources=[dr])
    pod = api_pb2.PodResources(namespace="ns", name="p", containers=[container])
    return build(None, api_pb2.ListPodResourcesResponse(pod_resources=[pod]))


# Regression: the sort key once mapped an unset share_id to "\0", tying it with share_id "\x00".
@example(
    devices=frozenset(
        {
            ("d.example.com", "pool", "dev", frozenset(), None),
            ("d.example.com", "pool", "dev", frozenset(), "\x00"),
        }
    ),
    rng=random.Random(0),
)
@FAST
@given(devices=st.frozensets(claim_devices, max_size=6), rng=st.randoms(use_true_random=True))
def test_claim_device_order_never_depends_on_arrival_order(
    devices: frozenset[ClaimDev], rng: random.Random
) -> None:
    resources = [render_claim_resource(rng, dev) for dev in devices]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(building, "ClaimDevice", _CollidingClaimDevice)
        forward = _claim_inventory(resources)
        backward = _claim_inventory(resources[::-1])
        reordered = _claim_inventory(shuffled(rng, resources))
    assert forward.canonical_bytes == backward.canonical_bytes == reordered.canonical_bytes
    assert forward.content_hash == backward.content_hash == reordered.content_hash
    # Colliding hashes must not merge distinct devices either.
    assert len(forward.pods[0].containers[0].claims[0].devices) == len(devices)
