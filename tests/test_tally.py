"""The tally carried over from the last inventory equals a recount over every pod, for any change."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from testkit.node_model import FAST, Model, models
from testkit.node_mutations import MUTATIONS
from testkit.node_rendering import build_from
from watcher.model.inventory import Inventory, changed_pods
from watcher.model.records import Container, Device, Pod
from watcher.model.tally import Tally


def _recounted(inv: Inventory) -> Inventory:
    return dataclasses.replace(inv)  # an equal inventory with nothing cached


@FAST
@given(model=models(), other=models(), rng=st.randoms(use_true_random=True))
def test_a_carried_tally_equals_a_recount(model: Model, other: Model, rng: random.Random) -> None:
    before = build_from(model, random.Random(rng.getrandbits(64)))
    before.tally  # noqa: B018 - made, so the next inventory can carry it
    for changed in [m(model) for m in MUTATIONS] + [other]:
        if changed is None:
            continue
        after = build_from(changed, random.Random(rng.getrandbits(64)))
        # The decoder carries unchanged pods over as the same objects; so must this test.
        same = {(p.namespace, p.name): p for p in before.pods}
        pods = tuple(
            p if same.get((p.namespace, p.name)) != p else same[(p.namespace, p.name)] for p in after.pods
        )
        after = dataclasses.replace(after, pods=pods)
        after.carry_tally(before)
        fresh = _recounted(after)
        assert after.tally == Tally.of(after.pods)
        assert after.capacity == fresh.capacity
        assert after.cpus == fresh.cpus
        assert after.memory_capacity == fresh.memory_capacity
        assert after.missing_devices == fresh.missing_devices


def _pod(i: int, gpu: bool) -> Pod:
    devices = (Device("nvidia.com/gpu", f"gpu-{i}", (i % 2,)),) if gpu else ()
    return Pod("ns", f"p{i:03}", (Container("c", devices, (i,), (), ()),), (), ())


def test_one_changed_pod_is_carried_not_recounted() -> None:
    """The seam the cycle relies on: a tally made once is moved, not made again, when few pods
    change; the pods that did not change are not walked."""
    base = Inventory(
        devices=(), cpu_ids=tuple(range(64)), memory=(), pods=tuple(_pod(i, True) for i in range(64))
    )
    base.tally  # noqa: B018
    pods = list(base.pods)
    pods[3] = _pod(3, False)
    after = dataclasses.replace(base, pods=tuple(pods))
    after.carry_tally(base)
    assert "tally" in after.__dict__  # carried: no recount was needed to get here
    assert ("nvidia.com/gpu", "gpu-3") not in after.holders
    assert after.tally == Tally.of(after.pods)
    assert after.cpus.allocated == 64 and base.tally.holders[("nvidia.com/gpu", "gpu-3")][0] == ("ns/p003/c",)


@FAST
@given(model=models(), other=models(), rng=st.randoms(use_true_random=True))
def test_with_pods_is_the_inventory_built_afresh(model: Model, other: Model, rng: random.Random) -> None:
    """Pods replaced, added and taken out through with_pods give the inventory a build of the
    result gives: the same pods, hash, tally and figures; and changed_pods says what moved."""
    before = build_from(model, random.Random(rng.getrandbits(64)))
    before.content_hash  # noqa: B018 - made, so with_pods splices them instead
    before.tally  # noqa: B018
    donor = build_from(other, random.Random(rng.getrandbits(64)))
    replaced: dict[tuple[str, str], Pod | None] = {}
    for pod in before.pods:
        if rng.random() < 0.3:
            replaced[(pod.namespace, pod.name)] = None
    for pod in donor.pods:
        if rng.random() < 0.3:
            replaced[(pod.namespace, pod.name)] = pod
    after = before.with_pods(replaced)
    expected = {(p.namespace, p.name): p for p in before.pods}
    for key, pod in replaced.items():
        if pod is None:
            expected.pop(key, None)
        else:
            expected[key] = pod
    fresh = dataclasses.replace(before, pods=tuple(expected[k] for k in sorted(expected)))
    assert after == fresh
    assert after.content_hash == fresh.content_hash
    assert after.tally == Tally.of(fresh.pods)
    assert after.capacity == fresh.capacity and after.cpus == fresh.cpus
    gone, came = changed_pods(before, after)
    assert (gone, came) == changed_pods(before, fresh)  # what the walk of both would say
    for key in expected:
        assert after.pod(*key) == expected[key]
