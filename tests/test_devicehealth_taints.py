"""DRA device health from two sources, merged: a failing ResourceSlice taint on a device a pod holds
is that device Unhealthy, and a failure the Pod status and the taints both see is ONE story: one
device.unhealthy, one device.healthy once neither says Unhealthy any more, `sources` naming who said it."""

from __future__ import annotations

import json

from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, UNKNOWN, PodMeta
from watcher.model.devicehealth.taints import DeviceTaint, failing, taints_of_slices
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.inventory import Inventory

CDI = "k8s.gpu.nvidia.com/gpu=gpu-3"
XID = "critical XID 79 reported by NVML"
GRACE = 300.0
NODE = claim_inventory({"ml/llm-pretrain-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", CDI)])})
EMPTY = claim_inventory({})
TAINT = DeviceTaint(DRIVER, "node-1", "gpu-3", "gpu.nvidia.com/xid", "79", "NoExecute")
KEY = (DRIVER, "node-1", "gpu-3")


def pod(health: str, message: str = "") -> PodMeta:
    return verdict_pod("ml/llm-pretrain-0", "trainer", [(CDI, health, message)])


def observe(
    state: DeviceHealth,
    now: float,
    *pods: PodMeta,
    taints: tuple[DeviceTaint, ...] | None = (),
    node: Inventory = NODE,
    api: bool = True,
) -> tuple[DeviceHealth, list[Change]]:
    return state.observe(now, node, pods if api else None, unknown_grace=GRACE, taints=taints)


def test_a_noexecute_taint_on_a_held_device_is_one_critical_event_naming_the_taint() -> None:
    state, (change,) = observe(DeviceHealth(), 0.0, taints=(TAINT,))
    assert change.kind is Kind.DEVICE_UNHEALTHY and change.severity is Severity.CRITICAL
    assert change.summary == (
        "gpu.nvidia.com gpu-3 (pool node-1) unhealthy: gpu.nvidia.com/xid=79 (NoExecute); "
        "held by ml/llm-pretrain-0/trainer (claim gpu-claim)"
    )
    d = change.details
    assert d["sources"] == ["resource-slice"] and d["source"] == "resource-slice"
    assert d["message"] == "gpu.nvidia.com/xid=79 (NoExecute)" and d["health"] == UNHEALTHY
    assert d["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]
    assert d["claim"] == "gpu-claim" and d["cdi_devices"] == [CDI] and d["pod_claim"] is None
    json.dumps(dict(d))
    assert state.open() == {KEY}
    assert observe(state, 1.0, taints=(TAINT,))[1] == []


def test_both_sources_one_story_whichever_came_first() -> None:
    # The taint first, then the Pod status agrees: no second event.
    state, (first,) = observe(DeviceHealth(), 0.0, pod(HEALTHY), taints=(TAINT,))
    assert first.details["sources"] == ["resource-slice"]
    state, out = observe(state, 1.0, pod(UNHEALTHY, XID), taints=(TAINT,))
    assert out == []
    # The taint goes: the Pod status still says Unhealthy, so the story stays open.
    state, out = observe(state, 2.0, pod(UNHEALTHY, XID), taints=())
    assert out == [] and state.open() == {KEY}
    state, (healed,) = observe(state, 3.0, pod(HEALTHY), taints=())
    assert healed.kind is Kind.DEVICE_HEALTHY
    assert healed.details["sources"] == ["pod-status", "resource-slice"]
    assert state.open() == frozenset()
    # The Pod status first, then the taint: still one event, and it says the Pod status's words.
    state, (first,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    assert first.details["sources"] == ["pod-status"] and first.details["message"] == XID
    state, out = observe(state, 1.0, pod(UNHEALTHY, XID), taints=(TAINT,))
    assert out == []
    state, out = observe(state, 2.0, pod(HEALTHY), taints=(TAINT,))
    assert out == []  # the taint still says bad
    state, (healed,) = observe(state, 3.0, pod(HEALTHY), taints=())
    assert healed.details["sources"] == ["pod-status", "resource-slice"]
    # Both at once: one event naming both, the driver's words then the taint.
    _, (both,) = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID), taints=(TAINT,))
    assert both.details["sources"] == ["pod-status", "resource-slice"]
    assert both.details["message"] == f"{XID}; gpu.nvidia.com/xid=79 (NoExecute)"


def test_effect_none_and_taints_on_devices_no_pod_holds_say_nothing() -> None:
    info = DeviceTaint(DRIVER, "node-1", "gpu-3", "gpu.nvidia.com/unmonitored", "", "None")
    assert observe(DeviceHealth(), 0.0, taints=(info,)) == (DeviceHealth(), [])
    idle = DeviceTaint(DRIVER, "node-1", "gpu-7", "gpu.nvidia.com/gpu-lost", "", "NoSchedule")
    assert observe(DeviceHealth(), 0.0, taints=(idle,)) == (DeviceHealth(), [])
    assert observe(DeviceHealth(), 0.0, taints=(TAINT,), node=EMPTY) == (DeviceHealth(), [])
    assert failing([info, idle, TAINT]) == {idle.device_key: (idle,), KEY: (TAINT,)}


def test_no_view_of_the_slices_or_of_the_pods_is_no_heal() -> None:
    state, _ = observe(DeviceHealth(), 0.0, taints=(TAINT,))
    # The API server out of reach (taints None), or the Pods API down (pods None): no news.
    for taints, api in ((None, True), ((TAINT,), False), (None, False)):
        after, out = observe(state, 1.0, taints=taints, api=api)
        assert out == [] and after.open() == {KEY}
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID))
    after, out = observe(state, 1.0, taints=(), api=False)
    assert out == [] and after.open() == {KEY}  # the Pod status's last word stands
    # Without the Pods API the taints alone still heal what they opened.
    state, _ = observe(DeviceHealth(), 0.0, taints=(TAINT,), api=False)
    _, (healed,) = observe(state, 1.0, taints=(), api=False)
    assert healed.kind is Kind.DEVICE_HEALTHY and healed.details["sources"] == ["resource-slice"]


def test_the_pod_ending_keeps_a_taint_story_open_until_the_unheld_grace_without_a_heal() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(HEALTHY), taints=(TAINT,))
    after, out = observe(state, 1.0, taints=(TAINT,), node=EMPTY)
    assert out == [] and after.open() == {KEY}
    unheld = 900.0  # DeviceHealth.observe's default unheld grace
    _, (ended,) = observe(after, 1.0 + unheld, taints=(TAINT,), node=EMPTY)
    assert ended.kind is Kind.DEVICE_HEALTH_UNOBSERVED and ended.details["sources"] == ["resource-slice"]


def test_an_unknown_holds_open_only_what_the_pod_status_said() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNKNOWN), taints=(TAINT,))
    _, (healed,) = observe(state, 1.0, pod(UNKNOWN), taints=())
    assert healed.kind is Kind.DEVICE_HEALTHY  # the taint said it; the taint took it back
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID), taints=(TAINT,))
    after, out = observe(state, 1.0, pod(UNKNOWN), taints=())
    assert out == [] and after.open() == {KEY}  # the driver stopped reporting: no news is no heal


def test_the_saved_state_keeps_the_taint_and_the_sources() -> None:
    state, _ = observe(DeviceHealth(), 0.0, pod(UNHEALTHY, XID), taints=(TAINT,))
    restored = DeviceHealth.from_json(json.loads(json.dumps(state.to_json())), now=1.0)
    assert restored.to_json() == state.to_json()
    # After a restart the slices are not read yet (None): the taint still holds the story open.
    after, out = observe(restored, 1.0, pod(HEALTHY), taints=None)
    assert out == [] and after.open() == {KEY}
    _, (healed,) = observe(after, 2.0, pod(HEALTHY), taints=())
    assert healed.details["sources"] == ["pod-status", "resource-slice"]


def test_a_state_saved_before_taints_heals_as_a_pod_status_story() -> None:
    old = {
        "format": 1,
        "devices": [
            {
                "driver": DRIVER,
                "pool": "node-1",
                "device": "gpu-3",
                "health": UNHEALTHY,
                "reported": UNHEALTHY,
                "holders": ["uid-llm-pretrain-0"],
            }
        ],
    }
    _, (healed,) = observe(DeviceHealth.from_json(old, now=0.0), 0.0, pod(HEALTHY))
    assert healed.details["sources"] == ["pod-status"]


def test_taints_are_read_from_the_nodes_slices_only() -> None:
    def slice_of(node: str, taints: list[object]) -> dict[str, object]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": [{"name": "gpu-3", "taints": taints}, {"name": "gpu-4"}],
            },
        }

    t = {
        "key": "gpu.nvidia.com/xid",
        "value": "79",
        "effect": "NoExecute",
        "timeAdded": "2026-01-01T00:00:00Z",
    }
    bad_shape = {"key": 7, "effect": "NoExecute"}
    got = taints_of_slices(
        [slice_of("node-1", [t, bad_shape]), slice_of("node-2", [t]), "junk", {}], "node-1"
    )
    assert got == (TAINT,)
    assert TAINT.text == "gpu.nvidia.com/xid=79 (NoExecute)"
    assert DeviceTaint(DRIVER, "p", "d", "gpu.nvidia.com/gpu-lost", "", "NoSchedule").text == (
        "gpu.nvidia.com/gpu-lost (NoSchedule)"
    )
