"""DRA device health from the Pod status: the kubelet's verdict on each device a claim gave a pod,
as `device.unhealthy` / `device.healthy` / `device.health_unknown` / `device.health_unobserved`
(worded by watcher.model.devicehealth.events). Pure: the caller brings the monotonic time, the inventory
(pod-resources) and the pods (the Pods API, a complete view).

One device (driver, pool, device) is one story whoever holds it: pods sharing a claim, or several
containers of one pod, give one event naming every holder, and a story outlives its holders. A
verdict is tied to a device only through what pod-resources shows (the pod's claim -> its
ResourceClaim -> that claim's devices), never by a guessed name: a verdict that does not resolve yet
waits until it does.

What ends a story: the device Healthy again under any holder (`device.healthy`, the page resolved),
or, once no pod has held it for the unheld grace, `device.health_unobserved` (no heal: nobody can
see it any more, and a page must not stay open for ever). After either, a failure pages again.
Unknown is the kubelet's default for a driver that reports no health: a device never seen Healthy
says nothing while Unknown; only one that was Healthy and turns Unknown is warned of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind
from watcher.model.devicehealth.events import (
    SLICE_SOURCE,
    SOURCE,
    About,
    Said,
    story_change,
    unobserved_change,
)
from watcher.model.devicehealth.holders import claim_device_of, held_dra_devices, resource_id_of
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, UNKNOWN, DeviceVerdict, PodIndex, PodMeta
from watcher.model.devicehealth.taint_rules import RuleAlarms, TaintRule
from watcher.model.devicehealth.taints import RULE_SOURCE, DeviceTaint, failing
from watcher.model.inventory import Inventory
from watcher.model.records import ClaimDevice
from watcher.model.wording import printable

__all__ = ["DeviceHealth", "SOURCE", "SLICE_SOURCE", "resource_id_of"]

_FORMAT = 1
# A driver's message is free text in the Pod status; an event carries this much of it.
_MESSAGE_MAX = 1024
# The worse verdict wins when holders disagree (their statuses are written at different times).
_RANK = {HEALTHY: 0, UNKNOWN: 1, UNHEALTHY: 2}
_SOURCES = (SOURCE, SLICE_SOURCE, RULE_SOURCE)
_TAINT_SOURCES = frozenset({SLICE_SOURCE, RULE_SOURCE})

DeviceKey = tuple[str, str, str]  # (driver, pool, device)
PendingKey = tuple[str, str, str, str]  # (pod uid, container, status name, resource id)


@dataclass(frozen=True)
class _Device:
    """What is known of one device. `reported`: the open story (Unhealthy or Unknown reported), or
    None. `since`: when its current Unknown began (None: not timing one)."""

    health: str = HEALTHY  # what the Pod status last said
    reported: str | None = None
    since: float | None = None
    holders: frozenset[str] = frozenset()  # the uids of the pods whose verdicts named it
    tainted: bool = False  # a failing ResourceSlice taint was on it when last read
    sources: frozenset[str] = frozenset()  # the sources that said Unhealthy in the open story
    # The Pod status called it Healthy at some point (its driver reports health): only then is an
    # Unknown news (the kubelet writes Unknown for every device of a driver that reports nothing).
    was_healthy: bool = False
    unheld_since: float | None = None  # an open story whose device no pod holds: since when
    last_held_by: tuple[str, ...] = ()  # the containers that held it when its story was last told
    # The namespaces the open story was routed to: its end goes there too, whoever holds it then
    # (a sink that took the page for a namespace must take its resolve).
    told: frozenset[str] = frozenset()


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
    # The DeviceTaintRules that evict from every device, told and not lifted (one cluster-wide story).
    rules: RuleAlarms = dataclasses.field(default_factory=RuleAlarms)

    def open(self) -> frozenset[DeviceKey]:
        """The devices whose failure (or lasting Unknown) was reported and not healed."""
        return frozenset(k for k, d in self.devices if d.reported is not None)

    def next_look(self, unknown_grace: float, unheld_grace: float, *, verdicts: bool = True) -> float | None:
        """When an Unknown not reported yet may have outlasted its grace (only while the Pod
        status is read: `verdicts`), or an open story's device may have stayed without a holder
        for the unheld grace (pod-resources alone tells that)."""
        ends = [
            d.since + unknown_grace
            for _, d in self.devices
            if verdicts and d.health == UNKNOWN and d.reported is None and d.since is not None
        ]
        ends += [d.unheld_since + unheld_grace for _, d in self.devices if d.unheld_since is not None]
        return min(ends, default=None)

    def observe(
        self,
        now: float,
        inventory: Inventory,
        pods: Iterable[PodMeta] | None,
        *,
        unknown_grace: float,
        unheld_grace: float = 900.0,
        holding: bool = False,
        taints: Collection[DeviceTaint] | None = None,
    ) -> tuple[DeviceHealth, list[Change]]:
        """The new state and the changes the pods' DRA verdicts and the devices' taints call for.

        `pods` must be the Pods API's whole view (after its initial sync): a device none of whose
        holders is in it has no holder now; None (no view now): what the Pod status last said
        stands. `holding` (the kubelet's warm-up after a restart): drivers are re-registering, so
        an Unknown is neither timed nor reported meanwhile. `taints`: the node's ResourceSlice
        taints as last read (None: never read, or not read at all: what they last said stands); a
        failing one on a device a pod of the inventory holds is that device Unhealthy, one on a
        device nobody holds says nothing (the scheduler keeps pods off it). An open story whose
        device nobody holds waits `unheld_grace` seconds for a new holder's verdict, then ends
        with `device.health_unobserved`.
        """
        index = None if pods is None else pods if isinstance(pods, PodIndex) else PodIndex(pods)
        # Only the pods with a verdict on a DRA device say anything of one: the others are not read.
        listed = None if index is None else list(index.with_claim_verdicts())
        # Held: an unresolved Unknown's grace, too, starts once the warm-up is over.
        pending_since = {k: now for k, _ in self.pending} if holding else dict(self.pending)
        seen: dict[DeviceKey, _Seen] = {}
        pending = pending_since
        if listed is not None:
            seen, pending = _resolve(now, inventory, listed, pending_since)
        devices = dict(self.devices)
        failing_now = failing(taints or ())
        held = held_dra_devices(inventory, devices.keys() | seen.keys() | failing_now.keys())
        bad = {k: v for k, v in failing_now.items() if k in held}
        out: list[Change] = []
        for key in sorted(devices.keys() | seen.keys() | bad.keys()):
            old = devices.get(key, _Device())
            s = seen.get(key)
            tainted = bool(bad.get(key)) if taints is not None else old.tainted
            gone = index is not None and bool(old.holders) and not any(u in index for u in old.holders)
            if s is None and (key not in held or (not tainted and (gone or old.unheld_since is not None))):
                # Nobody holds it now (or a new holder has said nothing of it yet). A pod ending is
                # no heal: an open story waits for a holder's word, for the unheld grace.
                new, change = _unheld(now, key, old, unheld_grace)
            elif s is None and not old.tainted and not tainted:
                continue  # its pods are there but say nothing of it this time: no news
            else:
                if old.unheld_since is not None or (s is None and gone):
                    # A new holder (or only the taint speaks): the story goes on under it.
                    old = dataclasses.replace(old, unheld_since=None, holders=frozenset())
                if s is None and gone:
                    old = dataclasses.replace(old, health=HEALTHY, since=None)
                about = _about_seen(s) if s is not None else _about_held(held[key])
                health = _health(s.verdict) if s is not None else old.health
                first = s.first_seen if s is not None else None
                uids = old.holders | (s.uids if s is not None else frozenset())
                said = Said(health, tainted, bad.get(key, ()), first, uids)
                held_by = held[key][2] if key in held else ()
                new, change = _step(now, key, old, said, about, held_by, unknown_grace, holding)
                new, change = _routed(old, new, change)
                if new is not None and held_by:
                    new = dataclasses.replace(new, last_held_by=held_by)
            if change is not None:
                out.append(change)
            if new is None:
                devices.pop(key, None)
            else:
                devices[key] = new
        state = DeviceHealth(tuple(sorted(devices.items())), tuple(sorted(pending.items())), self.rules)
        return state, out

    def observe_rules(
        self, rules: Sequence[TaintRule] | None, inventory: Inventory
    ) -> tuple[DeviceHealth, list[Change]]:
        """The DeviceTaintRules that evict from every device: told once, lifted once (None: not
        read now, nothing lifts)."""
        alarms, out = self.rules.observe(rules, inventory)
        return dataclasses.replace(self, rules=alarms), out

    def to_json(self) -> dict[str, Any]:
        """The open stories and their holders, for the saved state (small: a healthy device is
        not saved, so after a restart a driver is known to report health once it says Healthy
        again). Times are monotonic and mean nothing to the next process: an Unknown's grace, and
        an unheld device's, start again after a restart."""
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
                    "tainted": d.tainted,
                    "sources": sorted(d.sources),
                    "was_healthy": d.was_healthy,
                    "unheld": d.unheld_since is not None,
                    "last_held_by": list(d.last_held_by),
                    "told": sorted(d.told),
                }
                for k, d in self.devices
                if d.reported is not None
            ],
            "rules": self.rules.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> DeviceHealth:
        """The state `to_json` saved, read at monotonic time `now`; anything unreadable is an
        empty state, never an error (the worst it costs is a failure reported again, or a heal
        not reported)."""
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
                tainted = entry.get("tainted", False) is True
                # A state saved before taints were read knew one source only.
                sources = entry.get("sources", [SOURCE] if reported == UNHEALTHY else [])
                if not isinstance(sources, list) or not all(x in _SOURCES for x in sources):
                    continue
                last = entry.get("last_held_by", [])
                if not isinstance(last, list) or not all(isinstance(h, str) for h in last):
                    last = []
                told = entry.get("told", [])
                if not isinstance(told, list) or not all(isinstance(n, str) for n in told):
                    told = []
                devices[key] = _Device(
                    health,
                    reported,
                    None,
                    frozenset(uids),
                    tainted,
                    frozenset(sources),
                    was_healthy=entry.get("was_healthy", False) is True,
                    unheld_since=now if entry.get("unheld", False) is True else None,
                    last_held_by=tuple(last),
                    told=frozenset(told),
                )
            return cls(tuple(sorted(devices.items())), rules=RuleAlarms.from_json(data.get("rules")))
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
            found = claim_device_of(inventory.pod(pod.namespace, pod.name), pod, v)
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


def _about_seen(s: _Seen) -> About:
    pod_claim, request = s.verdict.claim
    message = printable(s.verdict.message[:_MESSAGE_MAX])
    return About(s.claim, s.device, pod_claim, request, message, f"{s.pod.key}/{s.verdict.container}")


def _about_held(held: tuple[str, ClaimDevice, tuple[str, ...]]) -> About:
    claim, device, holders = held
    return About(claim, device, None, None, "", holders[0])


def _rank(health: str) -> int:
    return _RANK.get(health, _RANK[UNKNOWN])


def _health(verdict: DeviceVerdict) -> str:
    # Anything but the three words is no verdict at all: unknown, never a failure.
    return verdict.health if verdict.health in _RANK else UNKNOWN


def _unheld(now: float, key: DeviceKey, old: _Device, grace: float) -> tuple[_Device | None, Change | None]:
    """A device no pod holds: forgotten when no story is open; an open one waits `grace` for a new
    holder, then ends unconfirmed."""
    if old.reported is None:
        return None, None
    since = old.unheld_since if old.unheld_since is not None else now
    if now - since < grace:
        return dataclasses.replace(old, unheld_since=since), None
    return None, unobserved_change(key, old.reported, old.sources, old.last_held_by, now - since, old.told)


def _routed(old: _Device, new: _Device | None, change: Change | None) -> tuple[_Device | None, Change | None]:
    """The namespaces an open story was routed to, kept; and its end routed there too."""
    said = frozenset(change.details.get("namespaces") or ()) if change is not None else frozenset()
    if change is not None and change.kind is Kind.DEVICE_HEALTHY and old.told - said:
        namespaces = sorted(said | old.told)
        change = Change(
            change.kind, change.severity, change.summary, {**change.details, "namespaces": namespaces}
        )
    if new is not None and new.reported is not None:
        new = dataclasses.replace(new, told=(old.told if old.reported is not None else frozenset()) | said)
    return new, change


def _step(
    now: float,
    key: DeviceKey,
    old: _Device,
    said: Said,
    about: About,
    held_by: tuple[str, ...],
    grace: float,
    holding: bool,
) -> tuple[_Device | None, Change | None]:
    """One device's new state (None: nothing to remember), and its event if this observation makes
    one: ONE story whichever source saw the failure first, healed once neither says Unhealthy."""
    health, uids = said.health, said.uids
    was_healthy = old.was_healthy or health == HEALTHY
    # Which taints say it: a slice's, an admin's rule's, or (none read this time) those last read.
    tainted_by = frozenset(t.source for t in said.taints) or (old.sources & _TAINT_SOURCES or {SLICE_SOURCE})
    now_bad = frozenset([SOURCE] if health == UNHEALTHY else []) | (
        tainted_by if said.tainted else frozenset()
    )
    if now_bad:
        if old.reported == UNHEALTHY:
            kept = _Device(health, UNHEALTHY, None, uids, said.tainted, old.sources | now_bad, was_healthy)
            return kept, None
        new = _Device(health, UNHEALTHY, None, uids, said.tainted, now_bad, was_healthy)
        return new, story_change(Kind.DEVICE_UNHEALTHY, key, about, held_by, now_bad, said)
    # An Unknown holds a failure the Pod status reported open (no news is no heal); a failure only
    # the taints reported heals when they go, whatever an Unknown says.
    if health == HEALTHY or (health == UNKNOWN and old.reported == UNHEALTHY and SOURCE not in old.sources):
        after = _Device(health, None, None, uids, was_healthy=was_healthy)
        if old.reported is not None:
            story = old.sources or frozenset([SOURCE])
            return after, story_change(Kind.DEVICE_HEALTHY, key, about, held_by, story, said)
        return after, None  # an Unknown healed within the grace says nothing
    # Unknown: the driver stopped reporting, or never reported at all.
    if old.reported is not None:
        return dataclasses.replace(old, health=UNKNOWN, since=None, holders=uids, tainted=False), None
    if not was_healthy:
        # The kubelet's default for a driver without health reports: nothing to say, ever.
        return None, None
    if holding:
        # Drivers re-register during the kubelet's warm-up: the grace starts once it is over.
        return _Device(UNKNOWN, None, now, uids, was_healthy=True), None
    candidates = [t for t in (old.since if old.health == UNKNOWN else None, said.first_seen) if t is not None]
    since = min(candidates, default=now)
    if now - since >= grace:
        change = story_change(
            Kind.DEVICE_HEALTH_UNKNOWN, key, about, held_by, frozenset([SOURCE]), said, now - since
        )
        return _Device(UNKNOWN, UNKNOWN, None, uids, sources=frozenset([SOURCE]), was_healthy=True), change
    return _Device(UNKNOWN, None, since, uids, was_healthy=True), None
