"""Capacity changes: each resource's allocatable, allocated, free and unavailable figures. Pure.

Devices, CPUs and each memory type are compared as totals and per NUMA node.
When either side comes from List-only mode (`allocatable_known` False), only
what is allocated is compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import Inventory
from watcher.model.records import NumaNodes
from watcher.model.wording import Keyed, bytes_text, count_text, make_change, numa_text

__all__ = ["capacity_changes"]

_Figures = dict[str, int | None]


@dataclass(frozen=True)
class _Capacity:
    totals: _Figures
    per_numa: Mapping[Any, _Figures]


def capacity_changes(before: Inventory, after: Inventory) -> list[Keyed]:
    """Resources whose figures changed, keyed by (resource, group: 0 devices, 1 CPUs, 2 memory)."""
    known = before.allocatable_known and after.allocatable_known
    out: list[Keyed] = []
    groups: list[
        tuple[int, Callable[[Inventory, bool], dict[str, _Capacity]], Callable[[int | None], str]]
    ] = [
        (0, _device_capacity, count_text),
        (1, _cpu_capacity, count_text),
        (2, _memory_capacity, bytes_text),
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
        nodes = ", ".join(numa_text(_as_nodes(n["numa"])) for n in per_numa)
        summary += f"; per-NUMA figures changed on {nodes}"
    details = {"resource": res, "before": dict(old_totals), "after": dict(new_totals), "per_numa": per_numa}
    return make_change(Kind.CAPACITY_CHANGED, Severity.INFO, summary, details)


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
