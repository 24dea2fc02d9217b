"""PodIndex keyed by uid, a name only a pointer to the newest pod that has it: a name reused by a
recreated pod, the old pod's late updates, either one leaving, duplicates. Pure."""

from __future__ import annotations

from watcher.model.devicehealth.pods import DeviceVerdict, Owner, PodIndex, PodMeta

SET = Owner("StatefulSet", "db", "uid-sts")
OLD = PodMeta("uid-old", "store", "db-0", phase="Running", owner=SET, labels=(("team", "old"),))
NEW = PodMeta("uid-new", "store", "db-0", phase="Pending", owner=SET, labels=(("team", "new"),))
OTHER = PodMeta("uid-other", "store", "db-1", phase="Running", owner=SET)


def _uid(index: PodIndex, namespace: str = "store", name: str = "db-0") -> str | None:
    pod = index.get(namespace, name)
    return None if pod is None else pod.uid


def test_a_new_pod_under_a_reused_name_takes_the_name_and_the_old_one_stays_by_uid() -> None:
    index = PodIndex([OLD, OTHER])
    assert index.put(NEW) is None  # new to the index
    assert _uid(index) == "uid-new"
    assert index.by_uid("uid-old") == OLD and len(index) == 3 and "uid-old" in index
    assert [p.uid for p in index.named("store", "db-0")] == ["uid-old", "uid-new"]
    assert _uid(index, name="db-1") == "uid-other"  # other names untouched


def test_a_late_update_of_the_old_uid_never_takes_the_name_back() -> None:
    index = PodIndex([OLD, NEW])
    finished = PodMeta("uid-old", "store", "db-0", phase="Succeeded", owner=SET, labels=(("team", "old"),))
    assert index.put(finished) == OLD  # the entry it replaced, by uid
    assert _uid(index) == "uid-new"
    assert index.by_uid("uid-old") == finished
    assert index.get("store", "db-0") == NEW  # uid, owner and labels all the new pod's


def test_the_old_pods_delete_leaves_the_new_pods_name() -> None:
    index = PodIndex([OLD, NEW])
    assert index.drop("uid-old") == OLD
    assert _uid(index) == "uid-new"
    assert [p.uid for p in index.named("store", "db-0")] == ["uid-new"]
    assert index.drop("uid-old") is None  # a duplicate DELETED: nothing more
    assert _uid(index) == "uid-new"


def test_the_new_pods_delete_gives_the_name_back_to_the_older_pod_still_there() -> None:
    index = PodIndex([OLD, NEW])
    index.drop("uid-new")
    assert _uid(index) == "uid-old"
    index.drop("uid-old")
    assert index.get("store", "db-0") is None and index.named("store", "db-0") == ()
    assert len(index) == 0


def test_each_recreation_moves_the_name_to_the_newest() -> None:
    index = PodIndex([OLD, NEW])
    third = PodMeta("uid-third", "store", "db-0")
    index.put(third)
    assert _uid(index) == "uid-third"
    assert [p.uid for p in index.named("store", "db-0")] == ["uid-old", "uid-new", "uid-third"]
    index.drop("uid-new")  # the middle one leaving changes nothing of the name
    assert _uid(index) == "uid-third"
    index.drop("uid-third")
    assert _uid(index) == "uid-old"


def test_a_duplicate_event_is_an_upsert_that_changes_nothing() -> None:
    index = PodIndex([OLD, NEW])
    assert index.put(NEW) == NEW and index.put(OLD) == OLD
    assert _uid(index) == "uid-new" and len(index) == 2
    assert [p.uid for p in index.named("store", "db-0")] == ["uid-old", "uid-new"]


def test_a_uid_that_changes_its_name_is_not_found_under_the_old_one() -> None:
    # Never in Kubernetes (a name is immutable), but the index holds whatever bytes said.
    index = PodIndex([OLD])
    moved = PodMeta("uid-old", "store", "db-9")
    assert index.put(moved) == OLD
    assert index.get("store", "db-0") is None and _uid(index, name="db-9") == "uid-old"


def test_claim_verdicts_follow_the_uid_whatever_the_name_does() -> None:
    verdict = DeviceVerdict("main", "claim:gpu", "gpu.nvidia.com/a/gpu-0", "Unhealthy", "XID 79")
    index = PodIndex([PodMeta("uid-old", "store", "db-0", verdicts=(verdict,)), NEW])
    assert [p.uid for p in index.with_claim_verdicts()] == ["uid-old"]
    index.drop("uid-old")
    assert list(index.with_claim_verdicts()) == []
