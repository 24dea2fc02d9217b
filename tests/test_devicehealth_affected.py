"""Who is hit (watcher/model/devicehealth/affected.py): changes about pods carry the Pods API's uid,
controller and allowlisted labels, never a guessed one, and the texts people read name the owner
first."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from testkit.inventories import inventory_of
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.affected import annotate, hit_pods, owner_text
from watcher.model.devicehealth.pods import Owner, PodIndex, PodMeta
from watcher.model.diff import diff
from watcher.model.events import envelope, event_schema

GPU = "nvidia.com/gpu"
JOB = Owner("Job", "llm-pretrain", "uid-job")
RS = Owner("ReplicaSet", "serve-7d9f", "uid-rs")
PRETRAIN = PodMeta(
    "uid-p0",
    "ml",
    "llm-pretrain-0",
    owner=JOB,
    labels=(("team", "research"), ("app", "llm")),
)
PRETRAIN_1 = PodMeta("uid-p1", "ml", "llm-pretrain-1", owner=JOB, labels=(("team", "research"),))
SERVE = PodMeta(
    "uid-s0",
    "web",
    "serve-7d9f-abcde",
    owner=RS,
    labels=(("app.kubernetes.io/part-of", "shop"), ("team", "storefront")),
)
BARE = PodMeta("uid-b0", "default", "debug")  # no controller: a bare pod
INDEX = PodIndex([PRETRAIN, PRETRAIN_1, SERVE, BARE])


def _kinds(changes: list[Change]) -> dict[Kind, Change]:
    return {c.kind: c for c in changes}


# --- annotate ---


def test_a_change_about_one_pod_gains_its_uid_owner_and_labels() -> None:
    # An allocation.added straight from the diff: the shape the agent emits.
    before = inventory_of(["GPU-0", "GPU-1"], {})
    after = inventory_of(["GPU-0", "GPU-1"], {"ml/llm-pretrain-0": ["GPU-0"]})
    (change,) = [c for c in diff(before, after) if c.kind is Kind.ALLOCATION_ADDED]
    (annotated,) = annotate([change], INDEX)
    assert annotated.details["pod_uid"] == "uid-p0"
    assert annotated.details["owner"] == {"kind": "Job", "name": "llm-pretrain", "uid": "uid-job"}
    assert annotated.details["labels"] == {"team": "research", "app": "llm"}
    # Everything else as it was, the summary too; the original is untouched (frozen).
    assert {k: v for k, v in annotated.details.items() if k not in ("pod_uid", "owner", "labels")} == dict(
        change.details
    )
    assert annotated.summary == change.summary and annotated.kind is change.kind
    assert "pod_uid" not in change.details


def test_removed_and_changed_allocations_are_annotated_too() -> None:
    one = inventory_of(["GPU-0", "GPU-1"], {"ml/llm-pretrain-0": ["GPU-0"]})
    two = inventory_of(["GPU-0", "GPU-1"], {"ml/llm-pretrain-0": ["GPU-0", "GPU-1"]})
    gone = inventory_of(["GPU-0", "GPU-1"], {})
    changed = _kinds(annotate(diff(one, two), INDEX))[Kind.ALLOCATION_CHANGED]
    removed = _kinds(annotate(diff(two, gone), INDEX))[Kind.ALLOCATION_REMOVED]
    assert changed.details["pod_uid"] == removed.details["pod_uid"] == "uid-p0"


def test_a_change_naming_holders_gains_their_pods_once_each_sorted() -> None:
    holders = ["web/serve-7d9f-abcde/main", "ml/llm-pretrain-1/main", "ml/llm-pretrain-1/sidecar"]
    change = Change(
        Kind.DEVICE_REMOVED,
        Severity.CRITICAL,
        "nvidia.com/gpu GPU-0 left allocatable",
        {"resource": GPU, "device": "GPU-0", "allocated_to": holders},
    )
    (annotated,) = annotate([change], INDEX)
    assert annotated.details["pods"] == [
        {
            "namespace": "ml",
            "name": "llm-pretrain-1",
            "uid": "uid-p1",
            "owner": JOB.to_json(),
            "labels": {"team": "research"},
        },
        {
            "namespace": "web",
            "name": "serve-7d9f-abcde",
            "uid": "uid-s0",
            "owner": RS.to_json(),
            "labels": {"app.kubernetes.io/part-of": "shop", "team": "storefront"},
        },
    ]
    assert annotated.details["allocated_to"] == holders
    assert "pod_uid" not in annotated.details  # not a one-pod change


def test_device_removed_from_the_diff_names_its_holder() -> None:
    held = {"ml/llm-pretrain-0": ["GPU-0"]}
    changes = annotate(diff(inventory_of(["GPU-0", "GPU-1"], held), inventory_of(["GPU-1"], held)), INDEX)
    removed = _kinds(changes)[Kind.DEVICE_REMOVED]
    assert [p["uid"] for p in removed.details["pods"]] == ["uid-p0"]


def test_cpu_removed_and_device_unhealthy_shapes_gain_pods() -> None:
    cpu = Change(
        Kind.CPU_REMOVED,
        Severity.CRITICAL,
        "2 CPUs left",
        {"cpu_ids": [2, 3], "allocated_to": ["default/debug/c"]},
    )
    health = Change(
        Kind.DEVICE_UNHEALTHY,
        Severity.CRITICAL,
        "critical XID 79",
        {"resource": GPU, "device": "gpu-0", "allocated_to": ["ml/llm-pretrain-0/main"]},
    )
    got = annotate([cpu, health], INDEX)
    assert got[0].details["pods"] == [
        {"namespace": "default", "name": "debug", "uid": "uid-b0", "owner": None, "labels": {}}
    ]
    assert got[1].details["pods"][0]["uid"] == "uid-p0"


def test_an_unknown_pod_gains_nothing() -> None:
    about = Change(
        Kind.ALLOCATION_ADDED,
        Severity.INFO,
        "ml/other/main now holds 1 GPU",
        {"namespace": "ml", "pod": "other"},
    )
    holding = Change(
        Kind.DEVICE_REMOVED, Severity.CRITICAL, "gone", {"allocated_to": ["ml/other/main", "broken", 7]}
    )
    lifecycle = Change(Kind.KUBELET_RESTARTED, Severity.INFO, "restarted", {"socket": "/x"})
    changes = [about, holding, lifecycle]
    got = annotate(changes, INDEX)
    assert got == changes and all(a is b for a, b in zip(got, changes, strict=True))
    assert annotate(changes, PodIndex()) == changes


def test_a_known_holder_beside_unknown_ones_is_the_only_one_named() -> None:
    change = Change(
        Kind.DEVICE_INCIDENT,
        Severity.CRITICAL,
        "4 GPUs at once",
        {"allocated_to": ["ml/ghost/main", "web/serve-7d9f-abcde/main"]},
    )
    (annotated,) = annotate([change], INDEX)
    assert [p["name"] for p in annotated.details["pods"]] == ["serve-7d9f-abcde"]


def test_annotating_twice_changes_nothing_more() -> None:
    change = Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", {"namespace": "ml", "pod": "llm-pretrain-0"})
    once = annotate([change], INDEX)
    assert annotate(once, INDEX) == once


def test_the_same_name_is_whichever_pod_the_index_holds_now() -> None:
    # A pod deleted and recreated under its name: the uid is the new one's, never the old one's.
    index = PodIndex([PRETRAIN])
    index.put(PodMeta("uid-new", "ml", "llm-pretrain-0", owner=JOB))
    change = Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", {"namespace": "ml", "pod": "llm-pretrain-0"})
    (annotated,) = annotate([change], index)
    assert annotated.details["pod_uid"] == "uid-new" and annotated.details["labels"] == {}


# --- owner_text ---


def _about(pod: PodMeta) -> dict[str, Any]:
    (annotated,) = annotate(
        [Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", {"namespace": pod.namespace, "pod": pod.name})],
        PodIndex([pod]),
    )
    return dict(annotated.details)


def _holding(*pods: PodMeta) -> dict[str, Any]:
    holders = [f"{p.namespace}/{p.name}/main" for p in pods]
    (annotated,) = annotate(
        [Change(Kind.DEVICE_REMOVED, Severity.CRITICAL, "x", {"allocated_to": holders})], INDEX
    )
    return dict(annotated.details)


@pytest.mark.parametrize(
    ("details", "text"),
    [
        (_about(PRETRAIN), "Job ml/llm-pretrain (team research)"),
        (_about(SERVE), "ReplicaSet web/serve-7d9f (team storefront, part-of shop)"),
        (_about(PodMeta("u", "ml", "p", owner=JOB, labels=(("app", "llm"),))), "Job ml/llm-pretrain"),
        (_holding(SERVE, PRETRAIN), "Job ml/llm-pretrain (team research) +1 more"),
        # Two pods of one Job are one owner; a bare pod beside it counts as one more.
        (_holding(PRETRAIN, PRETRAIN_1), "Job ml/llm-pretrain (team research)"),
        (_holding(PRETRAIN, PRETRAIN_1, BARE, SERVE), "Job ml/llm-pretrain (team research) +2 more"),
        # The first pod with an owner, though a bare pod sorts before it.
        (_holding(BARE, SERVE), "ReplicaSet web/serve-7d9f (team storefront, part-of shop) +1 more"),
    ],
)
def test_owner_text(details: dict[str, Any], text: str) -> None:
    assert owner_text(details) == text


@pytest.mark.parametrize(
    "details",
    [
        {},
        {"namespace": "ml", "pod": "p"},  # not annotated: the Pods API did not know it
        _about(BARE),  # known, but nothing owns it
        _holding(BARE),
        {"pods": "nonsense"},
        {"pods": [{"namespace": "ml", "name": "p", "uid": "u", "owner": {"kind": "", "name": "x"}}]},
        {"pods": [{"namespace": "ml", "name": "p", "owner": JOB.to_json()}]},  # no uid: not an entry
    ],
)
def test_no_owner_no_text(details: dict[str, Any]) -> None:
    assert owner_text(details) is None


def test_owner_text_shows_hostile_names_escaped() -> None:
    evil = PodMeta(
        "u", "ml", "p", owner=Owner("Job", "x\n\x1b[31mfake", "u2"), labels=(("team", "a\u202eb"),)
    )
    text = owner_text(_about(evil))
    assert text is not None and "\n" not in text and "\x1b" not in text and "\u202e" not in text


def test_hit_pods_of_each_shape() -> None:
    assert [p["uid"] for p in hit_pods(_about(PRETRAIN))] == ["uid-p0"]
    assert [p["uid"] for p in hit_pods(_holding(SERVE, PRETRAIN))] == ["uid-p0", "uid-s0"]
    assert hit_pods({"namespace": "ml", "pod": "p"}) == []


# --- the schema ---


def _event_json(change: Change) -> dict[str, Any]:
    event = envelope(change, seq=1, node="node-a", cycle="c1", before=None, after=None)
    parsed: dict[str, Any] = json.loads(event.to_json())
    return parsed


def test_annotated_events_validate_against_the_schema() -> None:
    for details in (_about(PRETRAIN), _about(BARE), _holding(PRETRAIN, SERVE, BARE)):
        change = Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", details)
        jsonschema.validate(_event_json(change), event_schema())


@pytest.mark.parametrize(
    "bad",
    [
        {"owner": "Job ml/llm-pretrain"},
        {"owner": {"kind": "Job", "name": "llm-pretrain"}},  # no uid
        {"labels": {"team": 7}},
        {"pod_uid": 42},
        {"pods": [{"namespace": "ml", "name": "p", "uid": "u", "owner": ["Job"], "labels": {}}]},
    ],
)
def test_a_wrongly_typed_who_key_fails_the_schema(bad: dict[str, Any]) -> None:
    change = Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", {**_about(PRETRAIN), **bad})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_event_json(change), event_schema())


def test_details_stay_open_to_other_keys() -> None:
    change = Change(Kind.ALLOCATION_ADDED, Severity.INFO, "x", {**_about(PRETRAIN), "anything": {"new": [1]}})
    jsonschema.validate(_event_json(change), event_schema())
