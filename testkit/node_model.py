"""A random abstract node for the property tests, and an Inventory read back as one.

A `Model` says what a node has (allocatable devices, CPUs, memory) and what its pods and containers
hold, free of how the kubelet orders or splits it; `models()` draws them (hypothesis), and
`testkit.node_rendering` renders one into kubelet responses many ways.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from watcher.model.inventory import Inventory

__all__ = [
    "FAST",
    "ClaimDev",
    "ClaimKey",
    "DevKey",
    "MContainer",
    "MPod",
    "MemKey",
    "Model",
    "Numa",
    "as_model",
    "claim_devices",
    "models",
]

# --- the abstract node ---

Numa = tuple[int, ...]  # sorted, unique
DevKey = tuple[str, str]  # (resource, device id)
MemKey = tuple[str, Numa]  # (memory type, NUMA nodes)
ClaimDev = tuple[str, str, str, frozenset[str], str | None]  # driver, pool, device, CDI names, share_id
ClaimKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass(frozen=True)
class MContainer:
    devices: dict[DevKey, Numa]
    cpu_ids: frozenset[int]
    memory: dict[MemKey, int]
    claims: dict[ClaimKey, frozenset[ClaimDev]]


@dataclasses.dataclass(frozen=True)
class MPod:
    containers: dict[str, MContainer]
    cpu_ids: frozenset[int]
    memory: dict[MemKey, int]


@dataclasses.dataclass(frozen=True)
class Model:
    known: bool
    devices: dict[DevKey, Numa]
    cpu_ids: frozenset[int]
    memory: dict[MemKey, int]
    pods: dict[tuple[str, str], MPod]


# --- strategies ---

RESOURCES = ("nvidia.com/gpu", "intel.com/sriov_netdevice", "smarter-devices/fuse")
MEMORY_TYPES = ("memory", "hugepages-1Gi", "hugepages-2Mi")
NAMESPACES = ("default", "ml", "kube-system")

numa_nodes = st.lists(st.integers(0, 3), max_size=2, unique=True).map(lambda ns: tuple(sorted(ns)))
# A small alphabet so pods often hold allocatable devices (and sometimes ones that are not).
device_ids = st.sampled_from(("0000:3b:02.0", "0000:3b:02.1", "GPU-a", "GPU-b", "fuse0", "d1", "d2", "é"))
names = st.text(alphabet="abcxyz-0é", min_size=1, max_size=3)
cpu_sets = st.frozensets(st.integers(0, 63), max_size=10)
sizes = st.integers(0, 2**40)


def memory_blocks(max_size: int) -> st.SearchStrategy[dict[MemKey, int]]:
    return st.dictionaries(st.tuples(st.sampled_from(MEMORY_TYPES), numa_nodes), sizes, max_size=max_size)


def device_maps(max_size: int) -> st.SearchStrategy[dict[DevKey, Numa]]:
    return st.dictionaries(st.tuples(st.sampled_from(RESOURCES), device_ids), numa_nodes, max_size=max_size)


claim_devices: st.SearchStrategy[ClaimDev] = st.tuples(
    st.sampled_from(("gpu.example.com", "nic.example.com")),
    st.sampled_from(("pool-a", "pool-b")),
    names,
    st.frozensets(st.sampled_from(("v.com/c=a", "v.com/c=b", "v.com/c=c")), max_size=3),
    # Unset, set but empty, set (NUL included: it once tied with unset in the sort).
    st.none() | st.just("") | st.text(alphabet="0123abcdef-\x00", min_size=1, max_size=4),
)

containers = st.builds(
    MContainer,
    devices=device_maps(4),
    cpu_ids=cpu_sets,
    memory=memory_blocks(2),
    claims=st.dictionaries(
        st.tuples(st.sampled_from(NAMESPACES), names), st.frozensets(claim_devices, max_size=3), max_size=2
    ),
)

pods = st.builds(
    MPod,
    containers=st.dictionaries(names, containers, max_size=3),
    cpu_ids=cpu_sets,
    memory=memory_blocks(2),
)


@st.composite
def models(draw: st.DrawFn, known: bool | None = None) -> Model:
    is_known = draw(st.booleans()) if known is None else known
    return Model(
        known=is_known,
        devices=draw(device_maps(10)) if is_known else {},
        cpu_ids=draw(cpu_sets) if is_known else frozenset(),
        memory=draw(memory_blocks(4)) if is_known else {},
        pods=draw(st.dictionaries(st.tuples(st.sampled_from(NAMESPACES), names), pods, max_size=4)),
    )


# --- reading an Inventory back as a model ---


def as_model(inv: Inventory) -> Model:
    def devices(ds: Iterable[Any]) -> dict[DevKey, Numa]:
        return {(d.resource, d.id): d.numa for d in ds}

    def memory(ms: Iterable[Any]) -> dict[MemKey, int]:
        return {(m.type, m.numa): m.size for m in ms}

    return Model(
        known=inv.allocatable_known,
        devices=devices(inv.devices),
        cpu_ids=frozenset(inv.cpu_ids),
        memory=memory(inv.memory),
        pods={
            (p.namespace, p.name): MPod(
                containers={
                    c.name: MContainer(
                        devices=devices(c.devices),
                        cpu_ids=frozenset(c.cpu_ids),
                        memory=memory(c.memory),
                        claims={
                            (cl.namespace, cl.name): frozenset(
                                (d.driver, d.pool, d.device, frozenset(d.cdi_devices), d.share_id)
                                for d in cl.devices
                            )
                            for cl in c.claims
                        },
                    )
                    for c in p.containers
                },
                cpu_ids=frozenset(p.cpu_ids),
                memory=memory(p.memory),
            )
            for p in inv.pods
        },
    )


# Sized to keep the whole file well under 20 s; the order/split property gets the most examples.
# The explain phase is skipped: on these nested models it can take longer than pytest's timeout.
FAST = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
