"""Pods evicted for a device taint (watcher.model.devicehealth.evictions): the DisruptionTarget
condition the device taint eviction controller writes, read from the Pods API's Pod, becomes one
`pod.evicted` naming the pod, its owner, the device it held and the NoExecute taint (or the
DeviceTaintRule) on it; told once, across resyncs and restarts; never a page. Pure."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testkit.inventories import DRIVER, claim_inventory
from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.model.changes import Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.affected import owner_text
from watcher.model.devicehealth.evictions import DISRUPTION_REASON, Evictions
from watcher.model.devicehealth.pods import Owner, PodMeta
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.events import envelope
from watcher.sim.fake_pod_objects import DISRUPTION_WORDS
from watcher.sinks.kubernetes.planner import plan
from watcher.sources.pods_api.decoding import pod_meta

POOL, DEVICE = "node-1", "gpu-3"
HELD = claim_inventory({"ml/llm-pretrain-0": ("trainer", "llm-gpu", [(POOL, DEVICE, f"cdi/gpu={DEVICE}")])})
EMPTY = claim_inventory({})
JOB = Owner("Job", "llm-pretrain", "uid-job")
RUNNING = PodMeta("uid-1", "ml", "llm-pretrain-0", phase="Running", owner=JOB, labels=(("team", "research"),))
EVICTED = dataclasses.replace(RUNNING, disruption=DISRUPTION_REASON)
XID = DeviceTaint(DRIVER, POOL, DEVICE, "gpu.example.com/xid", "79", "NoExecute")
WAIT = 60.0


def _started() -> Evictions:
    """The state after the first look (a node with no eviction under way)."""
    state, changes = Evictions().observe(0.0, [RUNNING], (HELD, None), (), wait=WAIT)
    assert changes == [] and state.baseline
    return state


def _pod(*conditions: tuple[str, str, str]) -> bytes:
    pod = core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name="p", namespace="ml", uid="u-1"))
    pod.status.phase = "Running"
    for kind, status, reason in conditions:
        pod.status.conditions.add(type=kind, status=status, reason=reason, message=DISRUPTION_WORDS)
    return pod.SerializeToString()


def test_the_pods_api_pod_says_a_device_taint_evicts_it_only_by_a_true_disruption_target() -> None:
    evicting = ("DisruptionTarget", "True", DISRUPTION_REASON)
    assert pod_meta(_pod(("Ready", "True", ""), evicting), labels=()).disruption == DISRUPTION_REASON
    assert pod_meta(_pod(("DisruptionTarget", "False", DISRUPTION_REASON)), labels=()).disruption == ""
    assert pod_meta(_pod(("Ready", "False", "ContainersNotReady")), labels=()).disruption == ""
    assert pod_meta(_pod(), labels=()).disruption == ""


def test_an_eviction_is_one_warning_naming_pod_owner_device_and_taint_and_no_page() -> None:
    state, changes = _started().observe(1.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    (change,) = changes
    assert change.kind is Kind.POD_EVICTED and change.severity is Severity.WARNING
    assert change.summary.startswith("pod ml/llm-pretrain-0 evicted: its device")
    # The texts people read put the owner first (Slack, Kubernetes Events), from the details.
    assert owner_text(change.details) == "Job ml/llm-pretrain (team research)"
    assert f"{DRIVER} {DEVICE} (pool {POOL})" in change.summary
    assert "gpu.example.com/xid=79 (NoExecute)" in change.summary
    d = change.details
    assert (d["namespace"], d["pod"], d["pod_uid"], d["owner"]["name"]) == (
        "ml",
        "llm-pretrain-0",
        "uid-1",
        JOB.name,
    )
    assert (d["driver"], d["pool"], d["device_name"], d["claim"]) == (DRIVER, POOL, DEVICE, "llm-gpu")
    where = {"driver": DRIVER, "pool": POOL, "device": DEVICE}
    assert d["taints"] == [{**where, "key": "gpu.example.com/xid", "value": "79", "effect": "NoExecute"}]
    assert d["reason"] == DISRUPTION_REASON and d["rules"] == []
    json.dumps(dict(d))  # JSON-ready
    assert (
        condition_of(envelope(change, node="n", seq=1, cycle="c", before=None, after=None)) is None
    )  # never a page
    # Told once: the next looks (the pod terminating, then Failed, a resync) say nothing more.
    again, more = state.observe(
        2.0, [dataclasses.replace(EVICTED, phase="Failed")], (EMPTY, HELD), (XID,), wait=WAIT
    )
    assert more == [] and "uid-1" in again.told


def test_a_restart_tells_no_eviction_twice_and_a_gone_pod_is_forgotten() -> None:
    state, _ = _started().observe(1.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    restored = Evictions.from_json(json.loads(json.dumps(state.to_json(now=5.0))), now=100.0)
    assert restored == state
    after, changes = restored.observe(101.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    assert changes == []
    gone, changes = after.observe(102.0, [], (EMPTY, None), (XID,), wait=WAIT)
    assert changes == [] and gone.told == frozenset()  # the uid never comes back: not kept


def test_the_first_look_takes_the_evictions_under_way_as_old_news() -> None:
    state, changes = Evictions().observe(0.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    assert changes == [] and state.told == {"uid-1"}
    assert Evictions.from_json({"format": 99}, now=0.0) == Evictions()  # unreadable: a fresh look


def test_the_devices_come_from_the_last_inventory_that_had_the_pod() -> None:
    # The status saying why came when the pod had already ended: pod-resources no longer lists it.
    _, (change,) = _started().observe(1.0, [EVICTED], (EMPTY, HELD), (XID,), wait=WAIT)
    assert change.details["devices"] == [
        {"claim": "llm-gpu", "driver": DRIVER, "pool": POOL, "device": DEVICE}
    ]


def test_the_devices_of_a_pod_released_before_its_status_said_why_are_remembered() -> None:
    # The real race: pod-resources stopped listing the pod (its DRA state file rewritten) a cycle
    # before the Pods API's update carrying the condition arrived.
    state, changes = _started().observe(1.0, [RUNNING], (EMPTY, HELD), (XID,), wait=WAIT)
    assert changes == []
    _, (change,) = state.observe(1.2, [EVICTED], (EMPTY, EMPTY), (XID,), wait=WAIT)
    assert change.details["device_name"] == DEVICE and change.details["taints"][0]["key"] == XID.key
    # Remembered for a while only: long after, a pod under that name held nothing we know of.
    late, _ = state.observe(1.0 + WAIT + 1, [RUNNING], (EMPTY, EMPTY), (XID,), wait=WAIT)
    _, (unknown,) = late.observe(2.0 + WAIT, [EVICTED], (EMPTY, EMPTY), (XID,), wait=WAIT)
    assert unknown.details["devices"] == [] and "a device" in unknown.summary


def test_a_pod_still_listed_without_its_claims_is_named_by_the_devices_it_had() -> None:
    # Seen with the real kubelet: its claims unprepared, the pod is listed a moment without them.
    unprepared = claim_inventory({"ml/llm-pretrain-0": ("trainer", "llm-gpu", [])})
    assert unprepared.pod("ml", "llm-pretrain-0") is not None
    _, (change,) = _started().observe(1.0, [EVICTED], (unprepared, HELD), (XID,), wait=WAIT)
    assert change.details["device_name"] == DEVICE
    state, _ = _started().observe(1.0, [RUNNING], (unprepared, HELD), (XID,), wait=WAIT)
    _, (later,) = state.observe(1.1, [EVICTED], (EMPTY, unprepared), (XID,), wait=WAIT)
    assert later.details["device_name"] == DEVICE


def test_an_eviction_waits_for_its_taint_to_be_read_then_is_told_without_it() -> None:
    state, changes = _started().observe(1.0, [EVICTED], (HELD, None), (), wait=WAIT)
    assert changes == [] and state.next_look(WAIT) == 1.0 + WAIT
    other = DeviceTaint(DRIVER, POOL, "gpu-9", "k", "", "NoExecute")  # another device's
    quiet = DeviceTaint(DRIVER, POOL, DEVICE, "k", "", "NoSchedule")  # never what evicts
    state, changes = state.observe(2.0, [EVICTED], (HELD, None), (other, quiet), wait=WAIT)
    assert changes == []
    read, (found,) = state.observe(3.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    assert found.details["taints"][0]["key"] == "gpu.example.com/xid" and read.pending == ()
    late, (unread,) = state.observe(1.0 + WAIT, [EVICTED], (HELD, None), (), wait=WAIT)
    assert unread.details["taints"] == [] and "taint the agent has not read" in unread.summary
    assert late.pending == () and late.observe(200.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)[1] == []


def test_a_pending_eviction_survives_a_restart() -> None:
    state, _ = _started().observe(1.0, [EVICTED], (HELD, None), (), wait=WAIT)
    restored = Evictions.from_json(json.loads(json.dumps(state.to_json(now=11.0))), now=500.0)
    assert restored.next_look(WAIT) == 490.0 + WAIT  # its age carried, not the downtime
    _, (change,) = restored.observe(501.0, [EVICTED], (EMPTY, None), (XID,), wait=WAIT)  # devices kept
    assert change.details["device_name"] == DEVICE


def test_without_a_taint_source_an_eviction_is_told_at_once() -> None:
    _, (change,) = _started().observe(1.0, [EVICTED], (HELD, None), None, wait=WAIT)
    assert change.details["taints"] == [] and "no API server" in change.summary


@pytest.mark.skipif(
    "rule" not in DeviceTaint.__dataclass_fields__, reason="no DeviceTaintRules source in this tree yet"
)
def test_a_device_taint_rule_is_named() -> None:
    fields = {**dataclasses.asdict(XID), "rule": "gpu-maintenance"}
    rule = DeviceTaint(**fields)
    _, (change,) = _started().observe(1.0, [EVICTED], (HELD, None), (rule,), wait=WAIT)
    assert change.details["rules"] == ["gpu-maintenance"] and "rule gpu-maintenance" in change.summary


def test_other_disruptions_are_no_device_taint_eviction() -> None:
    for reason in ("PreemptionByScheduler", "DeletionByTaintManager", "TerminationByKubelet", ""):
        pod = dataclasses.replace(RUNNING, disruption=reason)
        assert _started().observe(1.0, [pod], (HELD, None), (XID,), wait=WAIT)[1] == []


def test_the_kubernetes_sink_says_it_on_the_node_owner_first() -> None:
    _, (change,) = _started().observe(1.0, [EVICTED], (HELD, None), (XID,), wait=WAIT)
    event = envelope(change, node="n", seq=1, cycle="c", before=None, after=None)
    (kube,) = plan([event], {}).events
    assert (kube.regarding.kind, kube.type, kube.reason) == ("Node", "Warning", "PodEvictedForDeviceTaint")
    assert kube.note.startswith("Job ml/llm-pretrain (team research): pod ml/llm-pretrain-0 evicted")
    assert "gpu.example.com/xid=79 (NoExecute)" in kube.note
