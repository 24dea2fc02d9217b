"""What changed between two inventories, as `Change` records. Pure: no I/O, no asyncio, no gRPC.

`diff()` compares two normalized inventories and reports every real change
exactly once, in a fixed order: by kind (see `KIND_ORDER`), then by the
kind's keys. Equal inventories give `()`; the model is normalized, so the
order of the kubelet's answers never shows up as a change.

This module compares the allocatable side (devices, CPUs, memory); holdings
are compared in `watcher.model.allocation_changes` and the capacity figures in
`watcher.model.capacity_changes`. When either side comes from List-only mode
(`allocatable_known` False), nothing about the allocatable side is compared: no
device, CPU or memory events, and capacity compares only what is allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from watcher.model.allocation_changes import allocation_changes
from watcher.model.capacity_changes import capacity_changes
from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import Inventory
from watcher.model.records import NumaNodes
from watcher.model.wording import Keyed, SortKey, bytes_text, cpuset_string, make_change, numa_text

__all__ = ["KIND_ORDER", "diff", "inventory_summary"]

KIND_ORDER: tuple[Kind, ...] = (
    Kind.DEVICE_REMOVED,
    Kind.DEVICE_ADDED,
    Kind.DEVICE_TOPOLOGY_CHANGED,
    Kind.CPU_REMOVED,
    Kind.CPU_ADDED,
    Kind.MEMORY_CHANGED,
    Kind.ALLOCATION_REMOVED,
    Kind.ALLOCATION_ADDED,
    Kind.ALLOCATION_CHANGED,
    Kind.CAPACITY_CHANGED,
)
_KIND_RANK = {kind: i for i, kind in enumerate(KIND_ORDER)}


def diff(before: Inventory, after: Inventory) -> tuple[Change, ...]:
    """Every change from `before` to `after`, each once, in `KIND_ORDER` then by key."""
    # The hashes are computed anyway (state, events); a deep == would walk everything twice.
    if before is after or before.content_hash == after.content_hash:
        return ()
    keyed: list[tuple[int, SortKey, Change]] = []
    producers: list[Callable[[Inventory, Inventory], list[Keyed]]] = [allocation_changes]
    if before.allocatable_known and after.allocatable_known:
        producers += [_device_changes, _cpu_changes, _memory_changes]
    producers.append(capacity_changes)
    for produce in producers:
        keyed.extend((_KIND_RANK[change.kind], key, change) for key, change in produce(before, after))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return tuple(change for _, _, change in keyed)


def inventory_summary(inv: Inventory) -> dict[str, Any]:
    """A short JSON-ready overview of an inventory (for logs, the watcher.started event, the CLI)."""
    memory: dict[str, int | None] = {}
    for m in inv.memory_capacity:
        total = memory.get(m.type, 0)
        memory[m.type] = None if total is None or m.allocatable is None else total + m.allocatable
    cpus = inv.cpus
    return {
        "hash": inv.content_hash,
        "allocatable_known": inv.allocatable_known,
        "devices": {c.resource: c.allocatable for c in inv.capacity},
        "free": {c.resource: c.free for c in inv.capacity},
        "cpus": {"allocatable": cpus.allocatable, "allocated": cpus.allocated, "free": cpus.free},
        "memory": memory,
        "pods": len(inv.pods),
        "containers": sum(len(p.containers) for p in inv.pods),
        "missing_devices": [
            {"resource": m.resource, "device": m.id, "allocated_to": list(m.holders)}
            for m in inv.missing_devices
        ],
    }


# --- devices ---


def _device_changes(before: Inventory, after: Inventory) -> list[Keyed]:
    old = {(d.resource, d.id): d.numa for d in before.devices}
    new = {(d.resource, d.id): d.numa for d in after.devices}
    out: list[Keyed] = []
    for res, dev_id in sorted(old.keys() - new.keys()):
        holders = list(after.holders.get((res, dev_id), ((), ()))[0])
        if holders:
            summary = (
                f"{res} {dev_id} left allocatable while allocated to {', '.join(holders)} "
                "(unhealthy or unplugged)"
            )
        else:
            summary = f"{res} {dev_id} left allocatable (unhealthy or unplugged)"
        details = {
            "resource": res,
            "device": dev_id,
            "numa": list(old[(res, dev_id)]),
            "allocated_to": holders,
            "namespaces": sorted({h.split("/", 1)[0] for h in holders}),
        }
        severity = Severity.CRITICAL if holders else Severity.WARNING
        out.append(((res, dev_id), make_change(Kind.DEVICE_REMOVED, severity, summary, details)))
    for res, dev_id in sorted(new.keys() - old.keys()):
        numa = new[(res, dev_id)]
        summary = f"{res} {dev_id} joined allocatable on {numa_text(numa)} (hot-plugged or healed)"
        details = {"resource": res, "device": dev_id, "numa": list(numa)}
        out.append(((res, dev_id), make_change(Kind.DEVICE_ADDED, Severity.INFO, summary, details)))
    for res, dev_id in sorted(old.keys() & new.keys()):
        was, now = old[(res, dev_id)], new[(res, dev_id)]
        if was == now:
            continue
        summary = f"{res} {dev_id} moved from {numa_text(was)} to {numa_text(now)}"
        details = {"resource": res, "device": dev_id, "numa_before": list(was), "numa_after": list(now)}
        out.append(
            ((res, dev_id), make_change(Kind.DEVICE_TOPOLOGY_CHANGED, Severity.WARNING, summary, details))
        )
    return out


# --- CPUs and memory (allocatable side) ---


def _cpu_changes(before: Inventory, after: Inventory) -> list[Keyed]:
    old, new = set(before.cpu_ids), set(after.cpu_ids)
    out: list[Keyed] = []
    removed, added = sorted(old - new), sorted(new - old)
    counts = {"allocatable_before": len(old), "allocatable_after": len(new)}
    if removed:
        holders = _cpu_holders(after, set(removed))
        details: dict[str, Any] = {
            "resource": "cpu",
            "cpu_ids": removed,
            "cpuset": cpuset_string(removed),
            "count": len(removed),
            **counts,
            "allocated_to": holders,
        }
        summary = (
            f"{len(removed)} CPUs ({cpuset_string(removed)}) left allocatable ({len(old)} -> {len(new)})"
        )
        if holders:
            summary += f" while allocated to {', '.join(holders)}"
        severity = Severity.CRITICAL if holders else Severity.WARNING
        out.append(((), make_change(Kind.CPU_REMOVED, severity, summary, details)))
    if added:
        details = {
            "resource": "cpu",
            "cpu_ids": added,
            "cpuset": cpuset_string(added),
            "count": len(added),
            **counts,
        }
        summary = f"{len(added)} CPUs ({cpuset_string(added)}) joined allocatable ({len(old)} -> {len(new)})"
        out.append(((), make_change(Kind.CPU_ADDED, Severity.INFO, summary, details)))
    return out


def _cpu_holders(inv: Inventory, cpus: set[int]) -> list[str]:
    """Containers ("ns/pod/container") holding any of `cpus`; "ns/pod" for pod-level-only holdings."""
    holders: list[str] = []
    for pod in inv.pods:
        covered: set[int] = set()
        for c in pod.containers:
            if cpus.intersection(c.cpu_ids):
                holders.append(f"{pod.namespace}/{pod.name}/{c.name}")
                covered.update(c.cpu_ids)
        if (cpus & set(pod.cpu_ids)) - covered:
            holders.append(pod.key)
    return sorted(holders)


def _memory_changes(before: Inventory, after: Inventory) -> list[Keyed]:
    out: list[Keyed] = []
    old = _blocks_by_type(before)
    new = _blocks_by_type(after)
    for mtype in sorted(old.keys() | new.keys()):
        was, now = old.get(mtype, {}), new.get(mtype, {})
        moved = [
            (numa, was.get(numa, 0), now.get(numa, 0))
            for numa in sorted(was.keys() | now.keys())
            if was.get(numa, 0) != now.get(numa, 0)
        ]
        if not moved:
            continue
        changes = [{"numa": list(numa), "before": b, "after": a} for numa, b, a in moved]
        decreased = any(a < b for _, b, a in moved)
        parts = [f"{numa_text(numa)} {bytes_text(b)} -> {bytes_text(a)}" for numa, b, a in moved]
        summary = f"allocatable {mtype} changed: {', '.join(parts)}"
        severity = Severity.WARNING if decreased else Severity.INFO
        details = {"resource": mtype, "changes": changes}
        out.append(((mtype,), make_change(Kind.MEMORY_CHANGED, severity, summary, details)))
    return out


def _blocks_by_type(inv: Inventory) -> dict[str, dict[NumaNodes, int]]:
    out: dict[str, dict[NumaNodes, int]] = {}
    for m in inv.memory:
        blocks = out.setdefault(m.type, {})
        blocks[m.numa] = blocks.get(m.numa, 0) + m.size
    return out
