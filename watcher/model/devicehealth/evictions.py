"""Pods evicted because a device they hold is tainted: one `pod.evicted` each. Pure.

Upstream's device taint eviction controller (kube-controller-manager, `pkg/controller/devicetainteviction`)
evicts a pod whose allocated DRA device carries a NoExecute taint, a ResourceSlice's or a
DeviceTaintRule's. It writes three things, none naming the device or the taint: a Pod Event
(reason `DeviceTaintManagerEviction`, "Marking for deletion"), the pod's DisruptionTarget condition
(True, reason `DeletionByDeviceTaintManager`, "Device Taint manager: deleting due to NoExecute
taint"), and then it deletes the pod. The kubelet copies that condition (one it does not own) into
the status it serves, so the Pods API shows it on the node, no API server needed.

The agent names what the controller does not: the devices the pod held (pod-resources, from the
inventory that still had the pod, or from the pods it stopped listing lately: the kubelet may drop
the pod from pod-resources before its Pods API says why) and the NoExecute taints on them (the
ResourceSlice taints and the DeviceTaintRules' the sources read, `rule` naming the rule). The
taint may not be read yet when the pod's status says why (the controller acts at once, the sources
list every few seconds): an eviction whose devices have no NoExecute taint known waits for one up
to `wait` seconds, then is told without it; with no taint source at all it is told at once.

A pod is told once: its uid is kept while the kubelet still shows it (a uid never comes back) and
saved with the state, so neither a restart nor a resync tells it again. At the very first look (no
saved state) the pods already being evicted are old news: taken as told, never reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.inventory import Inventory, changed_pods
from watcher.model.records import Pod
from watcher.model.wording import printable

__all__ = [
    "DISRUPTION_REASON",
    "EVICTING_EFFECT",
    "Evicted",
    "Evictions",
    "Released",
    "evicted_devices",
    "released_pods",
]

# The DisruptionTarget reason the device taint eviction controller writes (1.37.2); the other
# reasons (preemption, the node taint manager, the kubelet's own evictions) are not device taints.
DISRUPTION_REASON = "DeletionByDeviceTaintManager"
EVICTING_EFFECT = "NoExecute"  # the only effect the controller evicts for
_FORMAT = 1
_PENDING_MAX = 10_000  # far above a real node's pods; a runaway bounds the state at this
RELEASED_KEEP = 10.0  # seconds a released pod's devices are kept, at least

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class Evicted:
    """A pod seen being evicted and not told yet: who it was, the devices it held ((claim, device
    key) pairs) and when it was first seen (monotonic)."""

    uid: str
    namespace: str
    name: str
    who: Mapping[str, Any]
    devices: tuple[tuple[str, DeviceKey], ...]
    since: float


@dataclass(frozen=True)
class Released:
    """A pod pod-resources stopped listing (its containers ended), with the DRA devices it held
    and when (monotonic): its status may say why only after that (the kubelet's DRA state file and
    its Pods API update race), when neither the cycle's inventory nor the one before has the pod."""

    namespace: str
    name: str
    devices: tuple[tuple[str, DeviceKey], ...]
    at: float


def _claim_devices(held: Pod) -> tuple[tuple[str, DeviceKey], ...]:
    found = {
        (claim.name, (d.driver, d.pool, d.device))
        for c in held.containers
        for claim in c.claims
        if claim.namespace == held.namespace
        for d in claim.devices
    }
    return tuple(sorted(found))


def released_pods(after: Inventory, before: Inventory | None, now: float) -> list[Released]:
    """The pods whose DRA devices `before` lists and `after` does not: the pod gone, or still
    listed without them (the kubelet unprepared its claims first). Only the pods that changed are
    looked at (inventory.changed_pods)."""
    if before is None or before is after:
        return []
    gone, _ = changed_pods(before, after)
    out = []
    for pod in gone:
        now_held = after.pod(pod.namespace, pod.name)
        devices = _claim_devices(pod)
        if devices and (now_held is None or _claim_devices(now_held) != devices):
            out.append(Released(pod.namespace, pod.name, devices, now))
    return out


def evicted_devices(
    pod: PodMeta, looks: Sequence[Inventory | None], released: Sequence[Released] = ()
) -> tuple[tuple[str, DeviceKey], ...]:
    """The DRA devices the pod holds, as (claim, device key), sorted: from the first inventory of
    `looks` that still shows it with some, else from the pods released lately (the newest under
    its name). A pod being evicted may still be listed with its claims already gone."""
    for inventory in looks:
        held = inventory.pod(pod.namespace, pod.name) if inventory is not None else None
        if held is not None and (devices := _claim_devices(held)):
            return devices
    for r in reversed(released):
        if (r.namespace, r.name) == (pod.namespace, pod.name):
            return r.devices
    return ()


@dataclass(frozen=True)
class Evictions:
    """What has been told: `baseline` (the first look is taken), `told` (uids reported or taken as
    old news) and `pending` (evictions waiting for their taint to be read)."""

    baseline: bool = False
    told: frozenset[str] = frozenset()
    pending: tuple[Evicted, ...] = ()
    # Pods released lately (kept max(wait, RELEASED_KEEP) seconds), in memory only: after a restart
    # the pending evictions have their devices already, and a new one is seen with its pod listed.
    released: tuple[Released, ...] = field(default=(), compare=False)

    def next_look(self, wait: float) -> float | None:
        """When a pending eviction is told even without its taint."""
        return min((p.since + wait for p in self.pending), default=None)

    def observe(
        self,
        now: float,
        pods: Iterable[PodMeta],
        looks: tuple[Inventory, Inventory | None],
        taints: Iterable[DeviceTaint] | None,
        *,
        wait: float,
    ) -> tuple[Evictions, list[Change]]:
        """The new state and its changes. `pods`: what the Pods API shows (its live view and the
        pods that ended since the last look); `looks`: the cycle's inventory and the one before
        (None: none), where the pods' devices are looked up, with the pods released between them;
        `taints`: the taints the sources read (None: no source reads any)."""
        pods = list(pods)
        keep = max(wait, RELEASED_KEEP)
        released = [r for r in self.released if now - r.at < keep] + released_pods(*looks, now)
        released = released[-_PENDING_MAX:]
        evicting = [p for p in pods if p.disruption == DISRUPTION_REASON]
        if not self.baseline:
            told = frozenset(p.uid for p in evicting)
            return replace(self, baseline=True, told=told, released=tuple(released)), []
        waiting = {p.uid: p for p in self.pending}
        for pod in evicting:
            if pod.uid not in self.told and pod.uid not in waiting:
                entry = {"namespace": pod.namespace, "name": pod.name, **pod.who()}
                devices = evicted_devices(pod, looks, released)
                waiting[pod.uid] = Evicted(pod.uid, pod.namespace, pod.name, entry, devices, now)
        noexecute = [t for t in taints if t.effect == EVICTING_EFFECT] if taints is not None else None
        changes: list[Change] = []
        still: list[Evicted] = []
        for e in sorted(waiting.values(), key=lambda e: (e.since, e.namespace, e.name, e.uid)):
            keys = {key for _, key in e.devices}
            named = sorted({t for t in noexecute or () if t.device_key in keys})
            if named or noexecute is None or not keys or now - e.since >= wait:
                changes.append(_evicted(e, tuple(named), known=noexecute is not None))
            else:
                still.append(e)
        # A uid the kubelet no longer shows never comes back: forgetting it bounds the set.
        present = {p.uid for p in pods}
        told = frozenset(u for u in self.told if u in present) | {e.uid for e in waiting.values()}
        told -= {e.uid for e in still}
        return Evictions(True, told, tuple(still[-_PENDING_MAX:]), tuple(released)), changes

    def to_json(self, now: float) -> dict[str, Any]:
        """For the saved state; a pending eviction's time as its age at `now` (monotonic)."""
        return {
            "format": _FORMAT,
            "baseline": self.baseline,
            "told": sorted(self.told),
            "pending": [
                {
                    "uid": e.uid,
                    "namespace": e.namespace,
                    "name": e.name,
                    "who": dict(e.who),
                    "devices": [[claim, list(key)] for claim, key in e.devices],
                    "age": round(now - e.since, 3),
                }
                for e in self.pending
            ],
        }

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> Evictions:
        """What `to_json` saved, at monotonic `now`; anything unreadable is a fresh state (its first
        look takes the pods being evicted as old news: at worst one is not told, never twice)."""
        try:
            if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
                return cls()
            told = frozenset(str(u) for u in data["told"])
            pending = tuple(
                Evicted(
                    str(e["uid"]),
                    str(e["namespace"]),
                    str(e["name"]),
                    dict(e["who"]),
                    tuple((str(claim), (str(k[0]), str(k[1]), str(k[2]))) for claim, k in e["devices"]),
                    now - float(e["age"]),
                )
                for e in data["pending"]
            )
            return cls(data.get("baseline") is True, told, pending)
        except (KeyError, TypeError, ValueError, IndexError):
            return cls()


def _evicted(e: Evicted, taints: tuple[DeviceTaint, ...], *, known: bool) -> Change:
    # The tainted devices first: those are what evicted it; the others it held follow.
    tainted = {t.device_key for t in taints}
    devices = sorted(e.devices, key=lambda d: (d[1] not in tainted, d))
    if devices:
        claim, (driver, pool, name) = devices[0]
        device = f"{driver} {name} (pool {pool})"
        more = f" and {len(devices) - 1} more device(s)" if len(devices) > 1 else ""
    else:
        claim, driver, pool, name, device, more = "", "", "", "", "a device", ""
    if taints:
        why = "tainted " + ", ".join(t.text for t in taints)
    elif known:
        why = f"with a {EVICTING_EFFECT} taint the agent has not read"
    else:
        why = f"with a {EVICTING_EFFECT} taint (taints not read: no API server)"
    text = f"pod {e.namespace}/{e.name} evicted: its device {device}{more} {why}"
    # A DeviceTaintRule's taint names its rule (watcher.model.devicehealth.taint_rules).
    rules = sorted({r for t in taints if (r := t.to_json().get("rule"))})
    details: dict[str, Any] = {
        "namespace": e.namespace,
        "pod": e.name,
        "pod_uid": e.who.get("uid", e.uid),
        "owner": e.who.get("owner"),
        "labels": e.who.get("labels", {}),
        "reason": DISRUPTION_REASON,
        # The first (tainted) device, flat, as device events name theirs.
        "driver": driver,
        "pool": pool,
        "device_name": name,
        "claim": claim,
        "devices": [{"claim": c, "driver": k[0], "pool": k[1], "device": k[2]} for c, k in devices],
        "taints": [{"driver": t.driver, "pool": t.pool, "device": t.device, **t.to_json()} for t in taints],
        "rules": rules,
    }
    # The owner is not in the summary: the texts people read (Slack, the Kubernetes Events) put
    # it first themselves, from `owner` (watcher.model.devicehealth.affected.owner_text).
    summary = printable(text)
    return Change(Kind.POD_EVICTED, Severity.WARNING, summary, details)
