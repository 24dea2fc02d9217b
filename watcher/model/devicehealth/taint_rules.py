"""DeviceTaintRules: an admin's taints on DRA devices, which live beside the ResourceSlices and are
never written into them (the scheduler and the eviction controller merge them in memory), matched
here against the node's devices. Pure: the caller brings the rules as the API server answered them
(JSON objects) and the inventory whose held DRA devices they are matched against.

A rule's `spec.deviceSelector` names a driver, a pool and a device, each optional: a device matches
when it equals every one given, so an empty selector matches every device of the cluster and a rule
without a selector matches none (upstream's resourceslice tracker, applyDeviceTaintRules). A match
is a `DeviceTaint` carrying the rule's name, merged with the slices' taints into one device story
(watcher.model.devicehealth.verdicts). An effect other than None, NoSchedule or NoExecute is read
as None, as the API tells consumers to: informational, never a failure, never a page.

A NoExecute rule with an empty selector is another matter: it evicts every DRA pod of the cluster
at once. That is one cluster-wide story, `device.taint_rule_evicts_all` (critical) until the rule
goes or stops matching everything, then `device.taint_rule_lifted`; its condition is keyed by the
rule's uid alone, the same on every node, so every node's agent folds into one page. Its devices
are not also told one by one (`device_taints` leaves them out): that would page the same rule a
second time, as a device.incident.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.taints import RULE_SOURCE, DeviceTaint
from watcher.model.inventory import Inventory
from watcher.model.wording import make_change, printable

__all__ = ["KNOWN_EFFECTS", "RuleAlarms", "TaintRule", "device_taints", "rules_of"]

KNOWN_EFFECTS = frozenset({"None", "NoSchedule", "NoExecute"})
# What an event shows of a rule's name and its devices (a node's held DRA devices are few).
_NAME_MAX = 253
_SHOWN = 20

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True, order=True)
class TaintRule:
    """One DeviceTaintRule as read. `driver`, `pool`, `device`: the selector's fields (None: not
    given); `selects`: False when the rule has no selector at all (it matches nothing)."""

    name: str
    uid: str
    key: str
    value: str = ""
    effect: str = "None"
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    selects: bool = True

    @property
    def evicts_all(self) -> bool:
        """An empty selector with NoExecute: every DRA pod of the cluster is evicted."""
        empty = self.driver is None and self.pool is None and self.device is None
        return self.selects and empty and self.effect == "NoExecute"

    def matches(self, key: DeviceKey) -> bool:
        if not self.selects:
            return False
        return all(
            want is None or want == got
            for want, got in zip((self.driver, self.pool, self.device), key, strict=True)
        )

    def taint_on(self, key: DeviceKey) -> DeviceTaint:
        return DeviceTaint(*key, self.key, self.value, self.effect, rule=self.name)


def rules_of(objects: Iterable[Any]) -> tuple[TaintRule, ...]:
    """The rules among `objects` (DeviceTaintRule JSON), sorted; one of the wrong shape is skipped
    (the API server validated it: what we cannot read says nothing)."""
    out: set[TaintRule] = set()
    for obj in objects:
        meta, spec = _mapping(_mapping(obj).get("metadata")), _mapping(_mapping(obj).get("spec"))
        taint = _mapping(spec.get("taint"))
        texts = [meta.get("name"), meta.get("uid"), taint.get("key"), taint.get("value") or ""]
        selector = spec.get("deviceSelector")
        fields = [_mapping(selector).get(f) for f in ("driver", "pool", "device")]
        name, uid, key, value = (t if isinstance(t, str) else None for t in texts)
        driver, pool, device = (f if isinstance(f, str) else None for f in fields)
        if name is None or uid is None or key is None or value is None:
            continue
        if any(f is not None and not isinstance(f, str) for f in fields):
            continue
        effect = taint.get("effect")
        known = effect if isinstance(effect, str) and effect in KNOWN_EFFECTS else "None"
        selects = isinstance(selector, Mapping)
        out.add(TaintRule(name, uid, key, value, known, driver, pool, device, selects=selects))
    return tuple(sorted(out))


def device_taints(rules: Iterable[TaintRule], devices: Iterable[DeviceKey]) -> tuple[DeviceTaint, ...]:
    """The taints `rules` put on `devices` (the node's held DRA devices), sorted; a rule that evicts
    everything is left out (it is its own story, see the module)."""
    keys = sorted(set(devices))
    return tuple(sorted({r.taint_on(k) for r in rules if not r.evicts_all for k in keys if r.matches(k)}))


@dataclass(frozen=True, order=True)
class _Alarm:
    uid: str
    name: str
    text: str  # the taint as told, for the lift's summary


@dataclass(frozen=True)
class RuleAlarms:
    """The rules that evict everything, told and not lifted yet (kept in the saved state)."""

    open: tuple[_Alarm, ...] = ()

    def observe(
        self, rules: Sequence[TaintRule] | None, inventory: Inventory
    ) -> tuple[RuleAlarms, list[Change]]:
        """The new state and its changes. `rules` None: none read (never, or not now): an outage
        lifts nothing."""
        if rules is None:
            return self, []
        now = {r.uid: r for r in rules if r.evicts_all}
        by_uid = {r.uid: r for r in rules}
        held = sorted(inventory.tally.claim_holders.items())
        out = [
            _evicts_all(r, held) for uid, r in sorted(now.items()) if uid not in {a.uid for a in self.open}
        ]
        out += [_lifted(a, by_uid.get(a.uid)) for a in self.open if a.uid not in now]
        kept = [a for a in self.open if a.uid in now]
        added = [
            _Alarm(r.uid, r.name, _text(r)) for uid, r in now.items() if uid not in {a.uid for a in kept}
        ]
        return RuleAlarms(tuple(sorted(kept + added))), out

    def to_json(self) -> list[dict[str, str]]:
        return [{"uid": a.uid, "name": a.name, "text": a.text} for a in self.open]

    @classmethod
    def from_json(cls, data: Any) -> RuleAlarms:
        """What `to_json` saved; an unreadable entry is left out (the worst: a lift not told)."""
        out = []
        for entry in data if isinstance(data, list) else ():
            uid, name, text = (_mapping(entry).get(k) for k in ("uid", "name", "text"))
            if isinstance(uid, str) and isinstance(name, str) and isinstance(text, str):
                out.append(_Alarm(uid, name, text))
        return cls(tuple(sorted(out)))


def _text(rule: TaintRule) -> str:
    said = f"{rule.key}={rule.value}" if rule.value else rule.key
    return f"{printable(said[:320])} ({rule.effect})"


def _identity(uid: str, name: str) -> dict[str, Any]:
    # `rule_uid` keys its condition (watcher.model.conditions): the same on every node.
    return {"rule": name[:_NAME_MAX], "rule_uid": uid, "source": RULE_SOURCE}


def _evicts_all(rule: TaintRule, held: Sequence[tuple[DeviceKey, Any]]) -> Change:
    devices = [f"{d}/{p}/{n}" for (d, p, n), _ in held]
    holders = sorted({h for _, entry in held for h in entry[0]})
    details = _identity(rule.uid, rule.name) | {
        "taint": {"key": rule.key, "value": rule.value, "effect": rule.effect},
        "devices": devices[:_SHOWN],
        "device_count": len(devices),
        "allocated_to": holders[:_SHOWN],
        "holders_count": len(holders),
    }
    here = f"; here {len(devices)} held DRA device(s), {len(holders)} container(s)" if devices else ""
    summary = (
        f"DeviceTaintRule {printable(rule.name[:_NAME_MAX])} taints every DRA device of the cluster "
        f"with {_text(rule)}: every pod holding one is evicted{here}"
    )
    return make_change(Kind.DEVICE_TAINT_RULE_EVICTS_ALL, Severity.CRITICAL, summary, details)


def _lifted(alarm: _Alarm, rule: TaintRule | None) -> Change:
    why = "deleted" if rule is None else "changed: it no longer evicts from every device"
    details = _identity(alarm.uid, alarm.name) | {"why": "deleted" if rule is None else "changed"}
    summary = f"DeviceTaintRule {printable(alarm.name[:_NAME_MAX])} ({alarm.text}) {why}"
    return make_change(Kind.DEVICE_TAINT_RULE_LIFTED, Severity.INFO, summary, details)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
