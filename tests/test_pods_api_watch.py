"""The agent's Pods API watch against the fake kubelet's Pods API (a real grpc.aio server on a real
unix socket): each pod reported once per real difference, whatever the stream repeats, drops or
restarts; each state the socket and the kubelet can be in, logged once; hostile pods bounded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from testkit.changes import Changes
from testkit.fake_kubelets import StartKubelet
from testkit.waiting import wait_until
from watcher import errors
from watcher.backoff import Backoff
from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
from watcher.kubeletapi.v1alpha1 import pods_pb2
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeContainer, FakeNode, FakePod
from watcher.sim.fake_plugins import Warmup
from watcher.sim.fake_pods_api import FakePodsApi
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.resync import listed
from watcher.sources.pods_api.watch import PodChange, PodsWatch, SnapshotBounds

LABELS = ("team", "app.kubernetes.io/name")
FAST = Backoff(base=0.02, cap=0.2)


class Watched:
    """A running PodsWatch and what it reported: every change, each batch's resync flag, states."""

    def __init__(self, socket: Path, backoff: Backoff, **options: Any) -> None:
        self.stop = asyncio.Event()
        self.seen = Changes()
        self.batches: list[tuple[list[PodChange], bool]] = []
        self.states: list[str] = []
        self.watch = PodsWatch(
            socket,
            labels=LABELS,
            backoff=backoff,
            stop=self.stop,
            on_changes=self._changes,
            on_state=self._state,
            timeout=5.0,
            **options,
        )

    def _changes(self, changes: Sequence[PodChange], resync: bool) -> None:
        self.batches.append((list(changes), resync))
        self.seen.notify()

    def _state(self, state: str, _detail: str) -> None:
        self.states.append(state)
        self.seen.notify()

    @property
    def changes(self) -> list[PodChange]:
        return [c for batch, _ in self.batches for c in batch]

    async def until(self, predicate: Callable[[], bool], what: str = "") -> None:
        await self.seen.until(
            predicate,
            timeout=10,
            describe=lambda: f"{what}: states {self.states}, {len(self.changes)} changes",
        )

    async def until_state(self, state: str) -> None:
        await self.until(lambda: self.watch.state == state, f"state {state}")


@asynccontextmanager
async def watching(socket: Path, backoff: Backoff = FAST, **options: Any) -> AsyncIterator[Watched]:
    """A PodsWatch on `socket` (`options`: its bounds, its ListPods check's period...)."""
    watched = Watched(socket, backoff, **options)
    task = asyncio.create_task(watched.watch.run())
    try:
        yield watched
    finally:
        watched.stop.set()
        await asyncio.wait_for(task, 10)
    assert task.done() and task.exception() is None


def _api(kubelet: FakeKubelet) -> FakePodsApi:
    assert kubelet.pods_api is not None
    return kubelet.pods_api


def _uid(kubelet: FakeKubelet, namespace: str, name: str) -> str:
    return kubelet.node.pods[(namespace, name)].uid


def _warnings(logs: list[dict[str, object]]) -> list[str]:
    return [str(entry["event"]) for entry in logs if entry["log_level"] == "warning"]


async def test_the_first_snapshot_with_a_duplicate_reports_each_pod_once(kubelet: FakeKubelet) -> None:
    # A change just before the watch shows in its snapshot and comes again as MODIFIED after it.
    _api(kubelet).delay_broadcasts(0.3)
    kubelet.update_pod("net", "dpdk-router", labels={"team": "net"})
    async with watching(_api(kubelet).socket_path) as w:
        await w.until_state("watching")
        pods = len(kubelet.node.pods)
        assert len(w.batches) == 1 and w.batches[0][1] is True
        assert sorted(c.uid for c in w.changes) == sorted(p.uid for p in kubelet.node.pods.values())
        assert all(c.before is None and c.after is not None and c.resources for c in w.changes)
        router = w.watch.index.get("net", "dpdk-router")
        assert router is not None and dict(router.labels) == {"team": "net"}
        # A later change comes after the duplicate on the stream: once it is reported, the
        # duplicate was read, and reported nothing.
        kubelet.update_pod("ml", "trainer-0", phase="Failed")
        await w.until(lambda: len(w.batches) == 2, "the later change")
        assert (
            w.watch.events == pods + 1 + 2
        )  # the snapshot, INITIAL_SYNC_COMPLETE, the duplicate, the change
        (change,) = w.batches[1][0]
        assert change.uid == _uid(kubelet, "ml", "trainer-0") and len(w.watch.index) == pods


async def test_a_resync_against_an_unchanged_index_reports_nothing(kubelet: FakeKubelet) -> None:
    async with watching(_api(kubelet).socket_path) as w:
        await w.until_state("watching")
        held = list(w.watch.index)
        await kubelet.restart()  # a new socket, a fresh snapshot of the same pods
        await w.until(lambda: w.watch.connects == 2 and w.watch.state == "watching", "second watch")
        assert len(w.batches) == 1  # the first snapshot only
        assert list(w.watch.index) == held


async def test_a_restart_is_initializing_then_a_resync_of_only_what_changed_meanwhile(
    short_tmp: Path,
    start_kubelet: StartKubelet,
) -> None:
    warmup = Warmup(plugin_delay=(0.0, 0.1), pods_delay=(0.6, 0.8))
    kubelet = await start_kubelet(root=short_tmp, seed=7, warmup=warmup)
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            first = len(w.batches)
            gone, failed = _uid(kubelet, "net", "dpdk-router"), _uid(kubelet, "ml", "trainer-0")
            await kubelet.stop()
            kubelet.free("net", "dpdk-router")
            kubelet.update_pod("ml", "trainer-0", phase="Failed")
            kubelet.update_pod("ml", "inference-7f9c", labels={"app.kubernetes.io/name": "inference"})
            await kubelet.start()
            await w.until(lambda: len(w.batches) > first, "the resync")
            assert "initializing" in w.states[w.states.index("watching") + 1 :]
            batch, resync = w.batches[-1]
            assert resync is True
            assert {c.uid: (c.after.phase if c.after else None) for c in batch} == {
                gone: None,
                failed: "Failed",
            }
            assert all(c.resources for c in batch)
            assert w.watch.index.by_uid(gone) is None
    assert not [e for e in _warnings(logs) if "initializ" in e]
    # Once per time the state was entered (at the first start too, when the watch came in time).
    initializing = [e for e in logs if "initializing" in str(e["event"])]
    assert len(initializing) == w.states.count("initializing")
    assert {e["log_level"] for e in initializing} == {"info"}


async def test_a_dropped_watch_re_diffs_and_reports_every_change_once(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    node = FakeNode()
    for i in range(150):
        node.add_pod(FakePod("load", f"pod-{i:03}", [FakeContainer("main")]))
    kubelet = await start_kubelet(node, root=short_tmp, seed=2)
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            before = len(w.changes)
            for i in range(150):  # one refresh: 150 events at once overflow the 100-event buffer
                kubelet.update_pod("load", f"pod-{i:03}", phase="Failed")
            await w.until(lambda: len(w.changes) - before >= 150, "every change reported")
            await w.until(lambda: w.watch.state == "watching" and w.watch.connects == 2, "rewatch")
            after = w.changes[before:]
            assert _api(kubelet).dropped == 1
            assert sorted(c.uid for c in after) == sorted(p.uid for p in node.pods.values())
            assert all(c.after is not None and c.after.phase == "Failed" for c in after)
            assert {resync for batch, resync in w.batches[1:]} == {False, True}  # live, then re-diff
    assert [e for e in _warnings(logs) if "dropped" in e] == [
        "the kubelet dropped the Pods API watch; reconnecting for a fresh snapshot"
    ]


async def test_a_stopping_kubelet_closing_the_watch_as_a_drop_is_no_warning(kubelet: FakeKubelet) -> None:
    # The kubelet closes every watch with the drop's words as it stops: the reconnect, finding
    # it gone and then replaced, says it stopped (info); only the same kubelet answering again
    # would have been a drop.
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            await kubelet.restart()
            await w.until(lambda: w.watch.connects == 2 and w.watch.state == "watching", "rewatch")
    assert [e for e in _warnings(logs) if "dropped" in e] == []
    assert [e["log_level"] for e in logs if "closed as the kubelet stopped" in str(e["event"])] == ["info"]
    assert _api(kubelet).dropped == 0


async def test_deleted_is_read_for_its_uid_only(kubelet: FakeKubelet) -> None:
    async with watching(_api(kubelet).socket_path) as w:
        await w.until_state("watching")
        uid = _uid(kubelet, "ml", "trainer-0")
        held = w.watch.index.by_uid(uid)
        # A DELETED naming another pod's namespace and name with the held uid: the uid decides.
        body = core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name="other", namespace="elsewhere", uid=uid))
        _api(kubelet).inject(pods_pb2.DELETED, body.SerializeToString())
        await w.until(lambda: len(w.batches) == 2, "the deletion")
        (change,) = w.batches[-1][0]
        assert (change.uid, change.before, change.after, change.resources) == (uid, held, None, True)
        assert w.watch.index.by_uid(uid) is None and w.watch.index.get("ml", "trainer-0") is None
        kubelet.free("net", "dpdk-router")  # the kubelet's own minimal DELETED
        await w.until(lambda: len(w.batches) == 3, "the kubelet's deletion")
        (change,) = w.batches[-1][0]
        assert change.before is not None and change.before.name == "dpdk-router" and change.after is None


async def test_an_absent_socket_is_waited_for_then_watched_by_the_same_loop(short_tmp: Path) -> None:
    kubelet = FakeKubelet(short_tmp, seed=5)
    socket = short_tmp / "pods-api" / "pods-api.sock"
    async with watching(socket, Backoff(base=0.01, cap=0.02)) as w:
        await w.until_state("absent")
        await asyncio.sleep(0.5)  # a busy loop would try hundreds of times meanwhile
        assert w.watch.attempts == 1
        async with kubelet:
            await w.until_state("watching")
            assert w.states == ["absent", "syncing", "watching"]
            assert w.watch.attempts == 2 and len(w.changes) == len(kubelet.node.pods)


async def test_a_socket_replaced_under_a_live_stream_is_reconnected(kubelet: FakeKubelet) -> None:
    old = _api(kubelet)
    async with watching(old.socket_path) as w:
        await w.until_state("watching")
        # Another server takes the path while the old one still serves its stream.
        new = FakePodsApi(kubelet.root, old.pods, ready=lambda: True)
        await new.start()
        try:
            await w.until(lambda: w.watch.connects == 2 and w.watch.state == "watching", "rewatch")
            assert (new.watchers, old.watchers) == (1, 0)
            assert len(w.batches) == 1  # the same pods: the re-diff reports nothing
        finally:
            await new.stop()


async def test_a_kubelet_without_the_api_is_disabled_logged_once_and_watched_when_replaced(
    kubelet: FakeKubelet,
) -> None:
    _api(kubelet).refuse(grpc.StatusCode.UNIMPLEMENTED, "unknown service v1alpha1.Pods")
    with capture_logs() as logs:
        # Retried quickly here, so that "once" means once over several refusals.
        async with watching(_api(kubelet).socket_path, Backoff(base=0.01, cap=0.05)) as w:
            await w.until_state("disabled")
            await wait_until(lambda: w.watch.attempts >= 4, what="retries")
            assert "UNIMPLEMENTED" in w.watch.detail and "pod-resources alone" in w.watch.detail
            _api(kubelet).refuse(None)
            await kubelet.restart()
            await w.until_state("watching")
    assert w.states.count("disabled") == 1
    assert [e for e in _warnings(logs) if "disabled" in e] == [
        "Pods API disabled; the agent works from pod-resources alone"
    ]


async def test_a_disabled_kubelet_is_retried_when_its_socket_is_replaced_not_only_on_the_backoff(
    kubelet: FakeKubelet,
) -> None:
    _api(kubelet).refuse(grpc.StatusCode.UNKNOWN, "pods API disabled")
    async with watching(_api(kubelet).socket_path, Backoff(base=60, cap=60)) as w:
        await w.until_state("disabled")
        _api(kubelet).refuse(None)
        await kubelet.restart()  # a restart with the gate on: the new socket is the cue
        await w.until_state("watching")


async def test_a_malformed_pod_is_one_warning_and_the_stream_goes_on(kubelet: FakeKubelet) -> None:
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            for _ in range(3):
                _api(kubelet).inject(pods_pb2.MODIFIED, b"\xff\xff\xff not a pod")
            kubelet.update_pod("ml", "trainer-0", phase="Failed")
            await w.until(lambda: len(w.batches) == 2, "the change after the garbage")
            assert w.batches[-1][0][0].uid == _uid(kubelet, "ml", "trainer-0")
            assert w.watch.connects == 1 and w.watch.decode_warnings.skipped == 3
    assert _warnings(logs) == ["a pod from the Pods API did not decode; skipped, the watch goes on"]


async def test_a_10_mb_pod_is_read_and_kept_small(kubelet: FakeKubelet) -> None:
    async with watching(_api(kubelet).socket_path) as w:
        await w.until_state("watching")
        big = FakePod("big", "blob", [FakeContainer("main")], labels={"team": "x", "blob": "b" * 10_000_000})
        kubelet.add_pod(big)
        await w.until(lambda: w.watch.index.by_uid(big.uid) is not None, "the big pod")
        held = w.watch.index.by_uid(big.uid)
        assert held is not None and held.labels == (("team", "x"),)
        assert w.watch.connects == 1


async def test_a_pod_over_16_mib_ends_the_stream_with_one_warning_and_the_watch_retries(
    kubelet: FakeKubelet,
) -> None:
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            held = list(w.watch.index)
            kubelet.add_pod(
                FakePod("big", "blob", [FakeContainer("main")], labels={"blob": "b" * (17 << 20)})
            )
            await w.until_state("syncing")
            # Between two attempts the detail says what the watch does now (reading the snapshot
            # again); after each failed one, why: wait for a retry's detail, not for a moment.
            await wait_until(
                lambda: w.watch.attempts >= 3 and "receive limit" in w.watch.detail,
                what="retries, the detail naming the limit",
            )
            kubelet.free("big", "blob")
            await w.until_state("watching")
            assert list(w.watch.index) == held and len(w.batches) == 1
    ended = [e for e in logs if e["event"] == "Pods API watch ended; reconnecting"]
    assert len(ended) == 1 and "16777216-byte receive limit" in str(ended[0]["error"])


async def test_a_message_over_the_receive_limit_is_a_clear_error(kubelet: FakeKubelet) -> None:
    kubelet.add_pod(FakePod("big", "blob", [FakeContainer("main")], labels={"blob": "b" * 2_000_000}))
    async with PodsApiClient(str(_api(kubelet).socket_path), timeout=5, max_receive_bytes=1 << 20) as client:
        with pytest.raises(errors.ResponseTooLargeError, match="1048576-byte receive limit"):
            async for _ in client.watch():
                pass
        with pytest.raises(errors.ResponseTooLargeError, match="ListPods"):
            await client.list_pods()
        assert len(await client.get_pod(_uid(kubelet, "ml", "trainer-0"))) > 0


async def test_a_label_with_control_characters_arrives_printable(kubelet: FakeKubelet) -> None:
    async with watching(_api(kubelet).socket_path) as w:
        await w.until_state("watching")
        kubelet.update_pod("ml", "trainer-0", labels={"team": "red\x1b[31m\nFAKE LINE\u202e"})
        # A label change alone is put in the index and told to nobody (events read labels from the
        # index): a later change on the stream, once reported, shows it was read.
        kubelet.update_pod("net", "dpdk-router", phase="Failed")
        await w.until(lambda: len(w.batches) == 2, "the change after the label's")
        assert [c.uid for c in w.batches[-1][0]] == [_uid(kubelet, "net", "dpdk-router")]
        held = w.watch.index.get("ml", "trainer-0")
        assert held is not None
        ((key, value),) = held.labels
        assert (key, value) == ("team", "red\\x1b[31m\\x0aFAKE LINE\\u202e") and value.isprintable()


async def test_a_modified_flood_reports_each_real_change_once_and_warns_once(kubelet: FakeKubelet) -> None:
    phases = ("Pending", "Running")
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path) as w:
            await w.until_state("watching")
            read, reported = w.watch.events, len(w.batches)
            pod = kubelet.node.pods[("ml", "trainer-0")]
            for i in range(30):
                # Labels alone (one the agent does not keep, one it keeps): a MODIFIED each that
                # reports nothing ...
                kubelet.update_pod("ml", "trainer-0", labels={**pod.labels, "noise": str(i), "team": f"v{i}"})
                await asyncio.sleep(0)  # ... broadcast on its own (the fake's refresh runs first)
                kubelet.update_pod("ml", "trainer-0", phase=phases[i % 2])  # a real one
                await w.until(lambda n=i: len(w.batches) - reported == n + 1, f"change {i}")
            assert w.watch.events - read == 60  # every MODIFIED read, in stream order
            assert len(w.batches) - reported == 30
            assert [c.after.phase for c in w.changes[-30:] if c.after] == [phases[i % 2] for i in range(30)]
            held = w.watch.index.get("ml", "trainer-0")
            assert held is not None and dict(held.labels)["team"] == "v29"  # the index has them
            assert w.watch.flood_warnings.warned == 1
    assert [e for e in _warnings(logs) if "too often" in e] == [
        "one pod changes too often on the Pods API; each change is still compared, the kubelet or "
        "the pod's controller is misbehaving"
    ]


# --- bounds on what a kubelet sends: the snapshot, a stream gone quiet (issue 36, items 11, 12, 15) ---


async def test_an_endless_snapshot_is_given_up_at_its_bound_said_once_and_tried_again_later(
    kubelet: FakeKubelet,
) -> None:
    # ADDED for ever, never INITIAL_SYNC_COMPLETE: buffered without a bound, this grew the agent
    # by 100 MiB in 40 s. Past the bound the watch is `capped` (pod-resources alone), warned once,
    # and read again on its backoff until the kubelet finishes its snapshots again.
    _api(kubelet).endless_snapshot()
    bounds = SnapshotBounds(pods=300, retry=Backoff(base=0.1, cap=0.2))
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path, bounds=bounds) as w:
            await w.until_state("capped")
            assert "sent more than 300 pods without INITIAL_SYNC_COMPLETE" in w.watch.detail
            assert "pod-resources alone" in w.watch.detail
            await w.until(lambda: w.states.count("capped") >= 3, "two tries more")
            assert len(w.watch.index) == 0 and w.batches == []  # nothing of it held, nothing told
            _api(kubelet).endless_snapshot(None)
            await w.until_state("watching")
            tries = w.watch.attempts - 1
            # Each given-up try read exactly one event past the bound, and nothing more.
            assert w.watch.events == tries * 301 + len(kubelet.node.pods) + 1
            assert len(w.watch.index) == len(kubelet.node.pods)
    assert [e for e in _warnings(logs) if "bounds" in e] == [
        "the Pods API's snapshot went past its bounds; the agent works from pod-resources alone for now"
    ]


async def test_a_snapshot_past_its_byte_bound_is_given_up(kubelet: FakeKubelet) -> None:
    _api(kubelet).endless_snapshot(pad=64 << 10)
    bounds = SnapshotBounds(bytes=1 << 20, retry=Backoff(base=60, cap=60))
    async with watching(_api(kubelet).socket_path, bounds=bounds) as w:
        await w.until_state("capped")
        assert f"sent more than {1 << 20} bytes of pods" in w.watch.detail
        assert w.watch.events == 16  # 15 pods of 64 KiB fit in 1 MiB, the 16th does not


async def test_a_trickled_snapshot_is_given_up_when_its_time_is_up(kubelet: FakeKubelet) -> None:
    # A pod every 0.1 s: each well within the stall deadline (5 s), so only the snapshot's own
    # time bound ends it; unbounded, the watch stayed `syncing` for ever.
    _api(kubelet).endless_snapshot(every=0.1)
    bounds = SnapshotBounds(seconds=1.0, retry=Backoff(base=60, cap=60))
    async with watching(_api(kubelet).socket_path, bounds=bounds) as w:
        await w.until_state("capped")
        assert "no INITIAL_SYNC_COMPLETE within 1 s" in w.watch.detail
        assert w.states == ["syncing", "capped"] and w.watch.events >= 3


async def test_a_stream_that_stops_delivering_is_caught_by_the_periodic_list(kubelet: FakeKubelet) -> None:
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path, resync_interval=0.3, catch_up=0.1) as w:
            await w.until_state("watching")
            assert len(w.batches) == 1  # the first snapshot
            _api(kubelet).stall()  # the stream stays open and says nothing more
            kubelet.update_pod("ml", "trainer-0", phase="Failed")
            await w.until(lambda: len(w.batches) == 2, "the missed change")
            ((change,), resync) = w.batches[1]
            assert resync is True and change.uid == _uid(kubelet, "ml", "trainer-0")
            assert change.before is not None and change.after is not None and change.after.phase == "Failed"
            # Then a fresh stream, whose snapshot agrees with what the check put in the index.
            await w.until(lambda: w.watch.connects == 2 and w.watch.state == "watching", "rewatch")
            assert len(w.changes) == len(kubelet.node.pods) + 1
            assert _api(kubelet).calls["ListPods"] >= 1
    missed = [e for e in logs if "missed" in str(e["event"])]
    assert [(e["log_level"], e["missed"]) for e in missed] == [("warning", 1)]


async def test_the_periodic_list_decodes_only_the_pods_whose_bytes_changed(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    node = FakeNode()
    for i in range(500):
        node.add_pod(FakePod("load", f"pod-{i:03}", [FakeContainer("main")], labels={"team": "t"}))
    kubelet = await start_kubelet(node, root=short_tmp, seed=2)
    async with watching(_api(kubelet).socket_path, resync_interval=0.05, catch_up=0.05) as w:
        await w.until_state("watching")
        stream = w.watch.stream
        check = stream.check
        assert check is not None
        decoded, checks = stream.decoded, check.checks
        await wait_until(lambda: check.checks >= checks + 3, what="three ListPods checks")
        assert stream.decoded == decoded  # 500 pods compared three times: hashed, none decoded
        _api(kubelet).stall()
        kubelet.update_pod("load", "pod-007", phase="Failed")
        await w.until(lambda: w.watch.connects == 2 and w.watch.state == "watching", "rewatch")
        # The changed pod once, by the check; the fresh snapshot's 500 pods were all known.
        assert stream.decoded == decoded + 1
        held = w.watch.index.get("load", "pod-007")
        assert held is not None and held.phase == "Failed"


async def test_changes_the_stream_delivers_late_are_not_missed_ones(kubelet: FakeKubelet) -> None:
    # Each change reaches the stream 50 ms after ListPods can show it: the check, listing every
    # 20 ms, sees many such differences, and each is the stream at work, not a miss.
    _api(kubelet).delay_broadcasts(0.05)
    phases = ("Pending", "Running")
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path, resync_interval=0.02, catch_up=0.5) as w:
            await w.until_state("watching")
            uid = _uid(kubelet, "ml", "trainer-0")

            def phase() -> str | None:
                held = w.watch.index.by_uid(uid)
                return held.phase if held is not None else None

            for i in range(12):
                kubelet.update_pod("ml", "trainer-0", phase=phases[i % 2])
                await w.until(lambda n=i: phase() == phases[n % 2], f"change {i}")
            check = w.watch.stream.check
            assert check is not None and check.checks > 0 and check.explained > 0  # they raced
            assert w.watch.connects == 1
    assert [e for e in logs if "missed" in str(e["event"])] == []


async def test_a_list_answer_that_is_not_protobuf_leaves_the_stream_live(kubelet: FakeKubelet) -> None:
    _api(kubelet).answer_garbage("ListPods")
    with capture_logs() as logs:
        async with watching(_api(kubelet).socket_path, resync_interval=0.02) as w:
            await w.until_state("watching")
            await wait_until(lambda: _api(kubelet).calls["ListPods"] >= 3, what="three ListPods")
            assert (w.watch.state, w.watch.connects) == ("watching", 1)
    failed = [e for e in logs if "could not list" in str(e["event"])]
    assert [e["log_level"] for e in failed] == ["info"] and "not protobuf" in str(failed[0]["error"])


def test_a_list_answer_is_walked_as_protobuf_parses_it() -> None:
    pods = [b"", b"x", b"y" * 127, b"z" * 128, bytes(range(256)) * 300]
    message = pods_pb2.ListPodsResponse(pods=pods).SerializeToString()
    # Fields a newer kubelet may add (a varint, fixed64, fixed32, another length-delimited one)
    # are stepped over, wherever they come.
    extra = b"\x10\x96\x01" + b"\x19" + bytes(8) + b"\x25" + bytes(4) + b"\x1a\x03abc"
    assert [bytes(v) for v in listed(extra + message + extra)] == pods
    with pytest.raises(errors.PodDecodeError):
        list(listed(message[:-1]))  # the last pod runs off the end


async def test_a_socket_that_refuses_the_agent_is_denied(kubelet: FakeKubelet, short_tmp: Path) -> None:
    """A non-root agent may not connect to the root-owned socket (mode 0600)."""
    socket = _api(kubelet).socket_path
    if os.geteuid() == 0:
        # As root nothing is denied: ask an unprivileged child, as on a node where the agent
        # forgot to run privileged. The directories stay searchable: the connect is what fails.
        short_tmp.chmod(0o755)
        socket.parent.chmod(0o755)
    socket.chmod(0o600)
    script = textwrap.dedent(
        f"""
        import asyncio, json, os
        from pathlib import Path
        from watcher.backoff import Backoff
        from watcher.sources.pods_api.watch import PodsWatch
        if os.geteuid() == 0:  # dropped only now: the interpreter itself lives under /root
            os.setgid(65534)
            os.setuid(65534)
        async def main():
            stop = asyncio.Event()
            states = []
            def on_state(state, detail):
                states.append(state)
                if state != "absent":
                    stop.set()
            watch = PodsWatch(Path({str(socket)!r}), labels=(), backoff=Backoff(), stop=stop,
                              on_changes=lambda c, r: None, on_state=on_state)
            await asyncio.wait_for(watch.run(), 10)
            print(json.dumps({{"states": states, "detail": watch.detail}}))
        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out.decode().splitlines()[-1])
    assert seen["states"] == ["denied"], seen
    assert seen["detail"].startswith(f"permission denied on {socket}") and "pods-api" in seen["detail"]


async def test_a_watch_that_never_sends_its_first_event_is_given_up_at_the_snapshots_time_bound(
    kubelet: FakeKubelet,
) -> None:
    # A kubelet that accepts the watch and then hangs before the first event: the deadline of a
    # snapshot counts from the connect, not from an event that never comes.
    _api(kubelet).muted()
    bounds = SnapshotBounds(seconds=1.0, retry=Backoff(base=60, cap=60))
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with watching(_api(kubelet).socket_path, bounds=bounds) as w:
        await w.until_state("capped")
        assert loop.time() - started < 4.0  # the watch's own 5 s stall deadline did not come first
        assert w.watch.events == 0
