"""What changed between two inventories, as `Change` records. Pure: no I/O, no asyncio, no gRPC.

`diff()` compares two normalized inventories and reports every real change
exactly once, in a fixed order: by kind (see `KIND_ORDER`), then by the
kind's keys. Equal inventories give `()`; the model is normalized, so the
order of the kubelet's answers never shows up as a change.

Holdings are compared per container. A container that holds nothing
exclusively (no devices, CPUs, memory or DRA claims) counts as absent, so pods
without exclusive resources never produce allocation events. Pod-level CPUs
and memory overlap the containers' values; they are left to the capacity
figures. When either side comes from List-only mode (`allocatable_known`
False), nothing about the allocatable side is compared: no device, CPU or
memory events, and capacity compares only what is allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import (
    Claim,
    ClaimDevice,
    Container,
    Inventory,
    NumaNodes,
    Pod,
    claim_json,
    cpuset_string,
)

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

_SortKey = tuple[Any, ...]
_Keyed = tuple[_SortKey, Change]


def diff(before: Inventory, after: Inventory) -> tuple[Change, ...]:
    """Every change from `before` to `after`, each once, in `KIND_ORDER` then by key."""
    # The hashes are computed anyway (state, events); a deep == would walk everything twice.
    if before is after or before.content_hash == after.content_hash:
        return ()
    keyed: list[tuple[int, _SortKey, Change]] = []
    producers: list[Callable[[Inventory, Inventory], list[_Keyed]]] = [_allocation_changes]
    if before.allocatable_known and after.allocatable_known:
        producers += [_device_changes, _cpu_changes, _memory_changes]
    producers.append(_capacity_changes)
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


def _device_changes(before: Inventory, after: Inventory) -> list[_Keyed]:
    old = {(d.resource, d.id): d.numa for d in before.devices}
    new = {(d.resource, d.id): d.numa for d in after.devices}
    out: list[_Keyed] = []
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
        out.append(((res, dev_id), _change(Kind.DEVICE_REMOVED, severity, summary, details)))
    for res, dev_id in sorted(new.keys() - old.keys()):
        numa = new[(res, dev_id)]
        summary = f"{res} {dev_id} joined allocatable on {_numa_text(numa)} (hot-plugged or healed)"
        details = {"resource": res, "device": dev_id, "numa": list(numa)}
        out.append(((res, dev_id), _change(Kind.DEVICE_ADDED, Severity.INFO, summary, details)))
    for res, dev_id in sorted(old.keys() & new.keys()):
        was, now = old[(res, dev_id)], new[(res, dev_id)]
        if was == now:
            continue
        summary = f"{res} {dev_id} moved from {_numa_text(was)} to {_numa_text(now)}"
        details = {"resource": res, "device": dev_id, "numa_before": list(was), "numa_after": list(now)}
        out.append(((res, dev_id), _change(Kind.DEVICE_TOPOLOGY_CHANGED, Severity.WARNING, summary, details)))
    return out


# --- CPUs and memory (allocatable side) ---


def _cpu_changes(before: Inventory, after: Inventory) -> list[_Keyed]:
    old, new = set(before.cpu_ids), set(after.cpu_ids)
    out: list[_Keyed] = []
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
        out.append(((), _change(Kind.CPU_REMOVED, severity, summary, details)))
    if added:
        details = {
            "resource": "cpu",
            "cpu_ids": added,
            "cpuset": cpuset_string(added),
            "count": len(added),
            **counts,
        }
        summary = f"{len(added)} CPUs ({cpuset_string(added)}) joined allocatable ({len(old)} -> {len(new)})"
        out.append(((), _change(Kind.CPU_ADDED, Severity.INFO, summary, details)))
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


def _memory_changes(before: Inventory, after: Inventory) -> list[_Keyed]:
    out: list[_Keyed] = []
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
        parts = [f"{_numa_text(numa)} {_bytes_text(b)} -> {_bytes_text(a)}" for numa, b, a in moved]
        summary = f"allocatable {mtype} changed: {', '.join(parts)}"
        severity = Severity.WARNING if decreased else Severity.INFO
        details = {"resource": mtype, "changes": changes}
        out.append(((mtype,), _change(Kind.MEMORY_CHANGED, severity, summary, details)))
    return out


def _blocks_by_type(inv: Inventory) -> dict[str, dict[NumaNodes, int]]:
    out: dict[str, dict[NumaNodes, int]] = {}
    for m in inv.memory:
        blocks = out.setdefault(m.type, {})
        blocks[m.numa] = blocks.get(m.numa, 0) + m.size
    return out


# --- allocations ---


@dataclass(frozen=True)
class _Holding:
    """What one container holds, in comparable form (device topology is not part of a holding)."""

    devices: frozenset[tuple[str, str]]
    cpu_ids: frozenset[int]
    memory: Mapping[tuple[str, NumaNodes], int]
    claims: Mapping[tuple[str, str], frozenset[ClaimDevice]]

    @classmethod
    def of(cls, c: Container) -> _Holding:
        memory: dict[tuple[str, NumaNodes], int] = {}
        for m in c.memory:
            memory[(m.type, m.numa)] = memory.get((m.type, m.numa), 0) + m.size
        claims: dict[tuple[str, str], frozenset[ClaimDevice]] = {}
        for cl in c.claims:
            claims[(cl.namespace, cl.name)] = claims.get((cl.namespace, cl.name), frozenset()) | set(
                cl.devices
            )
        return cls(
            devices=frozenset((d.resource, d.id) for d in c.devices),
            cpu_ids=frozenset(c.cpu_ids),
            memory=memory,
            claims=claims,
        )

    def __bool__(self) -> bool:
        return bool(self.devices or self.cpu_ids or self.memory or self.claims)


def _holdings(pods: Iterable[Pod]) -> dict[tuple[str, str, str], _Holding]:
    out: dict[tuple[str, str, str], _Holding] = {}
    for pod in pods:
        for c in pod.containers:
            holding = _Holding.of(c)
            if holding:
                out[(pod.namespace, pod.name, c.name)] = holding
    return out


def _changed_pods(before: Inventory, after: Inventory) -> tuple[list[Pod], list[Pod]]:
    """The pods that differ between the two sides: usually a handful of hundreds."""
    old = {(p.namespace, p.name): p for p in before.pods}
    new = {(p.namespace, p.name): p for p in after.pods}
    return (
        [p for k, p in old.items() if new.get(k) != p],
        [p for k, p in new.items() if old.get(k) != p],
    )


def _allocation_changes(before: Inventory, after: Inventory) -> list[_Keyed]:
    changed_old, changed_new = _changed_pods(before, after)
    old, new = _holdings(changed_old), _holdings(changed_new)
    out: list[_Keyed] = []
    for key in sorted(old.keys() - new.keys()):
        out.append((key, _allocation_whole(Kind.ALLOCATION_REMOVED, key, old[key])))
    for key in sorted(new.keys() - old.keys()):
        out.append((key, _allocation_whole(Kind.ALLOCATION_ADDED, key, new[key])))
    for key in sorted(old.keys() & new.keys()):
        was, now = old[key], new[key]
        if was == now:
            continue
        gained, lost = _subtract(now, was), _subtract(was, now)
        ns, pod, container = key
        gained_json, lost_json = _holding_json(gained), _holding_json(lost)
        details = {
            "namespace": ns,
            "pod": pod,
            "container": container,
            "resources": sorted(set(_resources(gained)) | set(_resources(lost))),
            "gained": {k: gained_json[k] for k in ("devices", "cpu_ids", "memory", "claims")},
            "lost": {k: lost_json[k] for k in ("devices", "cpu_ids", "memory", "claims")},
        }
        parts = [f"{verb} {_holding_text(h)}" for verb, h in (("gained", gained), ("lost", lost)) if h]
        summary = f"{ns}/{pod}/{container} allocation changed: {'; '.join(parts)}"
        out.append((key, _change(Kind.ALLOCATION_CHANGED, Severity.INFO, summary, details)))
    return out


def _allocation_whole(kind: Kind, key: tuple[str, str, str], holding: _Holding) -> Change:
    ns, pod, container = key
    verb = "now holds" if kind is Kind.ALLOCATION_ADDED else "released"
    details = {
        "namespace": ns,
        "pod": pod,
        "container": container,
        "resources": _resources(holding),
        **_holding_json(holding),
    }
    return _change(kind, Severity.INFO, f"{ns}/{pod}/{container} {verb} {_holding_text(holding)}", details)


def _subtract(a: _Holding, b: _Holding) -> _Holding:
    """What `a` holds that `b` does not; memory by the amount `a` has more of each block."""
    memory = {
        key: size if key not in b.memory else size - b.memory[key]
        for key, size in a.memory.items()
        if key not in b.memory or size > b.memory[key]
    }
    claims = {
        key: devices - b.claims.get(key, frozenset())
        for key, devices in a.claims.items()
        if key not in b.claims or devices - b.claims[key]
    }
    return _Holding(a.devices - b.devices, a.cpu_ids - b.cpu_ids, memory, claims)


def _resources(h: _Holding) -> list[str]:
    names = {res for res, _ in h.devices}
    if h.cpu_ids:
        names.add("cpu")
    names.update(mtype for mtype, _ in h.memory)
    names.update(d.driver for devices in h.claims.values() for d in devices)
    return sorted(names)


def _holding_json(h: _Holding) -> dict[str, Any]:
    devices: dict[str, list[str]] = {}
    for res, dev_id in sorted(h.devices):
        devices.setdefault(res, []).append(dev_id)
    cpu_ids = sorted(h.cpu_ids)
    return {
        "devices": devices,
        "cpu_ids": cpu_ids,
        "cpuset": cpuset_string(cpu_ids),
        "memory": [
            {"type": mtype, "numa": list(numa), "size": h.memory[(mtype, numa)]}
            for mtype, numa in sorted(h.memory)
        ],
        "claims": [
            claim_json(Claim(ns, name, _sorted_claim_devices(h.claims[(ns, name)])))
            for ns, name in sorted(h.claims)
        ],
    }


def _sorted_claim_devices(devices: Iterable[ClaimDevice]) -> tuple[ClaimDevice, ...]:
    return tuple(
        sorted(
            devices,
            key=lambda d: (d.driver, d.pool, d.device, d.cdi_devices, d.share_id or "", d.share_id is None),
        )
    )


def _holding_text(h: _Holding) -> str:
    parts: list[str] = []
    by_res: dict[str, list[str]] = {}
    for res, dev_id in sorted(h.devices):
        by_res.setdefault(res, []).append(dev_id)
    for res, ids in by_res.items():
        parts.append(f"{res} {ids[0]}" if len(ids) == 1 else f"{len(ids)} {res}")
    if h.cpu_ids:
        parts.append(f"CPUs {cpuset_string(h.cpu_ids)}")
    for mtype, numa in sorted(h.memory):
        parts.append(f"{mtype} {_bytes_text(h.memory[(mtype, numa)])} on {_numa_text(numa)}")
    for ns, name in sorted(h.claims):
        devices = ", ".join(f"{d.driver}/{d.device}" for d in _sorted_claim_devices(h.claims[(ns, name)]))
        parts.append(f"claim {ns}/{name}" + (f" ({devices})" if devices else ""))
    return ", ".join(parts)


# --- capacity ---

_Figures = dict[str, int | None]


@dataclass(frozen=True)
class _Capacity:
    totals: _Figures
    per_numa: Mapping[Any, _Figures]


def _capacity_changes(before: Inventory, after: Inventory) -> list[_Keyed]:
    known = before.allocatable_known and after.allocatable_known
    out: list[_Keyed] = []
    groups: list[
        tuple[int, Callable[[Inventory, bool], dict[str, _Capacity]], Callable[[int | None], str]]
    ] = [
        (0, _device_capacity, _count_text),
        (1, _cpu_capacity, _count_text),
        (2, _memory_capacity, _bytes_text),
    ]
    for rank, figures_of, fmt in groups:
        old, new = figures_of(before, known), figures_of(after, known)
        for res in sorted(old.keys() | new.keys()):
            change = _capacity_change(res, old.get(res), new.get(res), known, fmt)
            if change is not None:
                out.append(((res, rank), change))
    return out


def _capacity_change(
    res: str,
    was: _Capacity | None,
    now: _Capacity | None,
    known: bool,
    fmt: Callable[[int | None], str],
) -> Change | None:
    zero_totals = _zeros(known, ("allocatable", "allocated", "free", "unavailable"))
    zero_numa = _zeros(known, ("allocatable", "allocated", "free"))
    old_totals = was.totals if was is not None else zero_totals
    new_totals = now.totals if now is not None else zero_totals
    old_numa: Mapping[Any, _Figures] = was.per_numa if was is not None else {}
    new_numa: Mapping[Any, _Figures] = now.per_numa if now is not None else {}
    per_numa = [
        {
            "numa": list(node) if isinstance(node, tuple) else node,
            "before": dict(old_numa.get(node, zero_numa)),
            "after": dict(new_numa.get(node, zero_numa)),
        }
        for node in _sorted_numa(old_numa.keys() | new_numa.keys())
        if old_numa.get(node, zero_numa) != new_numa.get(node, zero_numa)
    ]
    if old_totals == new_totals and not per_numa:
        return None

    def span(field: str) -> str:
        return f"{fmt(old_totals[field])} -> {fmt(new_totals[field])}"

    if known:
        summary = (
            f"{res} free {span('free')} (allocatable {span('allocatable')}, allocated {span('allocated')}"
        )
        if old_totals["unavailable"] != new_totals["unavailable"]:
            summary += f", unavailable {span('unavailable')}"
        summary += ")"
    else:
        summary = f"{res} allocated {span('allocated')} (allocatable unknown)"
    if old_totals == new_totals:
        nodes = ", ".join(_numa_text(_as_nodes(n["numa"])) for n in per_numa)
        summary += f"; per-NUMA figures changed on {nodes}"
    details = {"resource": res, "before": dict(old_totals), "after": dict(new_totals), "per_numa": per_numa}
    return _change(Kind.CAPACITY_CHANGED, Severity.INFO, summary, details)


def _device_capacity(inv: Inventory, known: bool) -> dict[str, _Capacity]:
    return {
        c.resource: _Capacity(
            totals=_mask(
                known,
                {
                    "allocatable": c.allocatable,
                    "allocated": c.allocated,
                    "free": c.free,
                    "unavailable": c.unavailable,
                },
            ),
            per_numa={
                n.numa: _mask(known, {"allocatable": n.allocatable, "allocated": n.allocated, "free": n.free})
                for n in c.per_numa
            },
        )
        for c in inv.capacity
    }


def _cpu_capacity(inv: Inventory, known: bool) -> dict[str, _Capacity]:
    cpus = inv.cpus
    totals = _mask(known, {"allocatable": cpus.allocatable, "allocated": cpus.allocated, "free": cpus.free})
    totals["unavailable"] = 0
    return {"cpu": _Capacity(totals, {})}


def _memory_capacity(inv: Inventory, known: bool) -> dict[str, _Capacity]:
    totals: dict[str, _Figures] = {}
    per_numa: dict[str, dict[NumaNodes, _Figures]] = {}
    for m in inv.memory_capacity:
        figures = _mask(known, {"allocatable": m.allocatable, "allocated": m.allocated, "free": m.free})
        per_numa.setdefault(m.type, {})[m.numa] = figures
        total = totals.setdefault(
            m.type, {**_zeros(known, ("allocatable", "allocated", "free")), "unavailable": 0}
        )
        for field, value in figures.items():
            sofar = total[field]
            total[field] = None if sofar is None or value is None else sofar + value
    return {mtype: _Capacity(totals[mtype], per_numa[mtype]) for mtype in totals}


def _mask(known: bool, figures: _Figures) -> _Figures:
    """Figures with the allocatable side blanked when it cannot be compared."""
    if known:
        return dict(figures)
    masked: _Figures = {k: (v if k == "allocated" else None) for k, v in figures.items()}
    if "unavailable" in masked:
        # As in the model: without the allocatable side nothing can be called missing.
        masked["unavailable"] = 0
    return masked


def _zeros(known: bool, fields: Sequence[str]) -> _Figures:
    return _mask(known, dict.fromkeys(fields, 0))


def _sorted_numa(nodes: Iterable[Any]) -> list[Any]:
    def key(node: Any) -> tuple[int, Any]:
        if node is None:
            return (2, 0)
        if isinstance(node, tuple):
            return (1, node)
        return (0, node)

    return sorted(nodes, key=key)


def _as_nodes(numa: Any) -> NumaNodes:
    if numa is None:
        return ()
    if isinstance(numa, list):
        return tuple(numa)
    return (int(numa),)


# --- text helpers ---


def _change(kind: Kind, severity: Severity, summary: str, details: Mapping[str, Any]) -> Change:
    return Change(kind, severity, " ".join(summary.split()), details)


def _numa_text(numa: NumaNodes) -> str:
    if not numa:
        return "no NUMA node"
    return f"NUMA {','.join(str(n) for n in numa)}"


def _count_text(n: int | None) -> str:
    return "?" if n is None else str(n)


def _bytes_text(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"
