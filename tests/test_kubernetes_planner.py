"""What goes into Kubernetes, decided purely (watcher/sinks/kubernetes/planner.py and
condition_plan.py): Events per Pod and Node, and the Node conditions.

The events fed in are the agent's own, made by the real diff of two inventories (and the real
lifecycle builder for watcher.started), so the planner is tested on what it will really be given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from testkit.hostile_text import INVISIBLE, LOOK_ALIKE, hidden_in
from testkit.inventories import GPU, inventory_of
from watcher.model.changes import Change, Kind, Severity
from watcher.model.diff import diff
from watcher.model.events import Event, envelope
from watcher.model.lifecycle import snapshot, started
from watcher.sim.send_test import synthetic_events
from watcher.sinks.kubernetes.condition_plan import (
    CONDITION_SUFFIX,
    OWNER_MARK,
    check_condition_type,
    condition_type,
    conditions_for,
    is_owned,
    shared_types,
)
from watcher.sinks.kubernetes.planner import MAX_NOTE_BYTES, NODE_REASONS, POD_REASONS, plan

NODE = "gpu-node-1"


def _events(changes: Sequence[Change], cycle: str = "c1") -> list[Event]:
    return [
        envelope(c, seq=i + 1, node=NODE, cycle=cycle, before=None, after=None) for i, c in enumerate(changes)
    ]


ALL = [f"GPU-{i}" for i in range(8)]
PODS = {"ml/trainer-0": ["GPU-0", "GPU-1"], "ml/trainer-1": ["GPU-2"], "web/idle": []}


def _by(report_events: Sequence[Any], kind: str) -> list[Any]:
    return [e for e in report_events if e.regarding.kind == kind]


def test_a_gpu_failing_while_allocated_warns_its_pod_and_sets_the_condition() -> None:
    before = inventory_of(ALL, PODS)
    after = inventory_of([g for g in ALL if g != "GPU-1"], PODS)
    report = plan(_events(diff(before, after)), {})
    pod = _by(report.events, "Pod")
    assert [(e.regarding.namespace, e.regarding.name, e.type, e.reason) for e in pod] == [
        ("ml", "trainer-0", "Warning", "DeviceFailed")
    ]
    assert "nvidia.com/gpu GPU-1 (container main)" in pod[0].note
    node = _by(report.events, "Node")
    assert [(e.regarding.name, e.type, e.reason) for e in node] == [(NODE, "Warning", "DeviceRemoved")]
    assert report.missing == {GPU: {"GPU-1": ["ml/trainer-0/main"]}}
    (cond,) = conditions_for(report.missing, report.resources)
    assert (cond.type, cond.status, cond.reason) == (
        "NvidiaGpuDevicesUnavailable",
        "True",
        "DevicesFailedOrMissing",
    )
    assert "GPU-1" in cond.message and "ml/trainer-0" in cond.message

    # Recovery: a Normal Event on the pod that was hit, and the condition False.
    back = plan(_events(diff(after, before), cycle="c2"), report.missing)
    assert [(e.regarding.name, e.type, e.reason) for e in _by(back.events, "Pod")] == [
        ("trainer-0", "Normal", "DeviceRecovered")
    ]
    assert back.missing == {}
    (cond,) = conditions_for(back.missing, back.resources)
    assert (cond.status, cond.reason) == ("False", "DevicesAvailable")


def test_a_mass_failure_is_one_event_per_pod_and_one_condition() -> None:
    pods = {f"ml/job-{i}": [f"GPU-{i}"] for i in range(64)}
    gpus = [f"GPU-{i}" for i in range(64)]
    before, after = inventory_of(gpus, pods), inventory_of([], pods)
    changes = list(diff(before, after))
    assert sum(c.kind is Kind.DEVICE_REMOVED for c in changes) == 64
    report = plan(_events(changes), {})
    per_pod = _by(report.events, "Pod")
    assert len(per_pod) == 64
    assert len({(e.regarding.namespace, e.regarding.name) for e in per_pod}) == 64
    assert len(_by(report.events, "Node")) == 1  # one DeviceRemoved for the resource, all 64 named
    assert len(conditions_for(report.missing, report.resources)) == 1

    # Two failed devices of one pod in one re-query: still one Event for that pod.
    two = plan(_events(diff(inventory_of(ALL, PODS), inventory_of(ALL[2:], PODS))), {})
    assert [e.regarding.name for e in _by(two.events, "Pod")] == ["trainer-0"]
    assert "2 device(s)" in _by(two.events, "Pod")[0].note


def test_an_incident_adds_one_node_event_and_does_not_repeat_its_devices() -> None:
    removed = [
        Change(
            Kind.DEVICE_REMOVED,
            Severity.CRITICAL,
            "x",
            {"resource": GPU, "device": d, "incident": "i1", "allocated_to": [f"ml/job-{d}/main"]},
        )
        for d in ALL
    ]
    incident = Change(
        Kind.DEVICE_INCIDENT,
        Severity.CRITICAL,
        "8 nvidia.com/gpu devices left allocatable at once",
        {"resource": GPU, "incident": "i1", "count": 8, "devices": ALL, "allocated_to": []},
    )
    report = plan(_events([*removed, incident]), {})
    node = _by(report.events, "Node")
    assert [e.reason for e in node] == ["DeviceIncident"]
    assert len(_by(report.events, "Pod")) == 8
    assert set(report.missing[GPU]) == set(ALL)


def test_start_reconciles_from_the_inventory_and_the_saved_state() -> None:
    # GPU-2 failed while held by trainer-1; GPU-7 (unallocated) went missing in the last run.
    inv = inventory_of([g for g in ALL if g not in ("GPU-2", "GPU-7")], PODS)
    start = _events([started(inv, baseline="saved", changes=0, error=None)])
    report = plan(start, {GPU: {"GPU-7": []}})
    assert report.started
    assert report.missing == {GPU: {"GPU-7": [], "GPU-2": ["ml/trainer-1/main"]}}
    (cond,) = conditions_for(report.missing, report.resources)
    assert cond.status == "True" and "GPU-2" in cond.message and "GPU-7" in cond.message
    assert report.events == []  # a start is not news

    # A healthy node at start: every resource's condition is set, False.
    healthy = plan(_events([started(inventory_of(ALL, PODS), baseline="saved", changes=0, error=None)]), {})
    assert [(c.type, c.status) for c in conditions_for(healthy.missing, healthy.resources)] == [
        ("NvidiaGpuDevicesUnavailable", "False")
    ]

    # Started while the kubelet warms up (no GPU allocatable yet, the pods' GPUs all absent): not a
    # failure, whatever the pods hold; settling reports it as device.removed if it lasts.
    warming = plan(_events([started(inventory_of([], PODS), baseline="fresh", changes=0, error=None)]), {})
    assert warming.missing == {}
    assert [c.status for c in conditions_for(warming.missing, warming.resources)] == ["False"]

    # The kubelet not reachable at start: the saved state stands, nothing is invented.
    blind = plan(_events([started(None, baseline="saved", changes=0, error="x")]), {GPU: {"GPU-7": []}})
    assert blind.missing == {GPU: {"GPU-7": []}}
    assert not blind.started and blind.resources == set()  # no condition touched, none pruned


def test_a_device_back_at_start_is_cleared_by_its_presence_alone() -> None:
    # The saved state has GPU-3 missing (it was flapping; or its device.added was dropped by the
    # queue's caps), and no event will ever say it came back: the restart lost the flap state, and
    # the saved inventory already had it. Being allocatable now is the evidence.
    report = plan(
        _events([started(inventory_of(ALL, PODS), baseline="saved", changes=0, error=None)]),
        {GPU: {"GPU-3": ["ml/trainer-0/main"]}},
    )
    assert report.missing == {}
    assert [c.status for c in conditions_for(report.missing, report.resources)] == ["False"]
    # Still absent: still missing, even when nothing holds it.
    gone = plan(
        _events([started(inventory_of(ALL[:3], PODS), baseline="saved", changes=0, error=None)]),
        {GPU: {"GPU-3": []}},
    )
    assert gone.missing == {GPU: {"GPU-3": []}}


def test_an_inventory_snapshot_reconciles_like_a_start() -> None:
    inv = inventory_of([g for g in ALL if g != "GPU-2"], PODS)
    report = plan(_events([snapshot(inv)]), {GPU: {"GPU-5": []}})
    assert report.started and report.events == []
    assert report.missing == {GPU: {"GPU-2": ["ml/trainer-1/main"]}}


def test_flapping_keeps_the_condition_until_it_ends_present() -> None:
    flapping = Change(
        Kind.DEVICE_FLAPPING,
        Severity.WARNING,
        "GPU-3 is flapping",
        {"resource": GPU, "device": "GPU-3", "present": True, "allocated_to": ["ml/a/main"]},
    )
    report = plan(_events([flapping]), {})
    assert report.missing == {GPU: {"GPU-3": ["ml/a/main"]}}
    assert {(e.regarding.kind, e.reason) for e in report.events} == {
        ("Node", "DeviceFlapping"),
        ("Pod", "DeviceFlapping"),
    }
    ended_missing = Change(
        Kind.DEVICE_FLAP_ENDED, Severity.WARNING, "x", {"resource": GPU, "device": "GPU-3", "present": False}
    )
    assert plan(_events([ended_missing]), report.missing).missing == report.missing
    ended = Change(
        Kind.DEVICE_FLAP_ENDED, Severity.INFO, "x", {"resource": GPU, "device": "GPU-3", "present": True}
    )
    back = plan(_events([ended]), report.missing)
    assert back.missing == {}
    assert ("Pod", "DeviceRecovered") in {(e.regarding.kind, e.reason) for e in back.events}


def test_allocation_and_capacity_bookkeeping_is_not_an_event() -> None:
    before = inventory_of(ALL, {"ml/a": []})
    after = inventory_of(ALL, {"ml/a": ["GPU-0"]})
    changes = diff(before, after)
    assert {c.kind for c in changes} >= {Kind.ALLOCATION_ADDED, Kind.CAPACITY_CHANGED}
    report = plan(_events(changes), {})
    assert report.events == [] and report.resources == set()


def test_repeats_have_the_same_key_and_different_words_do_not() -> None:
    before, after = inventory_of(ALL, PODS), inventory_of(ALL[1:], PODS)
    one = plan(_events(diff(before, after)), {})
    two = plan(_events(diff(before, after), cycle="c9"), {})
    assert [e.key for e in one.events] == [e.key for e in two.events]
    other = plan(_events(diff(before, inventory_of(ALL[2:], PODS))), {})
    assert {e.key for e in _by(one.events, "Pod")}.isdisjoint({e.key for e in _by(other.events, "Pod")})


def test_condition_types_are_stable_valid_and_ours() -> None:
    assert condition_type("nvidia.com/gpu") == "NvidiaGpuDevicesUnavailable"
    assert condition_type("example.com/sriov-nic") == "ExampleSriovNicDevicesUnavailable"
    assert (
        condition_type("nvidia.com/gpu", {"nvidia.com/gpu": "GpuDevicesUnavailable"})
        == "GpuDevicesUnavailable"
    )
    assert check_condition_type("Ready") is not None  # never the kubelet's
    assert check_condition_type("NetworkUnavailable") is not None
    assert check_condition_type(CONDITION_SUFFIX) is not None
    assert check_condition_type("Gpu DevicesUnavailable") is not None


def test_every_condition_carries_the_agents_mark_and_only_marked_ones_are_owned() -> None:
    failed = {GPU: {"GPU-1": ["ml/trainer-0/main"]}}
    for cond in [*conditions_for(failed, {GPU}), *conditions_for({}, {GPU})]:
        assert cond.message.startswith(OWNER_MARK) and is_owned(cond.type, cond.message)
    # Named like ours, written by someone else (a NIC operator, a GPU operator): not ours.
    assert not is_owned("VendorNicDevicesUnavailable", "2 NICs down")
    assert not is_owned("NvidiaGpuDevicesUnavailable", None)
    assert not is_owned("Ready", OWNER_MARK + "forged")


def test_resources_that_derive_one_type_share_a_condition_true_while_any_is_failed() -> None:
    """nvidia.com/gpu and nvidia.io/gpu both derive NvidiaGpuDevicesUnavailable: a batch about the
    healthy one must not write False over the other's failed device."""
    other = "nvidia.io/gpu"
    assert condition_type(other) == condition_type(GPU)
    failed = {GPU: {"GPU-1": ["ml/trainer-0/main"]}}
    for asked in ({other}, {GPU, other}):
        (cond,) = conditions_for(failed, asked)
        assert (cond.type, cond.status) == ("NvidiaGpuDevicesUnavailable", "True"), asked
        assert "GPU-1" in cond.message
    both = {**failed, other: {"X-0": []}}
    (cond,) = conditions_for(both, {other})
    assert cond.status == "True" and "GPU-1" in cond.message and "X-0" in cond.message
    (cond,) = conditions_for({}, {GPU, other})
    assert cond.status == "False" and GPU in cond.message and other in cond.message
    nics = {"example.com/sriov-nic", "example.com/sriov_nic"}
    assert shared_types({GPU, other, *nics, "amd.com/gpu"}) == {
        "NvidiaGpuDevicesUnavailable": [GPU, other],
        "ExampleSriovNicDevicesUnavailable": sorted(nics),
    }
    assert shared_types({GPU, other}, {other: "NvidiaIoGpuDevicesUnavailable"}) == {}


# What Kubernetes accepts as a condition type (metav1.Condition's rule, the strictest in use).
_K8S_TYPE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


@given(st.text(max_size=80))
def test_any_resource_name_gives_a_valid_owned_type(resource: str) -> None:
    ctype = condition_type(resource)
    assert _K8S_TYPE.fullmatch(ctype) and len(ctype) <= 316
    assert ctype.endswith(CONDITION_SUFFIX) and check_condition_type(ctype) is None
    assert condition_type(resource) == ctype


@given(st.text(min_size=1, max_size=300), st.integers(min_value=1, max_value=200))
def test_hostile_names_make_bounded_one_line_notes(name: str, count: int) -> None:
    changes = [
        Change(
            Kind.DEVICE_REMOVED,
            Severity.CRITICAL,
            "x",
            {"resource": GPU, "device": f"{name}{i}", "allocated_to": [f"ml/p/{name}"]},
        )
        for i in range(count)
    ]
    report = plan(_events(changes), {})
    for e in report.events:
        assert len(e.note.encode()) <= MAX_NOTE_BYTES
        assert "\n" not in e.note and "\x1b" not in e.note
    for c in conditions_for(report.missing, report.resources):
        assert "\n" not in c.message and len(c.message.encode()) <= 1024


@given(st.text(alphabet=st.sampled_from([*INVISIBLE.values(), "a", "-", "1"]), min_size=1, max_size=40))
def test_invisible_and_combining_characters_are_escaped_in_notes_and_messages(name: str) -> None:
    """What kubectl shows a person (Event notes, condition messages) has no zero-width, bidi or tag
    character and no combining mark as it is: a look-alike device reads as what it is."""
    changes = [
        Change(
            Kind.DEVICE_REMOVED,
            Severity.CRITICAL,
            f"{GPU} {device} left allocatable",
            {"resource": GPU, "device": device, "allocated_to": [f"ml/p{name}/c"]},
        )
        for device in (LOOK_ALIKE, f"GPU-{name}")
    ]
    report = plan(_events(changes), {})
    assert report.events
    for e in report.events:
        assert hidden_in(e.note) == [], e.note
    messages = [c.message for c in conditions_for(report.missing, report.resources)]
    assert messages and any("GPU-1\\u200b" in m for m in messages), messages
    for m in messages:
        assert hidden_in(m) == [], m


def test_every_reason_is_documented_camel_case() -> None:
    for reason in [*POD_REASONS, *NODE_REASONS]:
        assert re.fullmatch(r"[A-Z][A-Za-z]+", reason), reason


def test_send_test_events_are_one_normal_node_event_and_no_condition() -> None:
    report = plan(synthetic_events(NODE, paging=True), {})
    assert [(e.regarding.kind, e.type, e.reason) for e in report.events] == [
        ("Node", "Normal", "SendTest"),
        ("Node", "Normal", "SendTest"),
    ]
    assert "TEST" in report.events[0].note
    assert report.missing == {} and report.resources == set()


def test_dra_health_stories_leave_the_node_conditions_alone_and_are_node_events() -> None:
    """A DRA device is never in allocatable, which the conditions are kept from: its flapping or
    incident would otherwise stay missing there for good, as nothing in allocatable clears it."""
    dra = {"resource": "gpu.nvidia.com", "source": "pod-status", "allocated_to": ["ml/llm-0/trainer"]}
    changes = [
        Change(
            Kind.DEVICE_UNHEALTHY, Severity.CRITICAL, "gpu-3 unhealthy", {**dra, "device": "node-1/gpu-3"}
        ),
        Change(Kind.DEVICE_FLAPPING, Severity.CRITICAL, "gpu-3 flapping", {**dra, "device": "node-1/gpu-3"}),
        Change(
            Kind.DEVICE_INCIDENT,
            Severity.CRITICAL,
            "8 gpu.nvidia.com devices turned unhealthy at once",
            {**dra, "incident": "i1", "count": 8, "devices": [f"node-1/gpu-{i}" for i in range(8)]},
        ),
    ]
    missing = {GPU: {"GPU-1": ["ml/trainer-0/main"]}}
    report = plan(_events(changes), missing)
    assert report.missing == missing and report.resources == set()
    assert [e.reason for e in _by(report.events, "Node")] == ["DeviceFlapping", "DeviceIncident"]


def test_a_taint_rules_stories_set_no_condition_and_a_rule_that_evicts_all_is_a_node_event() -> None:
    """A DeviceTaintRule's taints are DRA stories like the slices': eight devices tainted by one rule
    (an incident) set no condition; a rule evicting from every device is a Node Event, and its lift."""
    rule = {"resource": "gpu.nvidia.com", "source": "device-taint-rule", "sources": ["device-taint-rule"]}
    devices = [f"node-1/gpu-{i}" for i in range(8)]
    incident = Change(
        Kind.DEVICE_INCIDENT,
        Severity.CRITICAL,
        "8 turned unhealthy",
        {**rule, "allocated_to": ["ml/llm-0/trainer"], "incident": "i", "devices": devices},
    )
    evicts = {"rule": "evict-all", "rule_uid": "u1", "source": "device-taint-rule"}
    changes = [
        incident,
        Change(Kind.DEVICE_TAINT_RULE_EVICTS_ALL, Severity.CRITICAL, "evicts all", evicts),
        Change(Kind.DEVICE_TAINT_RULE_LIFTED, Severity.INFO, "lifted", {**evicts, "why": "deleted"}),
    ]
    report = plan(_events(changes), {})
    assert report.missing == {} and report.resources == set()
    assert [e.reason for e in _by(report.events, "Node")] == [
        "DeviceIncident",
        "DeviceTaintRuleEvictsAll",
        "DeviceTaintRuleLifted",
    ]


def test_a_taint_only_dra_incident_never_sets_a_condition_and_a_stuck_one_is_pruned_at_start() -> None:
    """Issue 36 item 6: 8 held DRA GPUs tainted NoExecute in one slice update (an incident) set
    GpuNvidiaComDevicesUnavailable=True, and the taints' removal never cleared it. Whichever source
    tells a DRA story (the Pod status or the slices' taints), the conditions leave it out."""
    taint = {"resource": "gpu.nvidia.com", "source": "resource-slice", "sources": ["resource-slice"]}
    devices = [f"node-1/gpu-{i}" for i in range(8)]
    held = {"allocated_to": ["ml/llm-0/trainer"]}
    failing = [
        Change(
            Kind.DEVICE_UNHEALTHY,
            Severity.CRITICAL,
            "tainted",
            {**taint, **held, "device": d, "incident": "i"},
        )
        for d in devices
    ]
    incident = Change(
        Kind.DEVICE_INCIDENT,
        Severity.CRITICAL,
        "8 turned unhealthy",
        {**taint, **held, "incident": "i", "devices": devices},
    )
    report = plan(_events([*failing, incident]), {})
    assert report.missing == {} and report.resources == set()
    assert [e.reason for e in _by(report.events, "Node")] == ["DeviceIncident"]
    healed = [Change(Kind.DEVICE_HEALTHY, Severity.INFO, "healthy", {**taint, "device": d}) for d in devices]
    resolved = Change(
        Kind.DEVICE_INCIDENT_RESOLVED, Severity.INFO, "over", {**taint, "incident": "i", "count": 8}
    )
    report = plan(_events([*healed, resolved], "c2"), report.missing)
    assert report.missing == {} and [e.reason for e in _by(report.events, "Node")] == [
        "DeviceIncidentResolved"
    ]
    # A state an earlier version left stuck (the driver's devices "missing") is dropped at start;
    # the start then prunes the condition it kept True (only device-plugin resources are written).
    stuck = {"gpu.nvidia.com": {d: [] for d in devices}}
    report = plan(_events([started(inventory_of(ALL, PODS), baseline="saved", changes=0, error=None)]), stuck)
    assert report.started and report.missing == {} and "gpu.nvidia.com" not in report.resources
    wanted = conditions_for(report.missing, report.resources)
    assert [(c.type, c.status) for c in wanted] == [("NvidiaGpuDevicesUnavailable", "False")]
