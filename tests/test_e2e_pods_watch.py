"""The agent's Pods API watch against upstream's server, in kubelet-lite (`[lite]`) and in upstream's
whole kubelet on a Node of a real API server (`[upstream]`), and the fake kubelet (`[fake]`) alike:
the first snapshot reports nothing, an admitted pod is read with pod-resources Get and reported once
with its uid, its removal once, a kubelet restart only as kubelet.restarted with the watch live
again; and the watch itself, dropped by upstream's broadcaster for reading slowly, re-diffs a fresh
snapshot with nothing lost and nothing twice (kubelet-lite only: it needs its control socket).

The upstream kubelet takes a pod's uid from the API server, not from the test: the tests name the
uid a kubelet knows a pod by through `KubeletDriver.uid`, never by the `uid=` they asked for."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.changes import Changes
from testkit.kubelet_driver import FakeDriver, KubeletDriver, LiteDriver
from testkit.kubelet_lite import KubeletLite
from testkit.peers import peer
from testkit.real_driver import RealDriver
from testkit.real_node import RealNode
from watcher.backoff import Backoff
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sources.pods_api.watch import PodChange, PodsWatch

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}


@pytest.fixture(params=["lite", "upstream", "fake"])
async def kubelet(request: pytest.FixtureRequest, short_tmp: Path) -> AsyncIterator[KubeletDriver]:
    """kubelet-lite with one device plugin ([lite]), the upstream kubelet with the same plugin
    ([upstream]), or the fake kubelet serving the same devices ([fake])."""
    root = short_tmp / "kubelet"
    if request.param == "lite":
        async with KubeletLite(peer("kubelet-lite"), peer("device-plugin"), root) as lite:
            yield await LiteDriver.create(lite, GPU, GPUS)
        return
    if request.param == "upstream":
        cluster = request.getfixturevalue("kube_cluster")
        async with RealNode(cluster, short_tmp / "node", f"node-{uuid.uuid4().hex[:8]}") as node:
            yield await RealDriver.create(node, GPU, GPUS)
        return
    async with FakeKubelet(root, FakeDriver.node(GPU, GPUS, 4), seed=11) as fake:
        yield FakeDriver(fake, GPU)


@asynccontextmanager
async def _agent(short_tmp: Path, kubelet: KubeletDriver, **overrides: object) -> AsyncIterator[AgentRun]:
    """The agent with the Pods API (on by default), past its first look with the watch live. Only
    the watch tells of pod changes: no state-file triggers, the timer an hour away."""
    settings = make_settings(
        short_tmp, kubelet_root=kubelet.root, state_file_triggers=False, interval=3600.0, **overrides
    )
    async with agent_against(settings) as run:
        await run.recorder.until(lambda: "watcher.started" in run.recorder.kinds())
        await _live(run)
        await run.released()
        yield run


async def _live(run: AgentRun, timeout: float = 15.0) -> None:
    """Until the agent's Pods API watch is live (its state changes wake the wait: testkit.agent)."""
    watch = run.agent.pods_watch
    assert watch is not None
    await run.recorder.until(lambda: watch.state == "watching", timeout)


def _warnings(logs: Sequence[MutableMapping[str, Any]]) -> list[str]:
    return [str(entry["event"]) for entry in logs if entry["log_level"] in ("warning", "error")]


async def test_the_first_snapshot_reports_nothing_beyond_started(
    kubelet: KubeletDriver, short_tmp: Path
) -> None:
    held = await kubelet.admit("ml", "trainer", {"main": {GPU: 2}}, uid="uid-trainer")
    async with _agent(short_tmp, kubelet) as run:
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started"]
        watch = run.agent.pods_watch
        assert watch is not None
        meta = watch.index.by_uid(await kubelet.uid("ml", "trainer"))
        assert meta is not None and (meta.namespace, meta.name, meta.phase) == ("ml", "trainer", "Running")
        assert run.agent.inventory is not None
        (pod,) = run.agent.inventory.pods
        assert (
            sorted(d.id for c in pod.containers for d in c.devices if d.resource == GPU) == held["main"][GPU]
        )


async def test_an_admitted_pod_is_read_with_get_and_reported_once_and_its_removal_once(
    kubelet: KubeletDriver, short_tmp: Path
) -> None:
    async with _agent(short_tmp, kubelet) as run:
        mark, cycles = len(run.recorder.events), len(run.recorder.reasons)
        held = await kubelet.admit("ml", "llm-1", {"main": {GPU: 2}}, uid="uid-llm-1")
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        uid = await kubelet.uid("ml", "llm-1")
        assert (added.details["pod"], added.details["pod_uid"]) == ("llm-1", uid)
        assert added.details["devices"] == {GPU: held["main"][GPU]}
        assert any("pods-api" in r for r in run.recorder.reasons[cycles:])
        await run.quiet_cycle()  # a whole List agrees with what Get built
        assert run.recorder.kinds(mark) == ["allocation.added", "capacity.changed"]

        mark, cycles = len(run.recorder.events), len(run.recorder.reasons)
        await kubelet.remove("ml", "llm-1")
        assert await run.recorder.kinds_after(mark, 2) == ["allocation.removed", "capacity.changed"]
        # The DELETED pod left the watch's index before the cycle: the event names it by
        # namespace and name only, as pod-resources does.
        assert run.recorder.events[mark].details["pod"] == "llm-1"
        assert any("pods-api" in r for r in run.recorder.reasons[cycles:])
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.removed", "capacity.changed"]


async def test_a_kubelet_restart_gives_only_kubelet_restarted_and_the_watch_goes_back_to_watching(
    kubelet: KubeletDriver, short_tmp: Path
) -> None:
    await kubelet.admit("ml", "kept", {"main": {GPU: 1}}, uid="uid-kept")
    async with _agent(short_tmp, kubelet, poll_interval=0.05) as run:
        watch = run.agent.pods_watch
        assert watch is not None
        mark, connects = len(run.recorder.events), watch.connects
        with capture_logs() as logs:
            await kubelet.restart()
            await run.recorder.until(lambda: watch.connects > connects and watch.state == "watching", 15)
            await run.recorder.until(lambda: "kubelet.restarted" in run.recorder.kinds(mark), 15)
            await run.released()
        kinds = [k for k in run.recorder.kinds(mark) if not k.startswith("plugin.")]
        assert kinds == ["kubelet.restarted"]
        assert watch.index.by_uid(await kubelet.uid("ml", "kept")) is not None
        # A kubelet that stops is not a watch that fell behind: no warning says it was dropped.
        assert [w for w in _warnings(logs) if "dropped" in w] == []


# -- the watch alone: a slow reader dropped by upstream's broadcaster --


class _Watched:
    """PodsWatch on a socket, recording every change and state."""

    def __init__(self, path: Path, on_batch: Callable[[], None] = lambda: None) -> None:
        self.stop = asyncio.Event()
        self.seen = Changes()
        self.batches: list[tuple[list[PodChange], bool]] = []
        self.states: list[str] = []
        self.on_batch = on_batch
        self.watch = PodsWatch(
            path,
            labels=(),
            backoff=Backoff(base=0.02, cap=0.2),
            stop=self.stop,
            on_changes=self._changes,
            on_state=self._state,
        )

    def _state(self, state: str, _detail: str) -> None:
        self.states.append(state)
        self.seen.notify()

    def _changes(self, changes: Sequence[PodChange], resync: bool) -> None:
        self.batches.append((list(changes), resync))
        self.seen.notify()
        self.on_batch()

    async def until(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        await self.seen.until(
            predicate, timeout, describe=lambda: f"states {self.states}, {len(self.batches)} batches"
        )


def _control(control: Path, method: str, path: str, spec: object = None) -> None:
    """One request to kubelet-lite's control socket from a thread (the event loop is held)."""
    body = b"" if spec is None else json.dumps(spec).encode()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(15)
        conn.connect(str(control))
        head = f"{method} {path} HTTP/1.0\r\nHost: kubelet-lite\r\nContent-Length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    assert reply.split(b" ", 2)[1] == b"200", reply[:200]


async def test_a_slow_watch_dropped_by_upstream_re_diffs_nothing_lost_nothing_twice(
    kubelet_lite: KubeletLite,
) -> None:
    """Upstream drops a watcher 100 events behind (RESOURCE_EXHAUSTED "watch client channel
    closed"). The watch's loop is held in its callback while a thread changes the pods, as a reader
    stuck behind a busy loop would be: pods of 1 MB each (admitted and removed at once, to keep
    kubelet-lite's pods file small) fill what the transport holds (about 5 MB here), then 110
    small pods' DELETED events fill the watcher's channel. The watch must then reconnect, warn once,
    and report each pod's change exactly once."""
    small = [f"small-{i:03d}" for i in range(110)]
    late = [f"late-{i}" for i in range(3)]
    huge = [{"name": "c-" + "x" * 1_000_000, "resources": {}}]
    release = threading.Event()
    holding = {"first": True}

    def hold_the_loop() -> None:
        if holding.pop("first", False):  # the first snapshot's batch: now read nothing meanwhile
            threading.Thread(target=change_pods, daemon=True).start()
            if not release.wait(60):
                raise AssertionError("the pods did not change in time")

    def change_pods() -> None:
        control = kubelet_lite.control_socket
        try:
            for i in range(12):
                _control(
                    control,
                    "POST",
                    "/pods",
                    {"namespace": "big", "name": f"big-{i}", "uid": f"u-big-{i}", "containers": huge},
                )
                _control(control, "DELETE", f"/pods/big/big-{i}")
            for name in small:
                _control(control, "DELETE", f"/pods/flood/{name}")
            for name in late:
                spec = {
                    "namespace": "flood",
                    "name": name,
                    "uid": f"u-{name}",
                    "containers": [{"name": "main"}],
                }
                _control(control, "POST", "/pods", spec)
        finally:
            release.set()

    for name in small:
        await kubelet_lite.admit("flood", name, {"main": {}}, uid=f"u-{name}")
    w = _Watched(kubelet_lite.pods_api_socket, hold_the_loop)
    task = asyncio.create_task(w.watch.run())
    try:
        with capture_logs() as logs:
            await w.until(
                lambda: w.watch.state == "watching" and {m.name for m in w.watch.index} == set(late)
            )
    finally:
        w.stop.set()
        await asyncio.wait_for(task, 10)
    assert w.watch.connects == 2
    assert [x for x in _warnings(logs) if "dropped" in x] == [
        "the kubelet dropped the Pods API watch; reconnecting for a fresh snapshot"
    ]
    changes = [c for batch, _ in w.batches[1:] for c in batch if not c.uid.startswith("u-big-")]
    assert sorted(c.uid for c in changes if c.after is None) == sorted(f"u-{n}" for n in small)  # once each
    assert sorted(c.uid for c in changes if c.before is None) == sorted(f"u-{n}" for n in late)
    assert any(resync for _, resync in w.batches[1:])  # what the drop cut off came by the re-diff


async def test_a_pod_recreated_under_its_name_is_one_removal_and_one_addition(
    kubelet: KubeletDriver, short_tmp: Path
) -> None:
    """Issue 36 item 9 on upstream's Pods API server: a StatefulSet's pod deleted and created again
    under its name, a new uid: the old pod's removal once, the new pod's addition once, named by
    its own uid; no removal of what the new pod holds."""
    await kubelet.admit("ml", "db-0", {"main": {GPU: 1}}, uid="uid-db-0-old")
    old_uid = await kubelet.uid("ml", "db-0")
    async with _agent(short_tmp, kubelet) as run:
        mark = len(run.recorder.events)
        await kubelet.remove("ml", "db-0")
        held = await kubelet.admit("ml", "db-0", {"main": {GPU: 1}}, uid="uid-db-0-new")
        new_uid = await kubelet.uid("ml", "db-0")
        assert new_uid != old_uid
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark), 15)
        await run.quiet_cycle()
        events = run.recorder.events[mark:]
        kinds = sorted(str(e.kind) for e in events)
        assert kinds == ["allocation.added", "allocation.removed", "capacity.changed", "capacity.changed"], (
            kinds
        )
        (added,) = [e for e in events if e.kind == "allocation.added"]
        assert added.details["pod_uid"] == new_uid and added.details["devices"] == {GPU: held["main"][GPU]}
        (removed,) = [e for e in events if e.kind == "allocation.removed"]
        assert removed.details.get("pod_uid") in (None, old_uid)
