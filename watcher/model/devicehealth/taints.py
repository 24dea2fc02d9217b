"""DRA device taints: what the node's ResourceSlices say of their devices, the second source of
DRA device health beside the Pod status. Pure: the caller brings the slices as the API server
answered them (JSON objects); this reads the taints out of them and says which count as a failure.

A taint with effect NoSchedule or NoExecute means the driver (or an admin's DeviceTaintRule) says the
device is bad; effect None is informational and never a failure. A slice is read only for its
node's devices: `spec.nodeName` must be the agent's node (the list asks for that; a slice of another
node, or one for a whole pool of nodes, says nothing of ours). An admin's DeviceTaintRule, matched
against the node's devices (watcher.model.devicehealth.taint_rules), is the same DeviceTaint with
the rule's name in `rule`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceTaint", "FAILING_EFFECTS", "RULE_SOURCE", "SOURCE", "failing", "taints_of_slices"]

SOURCE = "resource-slice"
RULE_SOURCE = "device-taint-rule"
FAILING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# What an event carries of one taint's key and value (the API allows 63 + 253 and 63).
_TEXT_MAX = 320

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True, order=True)
class DeviceTaint:
    """One taint on one device, as the agent last read it: a ResourceSlice's, or (`rule` set) the
    one a DeviceTaintRule of that name puts on it. The rule's name is part of its identity, so the
    same key from a slice and from a rule are two taints (both are said), and sorting stays total."""

    driver: str
    pool: str
    device: str
    key: str
    value: str = ""
    effect: str = "NoSchedule"
    rule: str = ""

    @property
    def device_key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)

    @property
    def fails(self) -> bool:
        """Whether it says the device is bad (NoSchedule, NoExecute; None is informational)."""
        return self.effect in FAILING_EFFECTS

    @property
    def source(self) -> str:
        """Which source said it: a slice, or an admin's DeviceTaintRule."""
        return RULE_SOURCE if self.rule else SOURCE

    @property
    def text(self) -> str:
        """`key=value (effect)`, as events word it (`key (effect)` without a value), and `rule NAME`
        after the effect when a DeviceTaintRule put it there (whom to ask to lift it)."""
        said = f"{self.key}={self.value}" if self.value else self.key
        by = f", rule {self.rule[:_TEXT_MAX]}" if self.rule else ""
        return f"{said[:_TEXT_MAX]} ({self.effect}{by})"

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.rule:
            out["rule"] = self.rule
        return out


def failing(taints: Iterable[DeviceTaint]) -> dict[DeviceKey, tuple[DeviceTaint, ...]]:
    """The taints that say a device is bad, per device, sorted (one text whatever the order read)."""
    out: dict[DeviceKey, set[DeviceTaint]] = {}
    for t in taints:
        if t.fails:
            out.setdefault(t.device_key, set()).add(t)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def taints_of_slices(slices: Iterable[Any], node: str) -> tuple[DeviceTaint, ...]:
    """Every taint on the devices of `node`'s slices, sorted; a slice or entry of the wrong shape is
    skipped (the API server validated it; what we cannot read says nothing)."""
    out: set[DeviceTaint] = set()
    for obj in slices:
        spec = _mapping(_mapping(obj).get("spec"))
        if spec.get("nodeName") != node:
            continue
        driver, pool = spec.get("driver"), _mapping(spec.get("pool")).get("name")
        if not isinstance(driver, str) or not isinstance(pool, str):
            continue
        for device in _list(spec.get("devices")):
            name = _mapping(device).get("name")
            if not isinstance(name, str):
                continue
            for taint in _list(_mapping(device).get("taints")):
                t = _mapping(taint)
                key, value, effect = t.get("key"), t.get("value") or "", t.get("effect")
                if isinstance(key, str) and isinstance(value, str) and isinstance(effect, str):
                    out.add(DeviceTaint(driver, pool, name, key, value, effect))
    return tuple(sorted(out))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
