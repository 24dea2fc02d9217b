"""Allocation changes: what each container holds exclusively, before and after. Pure.

Holdings are compared per container. A container that holds nothing
exclusively (no devices, CPUs, memory or DRA claims) counts as absent, so pods
without exclusive resources never produce allocation events. Pod-level CPUs
and memory overlap the containers' values; they are left to the capacity
figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import Inventory, changed_pods
from watcher.model.records import Claim, ClaimDevice, Container, NumaNodes, Pod, claim_json
from watcher.model.wording import Keyed, bytes_text, cpuset_string, make_change, numa_text

__all__ = ["allocation_changes"]


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


def allocation_changes(before: Inventory, after: Inventory) -> list[Keyed]:
    """Containers whose holdings appeared, went or changed, keyed by (namespace, pod, container)."""
    changed_old, changed_new = changed_pods(before, after)
    old, new = _holdings(changed_old), _holdings(changed_new)
    out: list[Keyed] = []
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
        out.append((key, make_change(Kind.ALLOCATION_CHANGED, Severity.INFO, summary, details)))
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
    return make_change(
        kind, Severity.INFO, f"{ns}/{pod}/{container} {verb} {_holding_text(holding)}", details
    )


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
        parts.append(f"{mtype} {bytes_text(h.memory[(mtype, numa)])} on {numa_text(numa)}")
    for ns, name in sorted(h.claims):
        devices = ", ".join(f"{d.driver}/{d.device}" for d in _sorted_claim_devices(h.claims[(ns, name)]))
        parts.append(f"claim {ns}/{name}" + (f" ({devices})" if devices else ""))
    return ", ".join(parts)
