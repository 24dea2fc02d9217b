"""DRA device health from the Pod status: the kubelet's verdict on each device a claim gave a pod,
as `device.unhealthy` / `device.healthy` / `device.health_unknown`. Pure: the caller brings the
monotonic time, the inventory (pod-resources) and the pods (the Pods API, a complete view).

One device (driver, pool, device) is one story whoever holds it: pods sharing a claim, or several
containers of one pod, give one event naming every holder. A verdict is tied to a device only through
what pod-resources shows (the pod's claim -> its ResourceClaim -> that claim's devices), never by a
guessed name: a verdict that does not resolve yet waits until it does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import Inventory
from watcher.model.pod_meta import HEALTHY, UNHEALTHY, UNKNOWN, DeviceVerdict, PodIndex, PodMeta
from watcher.model.records import ClaimDevice, Pod
from watcher.model.wording import make_change, printable

__all__ = ["DeviceHealth", "corroborate", "SOURCE", "resource_id_of"]

SOURCE = "pod-status"
_FORMAT = 1
# A driver's message is free text in the Pod status; an event carries this much of it.
_MESSAGE_MAX = 1024
# The worse verdict wins when holders disagree (their statuses are written at different times).
_RANK = {HEALTHY: 0, UNKNOWN: 1, UNHEALTHY: 2}

DeviceKey = tuple[str, str, str]  # (driver, pool, device)
PendingKey = tuple[str, str, str, str]  # (pod uid, container, status name, resource id)


def resource_id_of(device: ClaimDevice) -> str:
    """How the kubelet names a DRA device in the Pod status: its first CDI id, else driver/pool/device."""
    return device.cdi_devices[0] if device.cdi_devices else f"{device.driver}/{device.pool}/{device.device}"


@dataclass(frozen=True)
class _Device:
    """What is known of one device. `reported`: the open story (Unhealthy or Unknown reported), or
    None. `since`: when its current Unknown began (None: not timing one)."""

    health: str = HEALTHY
    reported: str | None = None
    since: float | None = None
    holders: frozenset[str] = frozenset()  # the uids of the pods whose verdicts named it


@dataclass(frozen=True)
class _Seen:
    """This observation of one device: its worst verdict, who gave it, and every container holding it."""

    verdict: DeviceVerdict
    pod: PodMeta
    claim: str
    device: ClaimDevice
    uids: frozenset[str]
    first_seen: float | None


@dataclass(frozen=True)
class DeviceHealth:
    """What has been reported per DRA device, and the Unknowns and unresolved verdicts pending."""

    devices: tuple[tuple[DeviceKey, _Device], ...] = ()
    # Verdicts no device resolves to yet (the claim not in pod-resources yet), with when first seen.
    pending: tuple[tuple[PendingKey, float], ...] = ()

    def open(self) -> frozenset[DeviceKey]:
        """The devices whose failure (or lasting Unknown) was reported and not healed."""
        return frozenset(k for k, d in self.devices if d.reported is not None)

    def next_look(self, unknown_grace: float) -> float | None:
        """When an Unknown not reported yet may have outlasted the grace."""
        ends = [
            d.since + unknown_grace
            for _, d in self.devices
            if d.health == UNKNOWN and d.reported is None and d.since is not None
        ]
        return min(ends, default=None)

    def observe(
        self,
        now: float,
        inventory: Inventory,
        pods: Iterable[PodMeta],
        *,
        unknown_grace: float,
        holding: bool = False,
    ) -> tuple[DeviceHealth, list[Change]]:
        """The new state and the changes the pods' DRA verdicts call for (see the module).

        `pods` must be the Pods API's whole view (after its initial sync): a device none of whose
        holders is in it ends its story. `holding` (the kubelet's warm-up after a restart): drivers
        are re-registering, so an Unknown is neither timed nor reported meanwhile.
        """
        index = pods if isinstance(pods, PodIndex) else PodIndex(pods)
        judged = list(index.with_claim_verdicts())  # the rest say nothing of DRA devices
        # Held: an unresolved Unknown's grace, too, starts once the warm-up is over.
        pending_since = {k: now for k, _ in self.pending} if holding else dict(self.pending)
        seen, pending = _resolve(now, inventory, judged, pending_since)
        devices = dict(self.devices)
        holders = _holders(inventory) if seen or devices else {}
        out: list[Change] = []
        for key in sorted(devices.keys() | seen.keys()):
            old = devices.get(key, _Device())
            s = seen.get(key)
            if s is None:
                if any(uid in index for uid in old.holders):
                    continue  # its pods are there but say nothing of it this time: no news
                # Its pods are gone. A pod ending is no heal: the device may be as bad as it was, so
                # a page stays open for a person; allocation.removed already tells the pod went.
                del devices[key]
                continue
            new, change = _step(now, key, old, s, holders.get(key, ()), unknown_grace, holding)
            if change is not None:
                out.append(change)
            if new.health == HEALTHY and new.reported is None:
                devices.pop(key, None)
            else:
                devices[key] = new
        state = DeviceHealth(tuple(sorted(devices.items())), tuple(sorted(pending.items())))
        return state, out

    def to_json(self) -> dict[str, Any]:
        """The reported devices and their holders, for the saved state. Times are monotonic and
        mean nothing to the next process: an Unknown's grace starts again after a restart."""
        return {
            "format": _FORMAT,
            "devices": [
                {
                    "driver": k[0],
                    "pool": k[1],
                    "device": k[2],
                    "health": d.health,
                    "reported": d.reported,
                    "holders": sorted(d.holders),
                }
                for k, d in self.devices
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> DeviceHealth:
        """The state `to_json` saved; anything unreadable is an empty state, never an error (the
        worst it costs is a failure reported again, or a heal not reported)."""
        try:
            if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
                return cls()
            devices: dict[DeviceKey, _Device] = {}
            for entry in data["devices"]:
                key = (str(entry["driver"]), str(entry["pool"]), str(entry["device"]))
                health, reported = entry["health"], entry["reported"]
                if health not in _RANK or reported not in (None, UNHEALTHY, UNKNOWN):
                    continue
                uids = entry["holders"]
                if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
                    continue
                devices[key] = _Device(health, reported, None, frozenset(uids))
            return cls(tuple(sorted(devices.items())))
        except (KeyError, TypeError, ValueError):
            return cls()


def _resolve(
    now: float, inventory: Inventory, pods: Sequence[PodMeta], pending: dict[PendingKey, float]
) -> tuple[dict[DeviceKey, _Seen], dict[PendingKey, float]]:
    """Each device the pods' DRA verdicts name, with its worst verdict; and the verdicts still
    unresolved (with when they were first seen, so an Unknown's grace counts from then)."""
    seen: dict[DeviceKey, _Seen] = {}
    still: dict[PendingKey, float] = {}
    for pod in pods:
        for v in pod.verdicts:
            if not v.is_claim:
                continue
            pkey = (pod.uid, v.container, v.resource, v.resource_id)
            found = _device_of(inventory.pod(pod.namespace, pod.name), pod, v)
            if found is None:
                still[pkey] = pending.get(pkey, now)
                continue
            claim, device = found
            key = (device.driver, device.pool, device.device)
            first = pending.get(pkey)
            old = seen.get(key)
            if old is None:
                seen[key] = _Seen(v, pod, claim, device, frozenset({pod.uid}), first)
                continue
            worse = _rank(v.health) > _rank(old.verdict.health)
            kept = _Seen(v, pod, claim, device, old.uids, first) if worse else old
            times = [t for t in (old.first_seen, first) if t is not None]
            seen[key] = dataclasses.replace(
                kept, uids=old.uids | {pod.uid}, first_seen=min(times, default=None)
            )
    return seen, still


def _device_of(held: Pod | None, pod: PodMeta, v: DeviceVerdict) -> tuple[str, ClaimDevice] | None:
    """(ResourceClaim name, device) of verdict `v`, from what pod-resources shows of the pod."""
    if held is None:
        return None
    pod_claim, _ = v.claim
    claim = pod.claim_object(pod_claim)
    if claim is None:
        return None
    for container in held.containers:
        for c in container.claims:
            if c.name != claim or c.namespace != pod.namespace:
                continue
            for device in c.devices:
                if resource_id_of(device) == v.resource_id:
                    return claim, device
    return None


def _holders(inventory: Inventory) -> dict[DeviceKey, tuple[str, ...]]:
    """Every container ("ns/pod/container") holding each DRA device, whichever claim gave it:
    the inventory's tally keeps them, carried from one inventory to the next."""
    return {k: names for k, (names, _) in inventory.tally.claim_holders.items()}


def _rank(health: str) -> int:
    return _RANK.get(health, _RANK[UNKNOWN])


def _health(verdict: DeviceVerdict) -> str:
    # Anything but the three words is no verdict at all: unknown, never a failure.
    return verdict.health if verdict.health in _RANK else UNKNOWN


def _step(
    now: float,
    key: DeviceKey,
    old: _Device,
    s: _Seen,
    held_by: tuple[str, ...],
    grace: float,
    holding: bool,
) -> tuple[_Device, Change | None]:
    """One device's new state, and its event if this observation makes one."""
    health = _health(s.verdict)
    uids = old.holders | s.uids
    if health == UNHEALTHY:
        new = _Device(UNHEALTHY, UNHEALTHY, None, uids)
        return new, (None if old.reported == UNHEALTHY else _change(Kind.DEVICE_UNHEALTHY, key, s, held_by))
    if health == HEALTHY:
        if old.reported is not None:
            return _Device(holders=uids), _change(Kind.DEVICE_HEALTHY, key, s, held_by)
        return _Device(holders=uids), None  # an Unknown healed within the grace says nothing
    # Unknown: the driver stopped reporting. A failure reported stays open (no news is no heal).
    if old.reported is not None:
        return _Device(UNKNOWN, old.reported, None, uids), None
    if holding:
        # Drivers re-register during the kubelet's warm-up: the grace starts once it is over.
        return _Device(UNKNOWN, None, now, uids), None
    candidates = [t for t in (old.since if old.health == UNKNOWN else None, s.first_seen) if t is not None]
    since = min(candidates, default=now)
    if now - since >= grace:
        return _Device(UNKNOWN, UNKNOWN, None, uids), _change(
            Kind.DEVICE_HEALTH_UNKNOWN, key, s, held_by, lasted=now - since
        )
    return _Device(UNKNOWN, None, since, uids), None


def _change(
    kind: Kind, key: DeviceKey, s: _Seen, held_by: tuple[str, ...], *, lasted: float | None = None
) -> Change:
    driver, pool, name = key
    pod_claim, request = s.verdict.claim
    message = printable(s.verdict.message[:_MESSAGE_MAX])
    holders = list(held_by) or [f"{s.pod.key}/{s.verdict.container}"]
    details: dict[str, Any] = {
        "resource": driver,
        "device": f"{pool}/{name}",
        "driver": driver,
        "pool": pool,
        "device_name": name,
        "cdi_devices": list(s.device.cdi_devices),
        "claim": s.claim,
        "pod_claim": pod_claim,
        "request": request,
        "health": _health(s.verdict),
        "message": message,
        "allocated_to": holders,
        "namespaces": sorted({h.split("/", 1)[0] for h in holders}),
        "source": SOURCE,
    }
    said = f": {message}" if message else ""
    if kind is Kind.DEVICE_UNHEALTHY:
        severity, state = Severity.CRITICAL, f"unhealthy{said}"
    elif kind is Kind.DEVICE_HEALTHY:
        severity, state = Severity.INFO, "healthy again"
    else:
        severity = Severity.WARNING
        state = f"health unknown for {lasted or 0:.0f} s (its driver stopped reporting){said}"
        details["unknown_for_s"] = round(lasted or 0.0, 3)
    summary = f"{driver} {name} (pool {pool}) {state}; held by {', '.join(holders)} (claim {s.claim})"
    return make_change(kind, severity, summary, details)


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
