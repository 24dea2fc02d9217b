"""A device plugin's device that left allocatable, corroborated: the `device.removed` carries what
its holders' Pod status says of it, so a reader sees whether the kubelet agreed. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from watcher.model.changes import Change, Kind
from watcher.model.devicehealth.pods import PodMeta

__all__ = ["corroborate"]


def corroborate(changes: Sequence[Change], pods: Iterable[PodMeta]) -> list[Change]:
    """`changes` with each allocated `device.removed` (device plugin) carrying `kubelet_verdicts`:
    what the holders' Pod status says of that device ([{pod, container, health}], empty when it says
    nothing), so a reader sees whether the kubelet agreed. No event of its own: the device leaving
    allocatable is what pages, as it always did."""
    wanted = [c for c in changes if c.kind is Kind.DEVICE_REMOVED and c.details.get("allocated_to")]
    if not wanted:
        return list(changes)
    by_key = {p.key: p for p in pods}
    out: list[Change] = []
    for change in changes:
        holders = change.details.get("allocated_to")
        if change.kind is not Kind.DEVICE_REMOVED or not holders:
            out.append(change)
            continue
        resource, device = str(change.details.get("resource", "")), str(change.details.get("device", ""))
        keys = sorted({"/".join(str(h).split("/", 2)[:2]) for h in holders})
        verdicts = [
            {"pod": k, "container": v.container, "health": v.health}
            for k in keys
            if (pod := by_key.get(k)) is not None
            for v in pod.verdicts
            if not v.is_claim and v.resource == resource and v.resource_id == device
        ]
        verdicts.sort(key=lambda x: (x["pod"], x["container"]))
        out.append(
            Change(
                change.kind, change.severity, change.summary, {**change.details, "kubelet_verdicts": verdicts}
            )
        )
    return out
