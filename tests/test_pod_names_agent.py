"""A pod name reused under a new uid and a force-deleted pod, through the whole agent against the
fake kubelet's pod-resources and Pods API (real grpc.aio servers on real unix sockets): exactly the
truthful events, each naming the pod whose holdings it is about, and pod-resources the only judge
of when an allocation ended."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import Running, make_settings, running_agent
from watcher.model.events import Event
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeContainer, FakeDevice, FakeNode, FakeOwner, FakePod

GPU = "nvidia.com/gpu"
OWNER = FakeOwner("StatefulSet", "db")
REPLICA = ("store", "db-0")
OLD_UID, NEW_UID = "0c0ffee0-0000-4000-8000-000000000001", "0c0ffee0-0000-4000-8000-000000000002"


def _replica(uid: str, gpu: str, team: str) -> FakePod:
    return FakePod(
        *REPLICA,
        [FakeContainer("postgres", devices={GPU: [gpu]})],
        uid=uid,
        labels={"team": team},
        owners=[OWNER],
    )


def _fake(root: Path, seed: int) -> FakeKubelet:
    node = FakeNode()
    for gpu in ("GPU-a", "GPU-b"):
        node.add_device(FakeDevice(GPU, gpu, (0,)))
    node.add_pod(_replica(OLD_UID, "GPU-a", "old"))
    return FakeKubelet(root / "kubelet", node, seed=seed)


def _settings(root: Path) -> Any:
    # The Pods API alone tells of pod changes here: no state-file triggers, the timer far away.
    return make_settings(root, state_file_triggers=False, interval=3600.0)


def _seen(events: list[Event]) -> list[tuple[str, str | None, Any]]:
    """Each event as (kind, the pod uid it names, its devices): what a failure shows."""
    return [(str(e.kind), e.details.get("pod_uid"), e.details.get("devices")) for e in events]


async def _events(run: Running, mark: int, count: int) -> list[Event]:
    """The `count` events after `mark`, or a failure saying which came instead."""
    try:
        await run.recorder.kinds_after(mark, count, timeout=5)
    except TimeoutError:
        raise AssertionError(f"{count} events expected, got {_seen(run.recorder.events[mark:])}") from None
    return run.recorder.events[mark:]


async def _reported(run: Running, uid: str, phase: str | None) -> None:
    """Until the agent's watch took a change of pod `uid` to `phase` (None: its DELETED)."""

    def taken() -> bool:
        return any(
            c.uid == uid and (c.after.phase if c.after is not None else None) == phase
            for c in run.recorder.pod_changes
        )

    await run.recorder.until(taken)


def _assert_replaced(events: list[Event], old_gpu: str, new_gpu: str) -> None:
    """One removal of the old pod's GPU naming the old pod, one addition naming the new one."""
    assert [str(e.kind) for e in events] == [
        "allocation.removed",
        "capacity.changed",
        "allocation.added",
        "capacity.changed",
    ], _seen(events)
    removed, added = events[0].details, events[2].details
    assert (removed["pod_uid"], removed["devices"], removed["labels"]) == (
        OLD_UID,
        {GPU: [old_gpu]},
        {"team": "old"},
    )
    assert (added["pod_uid"], added["devices"], added["labels"]) == (
        NEW_UID,
        {GPU: [new_gpu]},
        {"team": "new"},
    )
    assert added["owner"] == {"kind": "StatefulSet", "name": "db", "uid": OWNER.uid}


@pytest.mark.parametrize("new_gpu", ["GPU-b", "GPU-a"], ids=["another-gpu", "the-same-gpu"])
async def test_a_pod_recreated_under_its_name_is_one_removal_and_one_addition(
    short_tmp: Path, new_gpu: str
) -> None:
    # The Pods API sends the new pod's ADDED and the old one's DELETED together.
    fake = _fake(short_tmp, seed=41)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
        await run.pods_watching()
        mark, gets, lists = len(run.recorder.events), fake.calls["Get"], fake.calls["List"]
        fake.churn.replace_pod(_replica(NEW_UID, new_gpu, "new"))
        _assert_replaced(await _events(run, mark, 4), "GPU-a", new_gpu)
        # The agent read the new pod alone, once: no List, and one Get (the old one's end is
        # the new one's name: nothing to ask).
        assert (fake.calls["Get"] - gets, fake.calls["List"] - lists) == (1, 0)
        await _reported(run, OLD_UID, None)
        await run.quiet_cycle()  # and List agrees: nothing more
        assert len(run.recorder.events) == mark + 4, _seen(run.recorder.events[mark:])


async def test_the_old_pods_late_update_after_the_new_ones_added_changes_nothing(short_tmp: Path) -> None:
    # The old pod still terminating on the Pods API: ADDED (new), then MODIFIED (old, finished),
    # then DELETED (old), as a kubelet sends them.
    fake = _fake(short_tmp, seed=42)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
        await run.pods_watching()
        watch = run.agent.pods_watch
        assert watch is not None
        mark = len(run.recorder.events)
        fake.churn.replace_pod(_replica(NEW_UID, "GPU-b", "new"), old_stays=True)
        await run.recorder.until(
            lambda: any(e.details.get("pod_uid") == NEW_UID for e in run.recorder.events)
        )
        fake.churn.update_old_pod(OLD_UID, phase="Succeeded")
        await _reported(run, OLD_UID, "Succeeded")
        replica = watch.index.get(*REPLICA)
        assert replica is not None and replica.uid == NEW_UID  # the name stays the new pod's
        fake.churn.remove_old_pod(OLD_UID)
        await _reported(run, OLD_UID, None)
        replica = watch.index.get(*REPLICA)
        assert replica is not None and replica.uid == NEW_UID
        await run.quiet_cycle()
        _assert_replaced(run.recorder.events[mark:], "GPU-a", "GPU-b")
        assert run.agent.inventory is not None
        (pod,) = [p for p in run.agent.inventory.pods if (p.namespace, p.name) == REPLICA]
        assert [d.id for c in pod.containers for d in c.devices] == ["GPU-b"]


async def test_a_force_deleted_pod_is_removed_once_when_pod_resources_no_longer_lists_it(
    short_tmp: Path,
) -> None:
    fake = _fake(short_tmp, seed=43)
    async with fake, running_agent(_settings(short_tmp), fake) as run:
        await run.pods_watching()
        mark, cycles, gets = len(run.recorder.events), run.recorder.cycles, fake.calls["Get"]
        fake.churn.force_delete(*REPLICA)  # DELETED on the Pods API; its containers still run
        await _reported(run, OLD_UID, None)
        await run.recorder.until(lambda: run.recorder.cycles > cycles)  # the cycle the DELETED woke
        assert run.recorder.kinds(mark) == [], _seen(run.recorder.events[mark:])
        assert fake.calls["Get"] - gets == 1  # a reason to ask pod-resources, which still lists it
        await run.quiet_cycle()  # List agrees: still held
        assert run.recorder.kinds(mark) == [], _seen(run.recorder.events[mark:])

        fake.free(*REPLICA)  # its containers stopped: pod-resources no longer lists it
        await run.quiet_cycle()
        events = await _events(run, mark, 2)
        assert [str(e.kind) for e in events] == ["allocation.removed", "capacity.changed"]
        removed = events[0].details
        assert (removed["pod_uid"], removed["devices"]) == (OLD_UID, {GPU: ["GPU-a"]})  # named as it was
        assert removed["owner"] == {"kind": "StatefulSet", "name": "db", "uid": OWNER.uid}
        await run.quiet_cycle()
        assert len(run.recorder.events) == mark + 2, _seen(run.recorder.events[mark:])


async def test_a_pod_that_came_while_no_agent_ran_is_named_with_its_uid_and_owner(short_tmp: Path) -> None:
    # A DaemonSet's agent replaced (deleted, rolled, evicted) starts on its saved state: what changed
    # meanwhile is its first look's, which must wait for the Pods API to name the pod as every
    # later change does. Without that wait, the look beat the API's snapshot: no uid, no owner.
    fake = _fake(short_tmp, seed=43)
    async with fake:
        async with running_agent(_settings(short_tmp), fake) as run:
            await run.pods_watching()
        newcomer = FakePod(
            "store", "db-1", [FakeContainer("postgres", devices={GPU: ["GPU-b"]})],
            uid=NEW_UID, labels={"team": "new"}, owners=[OWNER],
        )  # fmt: skip
        fake.add_pod(newcomer)
        assert fake.pods_api is not None
        fake.pods_api.snapshot_delay = 0.5  # a busy kubelet: its snapshot comes after pod-resources
        async with running_agent(_settings(short_tmp), fake) as run:
            events = await _events(run, 0, 3)
            assert [str(e.kind) for e in events] == [
                "watcher.started",
                "allocation.added",
                "capacity.changed",
            ]
            added = events[1].details
            assert (added["pod"], added["pod_uid"], added["owner"]["name"]) == ("db-1", NEW_UID, "db")


async def test_a_pods_api_that_never_sends_its_snapshot_delays_the_first_look_by_the_bound_only(
    short_tmp: Path,
) -> None:
    # A kubelet that accepts the watch and sends nothing: the first look goes ahead after
    # FIRST_LOOK_WAIT (5 s) without the API, and stopping meanwhile is not held up.
    fake = _fake(short_tmp, seed=44)
    assert fake.pods_api is not None
    fake.pods_api.mute = True
    async with fake:
        async with running_agent(_settings(short_tmp), fake) as run:
            assert await run.recorder.kinds_after(0, 1, timeout=15) == ["watcher.started"]
            assert run.agent.pods_watch is not None and run.agent.pods_watch.state != "watching"
        async with asyncio.timeout(3):  # a stop during the wait ends it at once
            async with running_agent(_settings(short_tmp / "again"), fake):
                pass
