"""DRA device health from the Pod status: one story per device, paged when it fails, resolved when it
heals, an Unknown only warned of once it lasts, nothing guessed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Change, Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.plugin_devices import corroborate
from watcher.model.devicehealth.pods import (
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    DeviceVerdict,
    ExtendedRequest,
    PodMeta,
)
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.diff import diff
from watcher.model.events import Event, envelope
from watcher.model.inventory import Inventory
from watcher.model.routing import Route

CDI = "k8s.gpu.nvidia.com/gpu=gpu-3"
XID = "critical XID 79 reported by NVML"
GRACE = 300.0
UNHELD = 900.0
PAGING = Route(min_severity=Severity.WARNING, resolutions=True, skip_incident_devices=True)

NODE = claim_inventory({"ml/llm-pretrain-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", CDI)])})


def pod(
    health: str,
    message: str = "",
    *,
    key: str = "ml/llm-pretrain-0",
    container: str = "trainer",
    rid: str = CDI,
    claims: tuple[tuple[str, str], ...] = (("gpu", "gpu-claim"),),
) -> PodMeta:
    return verdict_pod(key, container, [(rid, health, message)], claims=claims)


def observe(
    state: DeviceHealth, now: float, *pods: PodMeta, node: Inventory = NODE, holding: bool = False
) -> tuple[DeviceHealth, list[Change]]:
    return state.observe(now, node, pods, unknown_grace=GRACE, unheld_grace=UNHELD, holding=holding)


def reporting() -> DeviceHealth:
    """The device once seen Healthy: its driver reports health, so an Unknown from it is news."""
    state, out = observe(DeviceHealth(), -1.0, pod(HEALTHY))
    assert out == []
    return state


def event(change: Change, seq: int = 1) -> Event:
    return envelope(change, seq=seq, node="node-1", cycle="c", before=None, after=None)


def test_an_unhealthy_verdict_is_one_critical_event_with_the_drivers_words() -> None:
    state, out = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    (change,) = out
    assert change.kind is Kind.DEVICE_UNHEALTHY and change.severity is Severity.CRITICAL
    assert change.summary == (
        "gpu.nvidia.com gpu-3 (pool node-1) unhealthy: critical XID 79 reported by NVML; "
        "held by ml/llm-pretrain-0/trainer (claim gpu-claim)"
    )
    assert dict(change.details) == {
        "resource": DRIVER,
        "device": "node-1/gpu-3",
        "driver": DRIVER,
        "pool": "node-1",
        "device_name": "gpu-3",
        "cdi_devices": [CDI],
        "claim": "gpu-claim",
        "pod_claim": "gpu",
        "request": "gpus",
        "health": UNHEALTHY,
        "message": XID,
        "allocated_to": ["ml/llm-pretrain-0/trainer"],
        "namespaces": ["ml"],
        "source": "pod-status",
        "sources": ["pod-status"],
    }
    json.dumps(dict(change.details))  # JSON-ready
    assert state.open() == {(DRIVER, "node-1", "gpu-3")}
    # Said once: the same verdict again, or with other words, is no news.
    state, out = observe(state, 1.0, pod(UNHEALTHY, XID))
    assert out == []
    _, out = observe(state, 2.0, pod(UNHEALTHY, "XID 48"))
    assert out == []


def test_a_heal_resolves_the_same_condition_the_failure_opened() -> None:
    state, (failed,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, (healed,) = observe(state, 5.0, pod(HEALTHY))
    assert healed.kind is Kind.DEVICE_HEALTHY and healed.severity is Severity.INFO
    assert "healthy again" in healed.summary and state.open() == frozenset()
    opened, closed = condition_of(event(failed)), condition_of(event(healed, 2))
    assert opened is not None and closed is not None
    assert opened.key == closed.key == f"node-1/device/{DRIVER}/node-1/gpu-3"
    assert opened.active and not closed.active
    # A paging sink (minimum warning) takes both: the resolve passes below its minimum.
    assert PAGING.matches(event(failed)) and PAGING.matches(event(healed, 2))
    assert observe(state, 6.0, pod(HEALTHY)) == (state, [])


def test_an_unknown_is_a_warning_once_it_outlasts_the_grace_and_never_a_page() -> None:
    state, out = observe(reporting(), 0.0, pod(UNKNOWN, "driver not reporting"))
    assert out == [] and state.next_look(GRACE, UNHELD) == GRACE
    state, out = observe(state, GRACE - 1, pod(UNKNOWN))
    assert out == []
    state, (warned,) = observe(state, GRACE, pod(UNKNOWN, "driver not reporting"))
    assert warned.kind is Kind.DEVICE_HEALTH_UNKNOWN and warned.severity is Severity.WARNING
    assert "driver not reporting" in warned.summary and warned.details["health"] == UNKNOWN
    assert condition_of(event(warned)) is None  # no page opens
    assert state.next_look(GRACE, UNHELD) is None
    for t in (GRACE + 1, 10 * GRACE):
        state, out = observe(state, t, pod(UNKNOWN))
        assert out == []
    # It comes back: told, as INFO (it closes nothing a pager opened).
    _, (back,) = observe(state, 11 * GRACE, pod(HEALTHY))
    assert back.kind is Kind.DEVICE_HEALTHY and back.severity is Severity.INFO


def test_an_unknown_healed_within_the_grace_says_nothing() -> None:
    state, _ = observe(reporting(), 0.0, pod(UNKNOWN))
    state, out = observe(state, GRACE / 2, pod(HEALTHY))
    assert out == [] and state == reporting()
    _, out = observe(state, 2 * GRACE, pod(HEALTHY))
    assert out == []


def test_unhealthy_then_unknown_keeps_the_failure_open_until_healthy() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    for t in (1.0, GRACE * 3):
        state, out = observe(state, t, pod(UNKNOWN))
        assert out == [] and state.open() == {(DRIVER, "node-1", "gpu-3")}
    _, (healed,) = observe(state, GRACE * 4, pod(HEALTHY))
    assert healed.kind is Kind.DEVICE_HEALTHY


def test_a_device_shared_by_two_pods_is_one_event_naming_both() -> None:
    device = [("node-1", "gpu-3", CDI)]
    node = claim_inventory({"ml/a": ("main", "shared", device), "ml/b": ("side", "shared", device)})
    claims = (("gpu", "shared"),)
    a = pod(UNHEALTHY, XID, key="ml/a", container="main", claims=claims)
    b = pod(UNHEALTHY, XID, key="ml/b", container="side", claims=claims)
    state, (change,) = observe(DeviceHealth(), 0.0, a, b, node=node)
    assert change.details["allocated_to"] == ["ml/a/main", "ml/b/side"]
    # One holder saying Healthy while the other still says Unhealthy heals nothing.
    a_ok = pod(HEALTHY, key="ml/a", container="main", claims=claims)
    state, out = observe(state, 1.0, a_ok, b, node=node)
    assert out == []
    b_ok = pod(HEALTHY, key="ml/b", container="side", claims=claims)
    _, (healed,) = observe(state, 2.0, a_ok, b_ok, node=node)
    assert healed.kind is Kind.DEVICE_HEALTHY and healed.details["allocated_to"] == ["ml/a/main", "ml/b/side"]


def test_a_verdict_whose_pod_does_not_name_its_claim_resolves_by_its_device_id() -> None:
    """A real kubelet's Pods API never carries resourceClaimStatuses (its status manager leaves
    that field to the resourceclaim controller): a template-made claim's object is named only by
    pod-resources. The verdict's device id (the CDI id) finds it there, in the same container."""
    state, (change,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID, claims=()), node=NODE)
    assert change.kind is Kind.DEVICE_UNHEALTHY and change.details["device"] == "node-1/gpu-3"
    elsewhere = pod(UNHEALTHY, XID, claims=(), container="sidecar")  # another container's verdict
    state, out = observe(DeviceHealth(), 0.0, elsewhere, node=NODE)
    assert out == [] and len(state.pending) == 1


def test_a_cdi_id_several_devices_share_is_never_guessed_between_them() -> None:
    """Some drivers give one CDI id per claim, not per device: a verdict under that id could be any
    of the claim's devices. It stays unresolved rather than page the wrong device."""
    shared = claim_inventory(
        {"ml/llm-pretrain-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", CDI), ("node-1", "gpu-4", CDI)])}
    )
    state, out = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID, claims=()), node=shared)
    assert out == [] and len(state.pending) == 1


def test_a_verdict_no_device_resolves_to_waits_and_is_never_guessed() -> None:
    unresolved = [
        (pod(UNHEALTHY, XID), claim_inventory({})),  # pod-resources does not show the pod yet
        (pod(UNHEALTHY, XID, rid="k8s.gpu.nvidia.com/gpu=gpu-9"), NODE),  # nor that device
    ]
    for verdict, node in unresolved:
        state, out = observe(DeviceHealth(), 0.0, verdict, node=node)
        assert out == [] and state.open() == frozenset() and len(state.pending) == 1
        state, (change,) = observe(state, 1.0, pod(UNHEALTHY, XID))
        assert change.details["device"] == "node-1/gpu-3" and state.pending == ()


def test_an_unresolved_unknown_of_a_device_never_seen_healthy_stays_silent() -> None:
    # pod-resources does not show the new pod's claim yet: its Unknown waits, then resolves to a
    # device whose driver never said Healthy: the kubelet's default, nothing to tell.
    state, _ = observe(DeviceHealth(), 0.0, pod(UNKNOWN), node=claim_inventory({}))
    assert len(state.pending) == 1
    state, out = observe(state, GRACE - 1, pod(UNKNOWN))
    assert out == [] and state.pending == ()
    _, out = observe(state, 2 * GRACE, pod(UNKNOWN))
    assert out == []


def test_a_device_without_cdi_ids_is_named_driver_pool_device() -> None:
    node = claim_inventory({"ml/llm-pretrain-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", None)])})
    _, (change,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, rid=f"{DRIVER}/node-1/gpu-3"), node=node)
    assert change.details["cdi_devices"] == [] and change.details["device"] == "node-1/gpu-3"
    assert change.summary.startswith("gpu.nvidia.com gpu-3 (pool node-1) unhealthy;")


def test_while_the_kubelet_warms_up_unknowns_are_held_and_failures_still_told() -> None:
    state, out = observe(reporting(), 0.0, pod(UNKNOWN), holding=True)
    state, out = observe(state, 2 * GRACE, pod(UNKNOWN), holding=True)
    assert out == []
    # The warm-up is over: the grace starts now, not when the driver first went quiet.
    state, out = observe(state, 2 * GRACE + 1, pod(UNKNOWN))
    assert out == []
    _, (warned,) = observe(state, 3 * GRACE, pod(UNKNOWN))
    assert warned.kind is Kind.DEVICE_HEALTH_UNKNOWN
    _, (failed,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID), holding=True)
    assert failed.kind is Kind.DEVICE_UNHEALTHY
    # An Unknown pod-resources shows no claim for yet waits through the warm-up, and the device
    # it resolves to was never seen Healthy: nothing is timed.
    state, _ = observe(DeviceHealth(), 0.0, pod(UNKNOWN), node=claim_inventory({}))
    state, _ = observe(state, 2 * GRACE, pod(UNKNOWN), node=claim_inventory({}), holding=True)
    state, out = observe(state, 2 * GRACE + 1, pod(UNKNOWN))
    assert out == [] and state.next_look(GRACE, UNHELD) is None


NEXT_POD = "ml/llm-pretrain-1"
NEXT_NODE = claim_inventory({NEXT_POD: ("trainer", "gpu-claim", [("node-1", "gpu-3", CDI)])})


def test_a_holder_pod_ending_keeps_the_story_open_and_a_new_holders_healthy_resolves_it() -> None:
    """Issue 36 item 1: the page a pod's failed GPU opened is resolved by the next holder's
    Healthy, and the GPU failing again later pages again."""
    state, (failed,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    # The pod is still there but its status says nothing of the device this time: no news.
    quiet = PodMeta("uid-llm-pretrain-0", "ml", "llm-pretrain-0", "Running", claims=(("gpu", "gpu-claim"),))
    same, out = observe(state, 1.0, quiet)
    assert out == [] and same.open() == state.open()
    # The pod is deleted: no heal, and no end yet: the page stays open for a new holder's word.
    state, out = observe(state, 2.0, node=claim_inventory({}))
    assert out == [] and state.open() == {(DRIVER, "node-1", "gpu-3")}
    assert state.next_look(GRACE, UNHELD) == 2.0 + UNHELD
    # A new pod gets the repaired GPU and says Healthy: that resolves the first page.
    state, (healed,) = observe(state, 60.0, pod(HEALTHY, key=NEXT_POD), node=NEXT_NODE)
    assert healed.kind is Kind.DEVICE_HEALTHY
    assert healed.details["allocated_to"] == [f"{NEXT_POD}/trainer"]
    opened, closed = condition_of(event(failed)), condition_of(event(healed, 2))
    assert opened is not None and closed is not None and opened.key == closed.key and not closed.active
    # It fails again later: a new page, not an update of a closed one.
    state, (again,) = observe(state, 120.0, pod(UNHEALTHY, "XID 48", key=NEXT_POD), node=NEXT_NODE)
    assert again.kind is Kind.DEVICE_UNHEALTHY and state.open() == {(DRIVER, "node-1", "gpu-3")}


def test_a_device_nobody_takes_ends_its_story_unconfirmed_after_the_unheld_grace() -> None:
    state, (failed,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, out = observe(state, 10.0, node=claim_inventory({}))
    assert out == []
    state, out = observe(state, 10.0 + UNHELD - 1, node=claim_inventory({}))
    assert out == [] and state.open()
    state, (ended,) = observe(state, 10.0 + UNHELD, node=claim_inventory({}))
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED and ended.severity is Severity.WARNING
    assert ended.details["last_reported"] == UNHEALTHY and ended.details["health"] == "Unobserved"
    assert ended.details["last_allocated_to"] == ["ml/llm-pretrain-0/trainer"]
    assert ended.details["namespaces"] == ["ml"] and ended.details["unheld_for_s"] == UNHELD
    assert "no heal" not in ended.summary and "closed unconfirmed" in ended.summary
    assert state == DeviceHealth() and state.next_look(GRACE, UNHELD) is None
    # It ends the condition the failure opened (PagerDuty resolves, Alertmanager ends the alert),
    # and a paging route takes it whatever its minimum severity.
    opened, closed = condition_of(event(failed)), condition_of(event(ended, 2))
    assert opened is not None and closed is not None and opened.key == closed.key and not closed.active
    critical_only = Route(min_severity=Severity.CRITICAL, resolutions=True)
    assert critical_only.matches(event(ended, 2))
    # A later failure under a new holder pages again.
    _, (again,) = observe(state, 2 * UNHELD, pod(UNHEALTHY, XID, key=NEXT_POD), node=NEXT_NODE)
    assert again.kind is Kind.DEVICE_UNHEALTHY


def test_a_new_holder_still_unhealthy_continues_the_open_story_without_a_second_page() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, _ = observe(state, 1.0, node=claim_inventory({}))
    state, out = observe(state, 2.0, pod(UNHEALTHY, XID, key=NEXT_POD), node=NEXT_NODE)
    assert out == [] and state.next_look(GRACE, UNHELD) is None  # held again: no unheld timer
    _, (healed,) = observe(state, 3.0, pod(HEALTHY, key=NEXT_POD), node=NEXT_NODE)
    assert healed.kind is Kind.DEVICE_HEALTHY


def test_an_unheld_story_survives_a_restart_and_its_grace_counts_again_from_the_start() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, _ = observe(state, 1.0, node=claim_inventory({}))
    restored = DeviceHealth.from_json(json.loads(json.dumps(state.to_json())), now=5000.0)
    assert restored.open() == state.open() and restored.next_look(GRACE, UNHELD) == 5000.0 + UNHELD
    restored, out = observe(restored, 5000.0 + UNHELD - 1, node=claim_inventory({}))
    assert out == []
    _, (ended,) = observe(restored, 5000.0 + UNHELD, node=claim_inventory({}))
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED
    assert ended.details["last_allocated_to"] == ["ml/llm-pretrain-0/trainer"]


def test_unknown_from_a_driver_that_never_said_healthy_is_silent_for_ever() -> None:
    """Issue 36 item 18: the kubelet writes Unknown for every device of a driver without a health
    service (NVIDIA's DRA driver by default): on such a cluster the agent says nothing at all."""
    state = DeviceHealth()
    for t in (0.0, GRACE, 10 * GRACE, 100 * GRACE):
        state, out = observe(state, t, pod(UNKNOWN))
        assert out == [] and state.next_look(GRACE, UNHELD) is None
    assert state == DeviceHealth()
    # Once it has said Healthy, its going quiet is the signal: a warning after the grace, no page.
    state, _ = observe(state, 0.0, pod(HEALTHY))
    state, _ = observe(state, 1.0, pod(UNKNOWN))
    _, (warned,) = observe(state, 1.0 + GRACE, pod(UNKNOWN))
    assert warned.kind is Kind.DEVICE_HEALTH_UNKNOWN and condition_of(event(warned)) is None


def test_the_saved_state_round_trips_and_a_restart_still_resolves_what_it_opened() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    saved = json.loads(json.dumps(state.to_json()))
    restored = DeviceHealth.from_json(saved, now=1.0)
    assert restored.open() == state.open() and restored.to_json() == saved
    assert observe(restored, 1.0, pod(UNHEALTHY, XID))[1] == []  # not paged twice
    _, (healed,) = observe(restored, 2.0, pod(HEALTHY))
    assert healed.kind is Kind.DEVICE_HEALTHY
    # A pending Unknown's grace starts again in the next process (monotonic times mean nothing there).
    # An Unknown not told yet is not saved: after a restart it is known again once Healthy.
    waiting, _ = observe(reporting(), 0.0, pod(UNKNOWN))
    assert DeviceHealth.from_json(waiting.to_json(), now=5.0) == DeviceHealth()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_entries = st.fixed_dictionaries(
    {"driver": _json, "pool": _json, "device": _json, "health": _json, "reported": _json, "holders": _json}
)


@pytest.mark.slow  # 200 nested JSON documents: seconds of generating alone
@settings(max_examples=200, deadline=None)
@given(data=_json | st.fixed_dictionaries({"format": st.just(1), "devices": st.lists(_entries | _json)}))
def test_unreadable_saved_state_is_an_empty_state_never_an_error(data: Any) -> None:
    state = DeviceHealth.from_json(data, now=0.0)
    assert isinstance(state, DeviceHealth)
    observe(state, 0.0, pod(HEALTHY))  # and usable


_SHARED = [("node-1", "gpu-3", CDI)]
_TWO = claim_inventory(
    {
        "ml/a": ("main", "gpu-claim", [*_SHARED, ("node-1", "gpu-4", None)]),
        "ml/b": ("main", "gpu-claim", _SHARED),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0, 2 * GRACE),
            st.sampled_from([HEALTHY, UNHEALTHY, UNKNOWN, "bogus"]),
            st.sampled_from([HEALTHY, UNHEALTHY, UNKNOWN]),
            st.sampled_from([HEALTHY, UNHEALTHY, UNKNOWN]),
            st.booleans(),
        ),
        max_size=25,
    )
)
def test_any_verdicts_give_each_device_alternating_open_and_close(
    steps: list[tuple[float, str, str, str, bool]],
) -> None:
    state, now, told = DeviceHealth(), 0.0, []
    for dt, a3, a4, b3, holding in steps:
        now += dt
        a = PodMeta(
            "uid-a",
            "ml",
            "a",
            verdicts=(
                DeviceVerdict("main", "claim:gpu", CDI, a3, ""),
                DeviceVerdict("main", "claim:gpu", f"{DRIVER}/node-1/gpu-4", a4, ""),
            ),
            claims=(("gpu", "gpu-claim"),),
        )
        b = PodMeta(
            "uid-b", "ml", "b", verdicts=(DeviceVerdict("main", "claim:gpu", CDI, b3, ""),), claims=a.claims
        )
        state, out = observe(state, now, a, b, node=_TWO, holding=holding)
        told += out
        # Never more than one event per device per observation, and unhealthy only when one says so.
        devices = [c.details["device"] for c in out]
        assert len(devices) == len(set(devices))
        for c in out:
            if c.kind is Kind.DEVICE_UNHEALTHY:
                assert UNHEALTHY in ((a3, b3) if c.details["device_name"] == "gpu-3" else (a4,))
    for device in ("node-1/gpu-3", "node-1/gpu-4"):
        story = [c.kind for c in told if c.details["device"] == device]
        open_ = False
        for kind in story:
            if kind is Kind.DEVICE_UNHEALTHY:
                assert not open_, story
                open_ = True
            elif kind is Kind.DEVICE_HEALTHY:
                open_ = False
            else:  # an Unknown is told only while nothing is open
                assert kind is Kind.DEVICE_HEALTH_UNKNOWN and not open_, story
        paged = [condition_of(event(c)) for c in told if c.details["device"] == device]
        assert [c.active for c in paged if c is not None] == [
            k is Kind.DEVICE_UNHEALTHY for k in story if k is not Kind.DEVICE_HEALTH_UNKNOWN
        ]
        assert ((DRIVER, *device.split("/")) in state.open()) == (
            bool(story) and story[-1] is not Kind.DEVICE_HEALTHY
        )


def test_the_drivers_message_reaches_people_printable() -> None:
    _, (change,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, "XID 79\n\x1b[31mfake line"))
    assert "\n" not in change.summary and "\x1b" not in change.details["message"]
    assert "\\x1b[31mfake line" in change.summary


def test_dra_backed_extended_resources_are_never_missing_from_allocatable() -> None:
    # A plain nvidia.com/gpu request served by a DRA driver: its devices are under the container's
    # claims, never in allocatable; allocatable has the node's device-plugin GPUs only.
    before = claim_inventory({}, gpus=["GPU-a"])
    after = claim_inventory(
        {"ml/notebook-0": ("lab", "notebook-0-extended-resources-1a2b3", [("node-1", "gpu-3", CDI)])},
        gpus=["GPU-a"],
    )
    assert after.missing_devices == () and after.derived()["missing_devices"] == []
    kinds = {c.kind for c in diff(before, after)}
    assert Kind.DEVICE_REMOVED not in kinds and kinds >= {Kind.ALLOCATION_ADDED}
    assert not any(c.kind is Kind.DEVICE_REMOVED for c in diff(after, before))
    meta = PodMeta(
        "uid-nb",
        "ml",
        "notebook-0",
        extended_claim="notebook-0-extended-resources-1a2b3",
        extended=(ExtendedRequest("lab", "nvidia.com/gpu", "container-0-request-0"),),
    )
    assert observe(DeviceHealth(), 0.0, meta, node=after) == (DeviceHealth(), [])


def _removed(device: str, holders: list[str]) -> Change:
    details = {"resource": "nvidia.com/gpu", "device": device, "allocated_to": holders}
    return Change(Kind.DEVICE_REMOVED, Severity.CRITICAL if holders else Severity.WARNING, device, details)


def test_corroborate_adds_the_holders_kubelet_verdicts_to_device_removed_only() -> None:
    trainer = PodMeta(
        "uid-t",
        "ml",
        "trainer-0",
        verdicts=(
            DeviceVerdict("trainer", "nvidia.com/gpu", "GPU-1", UNHEALTHY, ""),
            DeviceVerdict("trainer", "nvidia.com/gpu", "GPU-2", HEALTHY, ""),
            DeviceVerdict("trainer", "claim:gpu", "GPU-1", UNHEALTHY, "a DRA verdict, not this"),
        ),
    )
    other = PodMeta(
        "uid-o", "ml", "other", verdicts=(DeviceVerdict("c", "nvidia.com/gpu", "GPU-1", HEALTHY, ""),)
    )
    added = Change(
        Kind.DEVICE_ADDED, Severity.INFO, "back", {"resource": "nvidia.com/gpu", "device": "GPU-1"}
    )
    changes = [
        _removed("GPU-1", ["ml/trainer-0/trainer"]),
        _removed("GPU-7", []),
        added,
        _removed("GPU-9", ["ml/gone/x"]),
    ]
    out = corroborate(changes, [trainer, other])
    assert [c.kind for c in out] == [c.kind for c in changes]  # no event of its own
    assert out[0].details["kubelet_verdicts"] == [
        {"pod": "ml/trainer-0", "container": "trainer", "health": UNHEALTHY}
    ]
    assert out[0].severity is Severity.CRITICAL and out[0].summary == changes[0].summary
    assert out[1] == changes[1] and out[2] == changes[2]  # unallocated, and not a removal: as they were
    assert out[3].details["kubelet_verdicts"] == []  # the kubelet said nothing of it
    assert corroborate([added], [trainer]) == [added]


def test_the_end_of_a_story_goes_where_its_page_went_whoever_holds_the_device_then() -> None:
    """A sink routed to namespace ml took the page; the device's next holder is in another
    namespace: the resolve (and an unconfirmed end) still reaches the ml sink."""
    ml_only = Route(min_severity=Severity.WARNING, namespaces=("ml",), resolutions=True)
    other = claim_inventory({"web/next-0": ("main", "gpu-claim", [("node-1", "gpu-3", CDI)])})
    state, (failed,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    assert ml_only.matches(event(failed))
    state, _ = observe(state, 1.0, node=claim_inventory({}))
    web = pod(UNHEALTHY, XID, key="web/next-0", container="main")
    state, out = observe(state, 2.0, web, node=other)
    assert out == []
    # Saved and restored between: the namespaces the page went to are kept.
    state = DeviceHealth.from_json(json.loads(json.dumps(state.to_json())), now=3.0)
    _, (healed,) = observe(state, 4.0, pod(HEALTHY, key="web/next-0", container="main"), node=other)
    assert healed.details["namespaces"] == ["ml", "web"] and ml_only.matches(event(healed, 2))
    state, _ = observe(state, 4.0, node=claim_inventory({}))
    _, (ended,) = observe(state, 4.0 + UNHELD, node=claim_inventory({}))
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED and ml_only.matches(event(ended, 3))


def test_a_new_holder_that_says_nothing_does_not_stop_the_unheld_grace() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, _ = observe(state, 1.0, node=claim_inventory({}))
    # A new pod holds it but its status has no verdict yet (its containers are still starting).
    silent = PodMeta("uid-next", "ml", "llm-pretrain-1", "Pending", claims=(("gpu", "gpu-claim"),))
    state, out = observe(state, 2.0, silent, node=NEXT_NODE)
    assert out == [] and state.next_look(GRACE, UNHELD) == 1.0 + UNHELD
    _, (ended,) = observe(state, 1.0 + UNHELD, silent, node=NEXT_NODE)
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED


def test_without_the_pod_status_an_unheld_story_still_ends_and_no_unknown_is_timed() -> None:
    """The Pods API gone (or turned off) after a page: pod-resources alone still says nobody
    holds the device, so the page still ends; an Unknown waiting for its grace is not timed."""
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    state, out = state.observe(1.0, claim_inventory({}), None, unknown_grace=GRACE, unheld_grace=UNHELD)
    assert out == [] and state.next_look(GRACE, UNHELD, verdicts=False) == 1.0 + UNHELD
    _, (ended,) = state.observe(
        1.0 + UNHELD, claim_inventory({}), None, unknown_grace=GRACE, unheld_grace=UNHELD
    )
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED
    waiting, _ = observe(reporting(), 0.0, pod(UNKNOWN))
    assert waiting.next_look(GRACE, UNHELD) == GRACE
    assert waiting.next_look(GRACE, UNHELD, verdicts=False) is None
