"""The fake kubelet (watcher.sim) against the real ones: kubelet-lite ([lite]: upstream's device
manager and pod-resources server) and upstream's whole kubelet on a Node of a real API server
([upstream], peers/cmd/kubelet), each with our device-plugin peer. The same scenario
(`testkit.parity_scenario`) is played on the fake and on each real one through
`testkit.kubelet_driver` / `testkit.real_driver`, with the agent watching each, compared step by
step. After every step the agent's decoded answers (List and GetAllocatableResources) are equal,
so are its events (kind, severity and what they name), and the watched files each kubelet created,
replaced or deleted are the ones in this table (the agent re-queries on them; `<plugin>.sock` is
the plugin's own socket, whose name is the plugin's choice):

| step | upstream kubelet | kubelet-lite | fake kubelet |
|---|---|---|---|
| admit a pod with devices | checkpoint, dra | checkpoint | checkpoint, dra |
| admit a pod without devices | dra | nothing | dra (was: nothing) |
| a device unhealthy, healthy | checkpoint | checkpoint | checkpoint |
| hot-plug, unplug a device | checkpoint | checkpoint | checkpoint |
| remove a pod | dra | nothing | checkpoint (kept: `free()`), dra |
| kubelet restart | socket, checkpoint, registration, plugin | the same | socket, checkpoint, plugin (kept) |
| plugin stops | plugin deleted | plugin deleted | plugin deleted |
| plugin starts | plugin created, checkpoint | the same | plugin created, checkpoint |

(socket: `pod-resources/kubelet.sock`; checkpoint: `device-plugins/kubelet_internal_checkpoint`;
registration: `device-plugins/kubelet.sock`; plugin: `<plugin>.sock` there; dra:
`dra_manager_state`, which the upstream kubelet's DRA manager rewrites when it prepares a pod (its
sandbox made) and when it unprepares it (its containers gone), claims or not; kubelet-lite runs no
DRA manager, and the fake, which never wrote it, now writes it as upstream does. cpu, memory:
`cpu_manager_state`, `memory_manager_state`: upstream writes them at its first start only (the
`none` policies), kubelet-lite not at all, the fake only when their content changes.)

The fake's node has the CPUs the real kubelet reports allocatable: kubelet-lite's stand-in reports
its --cpus, the upstream kubelet (CPU manager policy `none`) reports none.

Kept: `free()` rewrites the checkpoint (the real device manager frees a pod's devices in memory
and writes nothing; tests and the demo rely on the trigger); the fake serves no registration
socket `device-plugins/kubelet.sock`, its plugin sockets are plain files, and on start it
deletes every socket and also every `*.sock` by name (its own plugin sockets are plain files),
where the kubelet deletes sockets only, by type (tests of the fake list that directory
exactly). The real temporary names (the pod-resources socket's and the state files') are
upstream's and the fake now makes the same; see the tests below. Differences of the fake from
the upstream kubelet beyond these steps are in tests/test_e2e_fake_parity.py (KEPT_DIFFERENCES).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from testkit.inotify_names import NameEvents
from testkit.kubelet_driver import FakeDriver, KubeletDriver, LiteDriver
from testkit.kubelet_lite import KubeletLite
from testkit.kubelet_observations import SERVICE, call, inventory, pod_digest
from testkit.parity_scenario import GPU, GPUS, SCENARIO, play_scenario
from testkit.peers import peer
from testkit.real_driver import RealDriver
from testkit.real_node import RealNode
from watcher.kubeletapi.v1 import api_pb2
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_plugins import Warmup

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(params=["lite", "upstream"])
async def real_driver(request: pytest.FixtureRequest, short_tmp: Path) -> AsyncIterator[KubeletDriver]:
    """kubelet-lite ([lite]) or upstream's whole kubelet on a Node of the session's API server
    ([upstream]), one device plugin serving GPUS."""
    if request.param == "lite":
        async with KubeletLite(peer("kubelet-lite"), peer("device-plugin"), short_tmp / "kubelet") as lite:
            yield await LiteDriver.create(lite, GPU, GPUS)
        return
    cluster = request.getfixturevalue("kube_cluster")
    async with RealNode(cluster, short_tmp / "node", f"node-{uuid.uuid4().hex[:8]}") as node:
        yield await RealDriver.create(node, GPU, GPUS)


@pytest.fixture
async def fake_driver(real_driver: KubeletDriver, short_tmp: Path) -> AsyncIterator[FakeDriver]:
    """The fake on a node like the real one's: GPUS, and the CPUs the real one reports allocatable
    (kubelet-lite's stand-in reports its --cpus, the upstream kubelet's `none` CPU policy none);
    its plugin back a moment after a start."""
    cpus = len((await inventory(real_driver.socket_path)).cpu_ids)
    node = FakeDriver.node(GPU, GPUS, cpus)
    fake = FakeKubelet(short_tmp / "fake" / "kubelet", node, warmup=Warmup(plugin_delay=(0.1, 0.3)))
    async with fake:
        await fake.plugins.wait_settled()
        yield FakeDriver(fake, GPU)


@pytest.mark.timeout(180)
async def test_one_scenario_shows_the_same_answers_events_and_files_on_both_kubelets(
    real_driver: KubeletDriver, fake_driver: FakeDriver, short_tmp: Path
) -> None:
    real = await play_scenario(real_driver, short_tmp / "real-agent")
    fake = await play_scenario(fake_driver, short_tmp / "fake-agent")
    wrong = []
    for play, r, f in zip(SCENARIO, real, fake, strict=True):
        if r.inventory != f.inventory:
            wrong.append(f"{play.name}: the answers differ: {r.inventory} != {f.inventory}")
        if r.events != f.events or [kind for kind, _, _ in r.events] != play.kinds:
            wrong.append(f"{play.name}: the agent's events: {r.events} (fake {f.events})")
        if (r.files, f.files) != (play.files(real_driver.name), play.files("fake")):
            wrong.append(f"{play.name}: files {r.files} (fake {f.files})")
    assert wrong == []
    # The outcome is the agent's view of a real node, not two empty answers that agree.
    (removed,) = (e for e in real[2].events if e[0] == "device.removed")
    assert removed == (
        "device.removed",
        "critical",
        {"resource": GPU, "device": "gpu0", "numa": [0], "allocated_to": ["ml/a/main"]},
    )
    last = real[-1].inventory
    assert {(p.namespace, p.name) for p in last.pods} == {("ml", "c"), ("ml", "d")}
    assert {d.id for d in last.devices} == {"gpu0", "gpu1", "gpu3", "gpu4"}


async def test_get_of_a_known_and_an_unknown_pod_answers_alike(
    real_driver: KubeletDriver, fake_driver: FakeDriver
) -> None:
    known = api_pb2.GetPodResourcesRequest(pod_namespace="ml", pod_name="g").SerializeToString()
    unknown = api_pb2.GetPodResourcesRequest(pod_namespace="nowhere", pod_name="ghost").SerializeToString()
    answers = []
    for driver in (real_driver, fake_driver):
        await driver.admit("ml", "g", {"main": {GPU: 1}, "side": {}})
        got = api_pb2.GetPodResourcesResponse.FromString(await call(driver.socket_path, "Get", known))
        with pytest.raises(aio.AioRpcError) as caught:
            await call(driver.socket_path, "Get", unknown)
        answers.append((pod_digest(got.pod_resources), caught.value.code(), caught.value.details()))
    real, fake = answers
    assert real == (
        (
            "ml",
            "g",
            {
                "main": {"devices": [(GPU, "gpu0", (0,))], "cpu_ids": [], "memory": [], "claims": 0},
                "side": {"devices": [], "cpu_ids": [], "memory": [], "claims": 0},
            },
        ),
        grpc.StatusCode.UNKNOWN,
        "pod ghost in namespace nowhere not found",
    )
    assert fake == real


async def test_the_rate_limiters_reject_a_burst_alike(
    real_driver: KubeletDriver, fake_driver: FakeDriver
) -> None:
    async def burst(socket_path: Path) -> tuple[int, set[tuple[grpc.StatusCode, str]]]:
        async with aio.insecure_channel(f"unix:{socket_path}") as channel:
            method: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + "List")
            results = await asyncio.gather(
                *(method(b"", timeout=5) for _ in range(40)), return_exceptions=True
            )
        errors = [r for r in results if isinstance(r, aio.AioRpcError)]
        return len(results) - len(errors), {(e.code(), e.details() or "") for e in errors}

    real = await burst(real_driver.socket_path)
    fake = await burst(fake_driver.socket_path)
    assert real[1] == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")}
    assert fake[1] == real[1]
    # Burst 10 answered at once; a few more as the bucket refills at 100/s while the burst lands.
    assert 10 <= real[0] < 40 and 10 <= fake[0] < 40


def _listener_events(events: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], set[str]]:
    """The events with each temporary name as <tmp>, and those names."""
    temporary = {name for _, name in events if name != "kubelet.sock"}
    return [(kind, "<tmp>" if name in temporary else name) for kind, name in events], temporary


async def test_a_restart_replaces_the_socket_alike_through_a_temporary_name(
    real_driver: KubeletDriver, fake_driver: FakeDriver
) -> None:
    """Upstream's CreateListener: unlink, a name from os.CreateTemp (digits), created and removed,
    listened on, renamed into place; a new file of one mode."""
    seen = []
    for driver in (real_driver, fake_driver):
        before = os.stat(driver.socket_path)
        with NameEvents(driver.socket_path.parent) as watch:
            await driver.restart()
            events = watch.events()
        after = os.stat(driver.socket_path)
        assert stat.S_ISSOCK(after.st_mode)
        assert (before.st_ino, before.st_mtime_ns) != (after.st_ino, after.st_mtime_ns)
        shape, temporary = _listener_events(events)
        assert temporary and all(name.isdigit() for name in temporary), temporary
        seen.append((shape, stat.S_IMODE(after.st_mode)))
    real, fake = seen
    assert real[0] == [
        ("deleted", "kubelet.sock"),
        ("created", "<tmp>"),
        ("deleted", "<tmp>"),
        ("created", "<tmp>"),
        ("moved-from", "<tmp>"),
        ("moved-to", "kubelet.sock"),
    ]
    assert fake == real


async def test_the_checkpoint_is_rewritten_alike_through_a_temporary_name(
    real_driver: KubeletDriver, fake_driver: FakeDriver
) -> None:
    """The kubelet's file store: a "." + digits file beside it (mode 0600), renamed over it."""
    seen = []
    for driver in (real_driver, fake_driver):
        directory = driver.root / "device-plugins"
        with NameEvents(directory) as watch:
            await driver.set_healthy("gpu3", False)
            # The real kubelet answers with the new health before its checkpoint's rename is done.
            renamed = await watch.until(lambda seen: ("moved-to", "kubelet_internal_checkpoint") in seen)
            events = [(k, n) for k, n in renamed if not n.endswith(".sock")]
        temporary = {name for _, name in events if name != "kubelet_internal_checkpoint"}
        assert temporary and all(n.startswith(".") and n[1:].isdigit() for n in temporary), temporary
        shape = [(k, "<tmp>" if n in temporary else n) for k, n in events]
        seen.append((shape, stat.S_IMODE(os.stat(directory / "kubelet_internal_checkpoint").st_mode)))
    real, fake = seen
    assert real == (
        [("created", "<tmp>"), ("moved-from", "<tmp>"), ("moved-to", "kubelet_internal_checkpoint")],
        0o600,
    )
    assert fake == real


async def test_a_kubelet_start_deletes_the_sockets_in_the_plugin_directory(
    real_driver: KubeletDriver, fake_driver: FakeDriver
) -> None:
    """Every socket goes, whatever its name (a plugin's, a stray one); a plain file stays with
    the real kubelet. Kept difference: the fake also deletes by name, so a plain `*.sock` goes too."""
    survivors = []
    for driver in (real_driver, fake_driver):
        directory = driver.root / "device-plugins"
        for name in ("stray.sock", "bare-socket"):
            with socket.socket(socket.AF_UNIX) as planted:
                planted.bind(str(directory / name))
        (directory / "notes.sock").write_text("not a socket\n")
        (directory / "notes.txt").write_text("not a socket\n")
        await driver.restart()
        left = {p.name for p in directory.iterdir()}
        assert driver.plugin_socket in left  # the plugin served a new one and registered again
        survivors.append(left & {"stray.sock", "bare-socket", "notes.sock", "notes.txt"})
    real, fake = survivors
    assert real == {"notes.sock", "notes.txt"}
    assert fake == {"notes.txt"}
