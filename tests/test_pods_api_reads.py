"""PodReads: what a cycle reads for the pods the Pods API watch named, keyed by uid, the name only
how pod-resources is asked. A recreated pod, its predecessor's late updates, a force-deleted pod
and a finished one, each fed as the watch feeds them (its index updated first, then the change)."""

from __future__ import annotations

import dataclasses
import time

from testkit.inventories import inventory_of
from watcher.kubelet.triggers import Trigger
from watcher.model.devicehealth.pods import DeviceVerdict, Owner, PodIndex, PodMeta
from watcher.sources.pods_api.reads import PLUGIN_HEALTH, POD_READS, POD_STATUS, PodReads
from watcher.sources.pods_api.watch import PodChange

SET = Owner("StatefulSet", "db", "uid-sts")
NAME = ("store", "db-0")
OLD = PodMeta("uid-old", *NAME, phase="Running", owner=SET)
NEW = PodMeta("uid-new", *NAME, phase="Pending", owner=SET)


class Fed:
    """PodReads and the index beside it, fed as the watch feeds them."""

    def __init__(self, *pods: PodMeta) -> None:
        self.trigger = Trigger()
        self.index = PodIndex(pods)
        self.reads = PodReads(self.trigger)
        self.reads.index = self.index

    def added(self, pod: PodMeta) -> None:
        self.index.put(pod)
        self.reads.on_changes([PodChange(pod.uid, None, pod, True)], False)

    def modified(self, pod: PodMeta, *, resources: bool = True) -> None:
        before = self.index.put(pod)
        self.reads.on_changes([PodChange(pod.uid, before, pod, resources)], False)

    def deleted(self, uid: str) -> None:
        before = self.index.drop(uid)
        assert before is not None
        self.reads.on_changes([PodChange(uid, before, None, True)], False)

    async def fired(self) -> frozenset[str]:
        """The reasons the trigger gathered (empty: none), taken."""
        return await self.trigger.wait(time.monotonic(), 0)


async def test_a_recreated_pod_is_one_cycle_taking_the_old_entry_out_then_one_reading_the_new() -> None:
    fed = Fed(OLD)
    fed.added(NEW)  # ADDED for the new uid, then the old one's DELETED
    fed.deleted("uid-old")
    assert await fed.fired() == {POD_READS}
    # The first cycle only takes the old pod's entry out (no call), and asks for another...
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: False}
    assert fed.reads.take_gone(inventory_of([], {})) == {NAME: OLD}  # its removal names the old pod
    assert await fed.fired() == {POD_READS}
    # ...which reads the new pod alone, with Get.
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: True}
    assert fed.reads.take_gone(inventory_of(["GPU-b"], {"store/db-0": ["GPU-b"]})) == {}
    assert fed.reads.serve({POD_READS}, usable=True) == {}  # nothing left over


async def test_the_deleted_before_the_added_renews_the_name_the_same_way() -> None:
    fed = Fed(OLD)
    fed.deleted("uid-old")
    fed.added(NEW)
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: False}
    assert fed.reads.take_gone(inventory_of([], {})) == {NAME: OLD}
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: True}


async def test_a_cycle_that_lists_gets_its_reasons_again_after_the_old_entry_is_out() -> None:
    fed = Fed(OLD)
    fed.added(NEW)
    await fed.fired()
    assert fed.reads.serve({"state-file:checkpoint", POD_READS}, usable=True) == {NAME: False}
    assert await fed.fired() == {"state-file:checkpoint", POD_READS}
    assert fed.reads.serve({"state-file:checkpoint", POD_READS}, usable=True) is None  # List


async def test_without_a_usable_inventory_a_renewal_is_left_to_list() -> None:
    fed = Fed(OLD)
    fed.added(NEW)
    await fed.fired()
    assert fed.reads.serve({POD_READS}, usable=False) is None
    assert await fed.fired() == frozenset()  # no second cycle asked for


async def test_the_old_pods_late_update_and_delete_ask_for_nothing() -> None:
    fed = Fed(OLD)
    fed.added(NEW)
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: False}
    fed.reads.take_gone(inventory_of([], {}))
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: True}
    await fed.fired()
    fed.modified(PodMeta("uid-old", *NAME, phase="Succeeded", owner=SET))  # finished, late
    fed.deleted("uid-old")
    assert await fed.fired() == frozenset()
    assert fed.reads.serve({POD_READS}, usable=True) == {}  # above all, no take-out of the name
    assert fed.reads.take_gone(inventory_of([], {})) == {}


async def test_a_delete_is_a_reason_to_read_and_a_pod_still_listed_stays_named_until_it_is_not() -> None:
    fed = Fed(OLD)
    fed.deleted("uid-old")
    assert await fed.fired() == {POD_READS}
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: True}  # Get decides, not the DELETED
    still = inventory_of(["GPU-a"], {"store/db-0": ["GPU-a"]})
    assert fed.reads.take_gone(still) == {NAME: OLD}  # Get still answered: kept, still named
    assert fed.reads.take_gone(still) == {NAME: OLD}  # a List later: still listed
    assert fed.reads.take_gone(inventory_of(["GPU-a"], {})) == {NAME: OLD}  # the cycle that removes it
    assert fed.reads.take_gone(inventory_of(["GPU-a"], {})) == {}  # then forgotten


async def test_a_still_listed_deleted_pods_name_taken_by_a_new_pod_is_a_renewal() -> None:
    fed = Fed(OLD)
    fed.deleted("uid-old")
    fed.reads.serve({POD_READS}, usable=True)
    fed.reads.take_gone(inventory_of(["GPU-a"], {"store/db-0": ["GPU-a"]}))  # still listed
    fed.added(NEW)
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: False}
    assert fed.reads.take_gone(inventory_of(["GPU-a"], {})) == {NAME: OLD}


async def test_a_finished_pod_is_taken_out_without_a_read_and_its_delete_asks_nothing_more() -> None:
    fed = Fed(OLD)
    finished = PodMeta("uid-old", *NAME, phase="Failed", owner=SET)
    fed.modified(finished)
    assert fed.reads.serve({POD_READS}, usable=True) == {NAME: False}
    assert fed.reads.take_gone(inventory_of([], {})) == {NAME: OLD}
    await fed.fired()
    fed.deleted("uid-old")
    assert await fed.fired() == frozenset()
    assert fed.reads.serve({POD_READS}, usable=True) == {}


async def test_a_status_change_alone_is_a_look_even_for_a_replaced_pod() -> None:
    fed = Fed(OLD)
    fed.added(NEW)
    await fed.fired()
    fed.modified(PodMeta("uid-old", *NAME, phase="Running", owner=SET, labels=(("a", "b"),)), resources=False)
    assert await fed.fired() == {POD_STATUS}


def _verdicts(*health: tuple[str, str]) -> tuple[DeviceVerdict, ...]:
    return tuple(DeviceVerdict("main", "nvidia.com/gpu", device, h, "") for device, h in health)


async def test_a_plugin_devices_health_change_is_a_whole_look_and_its_first_verdicts_are_not() -> None:
    """A plugin device's health changing in the status brings a whole look (the device left or
    rejoined allocatable); a pod's first verdicts (its first container statuses, on every pod start
    at a real kubelet) and a DRA verdict's change are a status look only."""
    pending = PodMeta("uid-gpu", "ml", "gpu-0", phase="Pending")
    fed = Fed(pending)
    fed.modified(dataclasses.replace(pending, verdicts=_verdicts(("gpu0", "Healthy"))), resources=False)
    assert await fed.fired() == {POD_STATUS}
    fed.modified(dataclasses.replace(pending, verdicts=_verdicts(("gpu0", "Unhealthy"))), resources=False)
    assert await fed.fired() == {POD_STATUS, PLUGIN_HEALTH}
    claim = DeviceVerdict("main", "claim:gpu", "vendor.com/gpu=0", "Unhealthy", "XID 79")
    fed.modified(
        dataclasses.replace(pending, verdicts=(*_verdicts(("gpu0", "Unhealthy")), claim)), resources=False
    )
    assert await fed.fired() == {POD_STATUS}
