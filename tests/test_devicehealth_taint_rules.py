"""DeviceTaintRules matched against the node's held DRA devices (pure): the selector's driver, pool
and device each narrow it, an empty selector matches every device and a missing one none (upstream's
resourceslice tracker), an unknown effect counts as None; a rule's taint joins the device's one story
with the slices' and the Pod status's, naming the rule; eight devices tainted by one rule are one
device.incident (one page); a NoExecute rule with an empty selector is one critical
device.taint_rule_evicts_all keyed by its uid alone (the same on every node), not also a page per
device or an incident, and its lift ends it."""

from __future__ import annotations

import json
from typing import Any

from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.pods import UNHEALTHY
from watcher.model.devicehealth.taint_rules import RuleAlarms, TaintRule, device_taints, rules_of
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.events import Event
from watcher.model.incidents import Incidents
from watcher.model.routing import Route
from watcher.sinks.pagerduty import pagerduty_event

CDI = "k8s.gpu.nvidia.com/gpu=gpu-3"
GRACE = 300.0
EIGHT = claim_inventory(
    {f"ml/train-{i}": ("trainer", f"claim-{i}", [("node-1", f"gpu-{i}", None)]) for i in range(8)}
)
ONE = claim_inventory({"ml/llm-pretrain-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", CDI)])})


def rule(
    name: str, selector: dict[str, str] | None, effect: str = "NoExecute", uid: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": {"key": "example.com/maintenance", "value": "rma", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}"}, "spec": spec}


def held(inventory: Any) -> list[tuple[str, str, str]]:
    return sorted(inventory.tally.claim_holders)


def test_the_selector_narrows_by_driver_pool_and_device_and_a_missing_one_matches_nothing() -> None:
    devices = [
        (DRIVER, "node-1", "gpu-0"),
        (DRIVER, "node-2", "gpu-0"),
        ("nic.example.com", "node-1", "eth0"),
    ]
    cases = {
        "driver": ({"driver": DRIVER}, {devices[0], devices[1]}),
        "pool": ({"pool": "node-1"}, {devices[0], devices[2]}),
        "device": ({"driver": DRIVER, "pool": "node-2", "device": "gpu-0"}, {devices[1]}),
        "other": ({"driver": "other.example.com"}, set()),
    }
    for name, (selector, want) in cases.items():
        rules = rules_of([rule(name, selector, "NoSchedule")])
        taints = device_taints(rules, devices)
        assert {t.device_key for t in taints} == want, name
        assert all(t.rule == name and t.fails for t in taints)
    assert device_taints(rules_of([rule("none", None, "NoSchedule")]), devices) == ()
    everything = device_taints(rules_of([rule("all", {}, "NoSchedule")]), devices)
    assert {t.device_key for t in everything} == set(devices)


def test_an_unknown_effect_is_none_and_a_rule_of_the_wrong_shape_is_skipped() -> None:
    (odd,) = rules_of([rule("odd", {"driver": DRIVER}, "EvictLater"), {"metadata": {"name": "x"}}, "junk"])
    assert odd.effect == "None"
    (taint,) = device_taints([odd], [(DRIVER, "node-1", "gpu-3")])
    assert not taint.fails
    # On a held device: no story, nothing to page.
    state, changes = DeviceHealth().observe(0.0, ONE, None, unknown_grace=GRACE, taints=(taint,))
    assert changes == [] and state.open() == frozenset()
    assert not odd.evicts_all and not rules_of([rule("odd-all", {}, "EvictLater")])[0].evicts_all


def test_a_rule_joins_the_slice_taint_and_the_pod_status_in_one_story_naming_the_rule() -> None:
    slice_taint = DeviceTaint(DRIVER, "node-1", "gpu-3", "gpu.nvidia.com/xid", "79", "NoExecute")
    (by_rule,) = device_taints(rules_of([rule("rma-gpu-3", {"device": "gpu-3"})]), held(ONE))
    state, (failed,) = DeviceHealth().observe(0.0, ONE, None, unknown_grace=GRACE, taints=(by_rule,))
    assert failed.kind is Kind.DEVICE_UNHEALTHY and failed.severity is Severity.CRITICAL
    assert failed.details["sources"] == ["device-taint-rule"] and failed.details["rules"] == ["rma-gpu-3"]
    assert "example.com/maintenance=rma (NoExecute, rule rma-gpu-3)" in failed.summary
    assert failed.details["taints"][0]["rule"] == "rma-gpu-3"
    # The slice and the Pod status say it too: the same story, no second event.
    bad = verdict_pod("ml/llm-pretrain-0", "trainer", [(CDI, UNHEALTHY, "XID 79")])
    state, again = state.observe(1.0, ONE, [bad], unknown_grace=GRACE, taints=(by_rule, slice_taint))
    assert again == [] and state.open() == {(DRIVER, "node-1", "gpu-3")}
    # The saved state keeps the rule as a source.
    restored = DeviceHealth.from_json(json.loads(json.dumps(state.to_json())), now=2.0)
    assert restored.devices == state.devices


def test_one_rule_tainting_eight_held_devices_is_one_incident() -> None:
    taints = device_taints(rules_of([rule("drain-gpus", {"driver": DRIVER})]), held(EIGHT))
    assert len(taints) == 8
    _, changes = DeviceHealth().observe(0.0, EIGHT, None, unknown_grace=GRACE, taints=taints)
    assert [c.kind for c in changes] == [Kind.DEVICE_UNHEALTHY] * 8
    assert all(c.details["rules"] == ["drain-gpus"] for c in changes)
    _, grouped = Incidents().group("c1", changes, 8)
    # A paging sink's route skips the devices marked with the incident: one trigger, the incident's.
    route = Route(min_severity=Severity.WARNING, resolutions=True, skip_incident_devices=True)
    paged = [p for c in grouped if route.matches(_event(c)) and (p := _pd(c)) is not None]
    assert [p["payload"]["class"] for p in paged] == ["device.incident"]


def _pd(change: Any, node: str = "node-a") -> dict[str, Any] | None:
    active = {"pod-resources-watcher/device-taint-rule/uid-all"}
    return pagerduty_event(_event(change, node), "rk", active_keys=active)


def test_an_empty_noexecute_rule_is_one_cluster_wide_story_not_a_page_per_device() -> None:
    rules = rules_of([rule("evict-all", {}, uid="uid-all")])
    (r,) = rules
    assert r.evicts_all
    # Its taints are not told per device (that would be a second page, as an incident).
    assert device_taints(rules, held(EIGHT)) == ()
    alarms, (opened,) = RuleAlarms().observe(rules, EIGHT)
    assert opened.kind is Kind.DEVICE_TAINT_RULE_EVICTS_ALL and opened.severity is Severity.CRITICAL
    assert opened.details["rule"] == "evict-all" and opened.details["rule_uid"] == "uid-all"
    assert opened.details["device_count"] == 8 and len(opened.details["allocated_to"]) == 8
    assert "DeviceTaintRule evict-all" in opened.summary
    # Read again: nothing new; not read (an outage): nothing lifted.
    assert alarms.observe(rules, EIGHT)[1] == [] and alarms.observe(None, EIGHT)[1] == []
    # The same dedup key on every node: one PagerDuty incident.
    a, b = _pd(opened, "node-a"), _pd(opened, "node-b")
    assert a is not None and b is not None and a["dedup_key"] == b["dedup_key"]
    assert a["dedup_key"] == "pod-resources-watcher/device-taint-rule/uid-all"
    # Its effect changes to NoSchedule: lifted (its devices are now tainted one by one instead).
    changed = rules_of([rule("evict-all", {}, "NoSchedule", uid="uid-all")])
    later, (lifted,) = alarms.observe(changed, EIGHT)
    assert lifted.kind is Kind.DEVICE_TAINT_RULE_LIFTED and lifted.details["why"] == "changed"
    resolve = _pd(lifted)
    assert (
        resolve is not None
        and resolve["event_action"] == "resolve"
        and resolve["dedup_key"] == a["dedup_key"]
    )
    assert later.open == () and len(device_taints(changed, held(EIGHT))) == 8
    # Deleted: lifted, once.
    _, (gone,) = alarms.observe((), EIGHT)
    assert gone.details["why"] == "deleted"
    cond = condition_of(_event(gone))
    assert cond is not None and not cond.active and cond.key == "device-taint-rule/uid-all"


def test_the_open_rule_outlives_a_restart() -> None:
    rules = rules_of([rule("evict-all", {}, uid="uid-all")])
    state, told = DeviceHealth().observe_rules(rules, EIGHT)
    assert [c.kind for c in told] == [Kind.DEVICE_TAINT_RULE_EVICTS_ALL]
    restored = DeviceHealth.from_json(json.loads(json.dumps(state.to_json())), now=1.0)
    assert restored.rules == state.rules
    assert restored.observe_rules(rules, EIGHT)[1] == []  # not told again
    assert [c.kind for c in restored.observe_rules((), EIGHT)[1]] == [Kind.DEVICE_TAINT_RULE_LIFTED]
    assert RuleAlarms.from_json([{"uid": 3}]) == RuleAlarms()


def test_rule_taints_sort_and_compare_beside_slice_taints() -> None:
    slice_taint = DeviceTaint(DRIVER, "p", "d", "k", "v", "NoExecute")
    rule_taint = DeviceTaint(DRIVER, "p", "d", "k", "v", "NoExecute", rule="r")
    assert slice_taint != rule_taint and sorted([rule_taint, slice_taint]) == [slice_taint, rule_taint]
    assert slice_taint.to_json() == {"key": "k", "value": "v", "effect": "NoExecute"}
    assert rule_taint.source == "device-taint-rule" and slice_taint.source == "resource-slice"
    assert TaintRule("n", "u", "k", selects=False).matches((DRIVER, "p", "d")) is False


def _event(change: Any, node: str = "node-a") -> Event:
    return Event(
        "e",
        1,
        "2026-12-03T05:00:00Z",
        node,
        change.kind,
        change.severity,
        change.summary,
        dict(change.details),
        "c1",
        None,
        None,
    )
