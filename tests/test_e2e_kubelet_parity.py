"""The fake kubelet (watcher.sim) against the real one (kubelet-lite: upstream's device manager and
pod-resources server, with our device-plugin peer): the same scenario played on both through
`testkit.kubelet_driver`, with the agent watching each, compared step by step. After every step
the agent's decoded answers (List and GetAllocatableResources) are equal, so are its events
(kind, severity and what they name), and the watched files each kubelet created, replaced or
deleted are the ones in this table (the agent re-queries on them; `<plugin>.sock` is the
plugin's own socket, whose name is the plugin's choice):

| step | real kubelet rewrites | fake kubelet rewrites |
|---|---|---|
| admit a pod with devices | checkpoint | checkpoint |
| admit a pod without devices | nothing | nothing (was: checkpoint) |
| a device unhealthy, healthy | checkpoint | checkpoint |
| hot-plug, unplug a device | checkpoint | checkpoint |
| remove a pod | nothing | checkpoint (kept: `free()`) |
| kubelet restart | socket, checkpoint, registration, plugin | socket, checkpoint, plugin (kept) |
| plugin stops | plugin deleted | plugin deleted |
| plugin starts | plugin created, checkpoint | plugin created, checkpoint |

(socket: `pod-resources/kubelet.sock`; checkpoint: `device-plugins/kubelet_internal_checkpoint`;
registration: `device-plugins/kubelet.sock`; plugin: `<plugin>.sock` there; cpu, memory:
`cpu_manager_state`, `memory_manager_state`, which kubelet-lite does not serve. The fake
rewrote both at every step above that rewrites anything; it now rewrites each only when its
content changes, as the CPU and memory managers take no part in a device step.)

Kept: `free()` rewrites the checkpoint (the real device manager frees a pod's devices in memory
and writes nothing; tests and the demo rely on the trigger); the fake serves no registration
socket `device-plugins/kubelet.sock`, its plugin sockets are plain files, and on start it
deletes every socket and also every `*.sock` by name (its own plugin sockets are plain files),
where the kubelet deletes sockets only, by type (tests of the fake list that directory exactly).
The real temporary names (the pod-resources socket's and the state files') are upstream's and
the fake now makes the same; see the tests below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc import aio

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.inotify_names import NameEvents
from testkit.kubelet_driver import FakeDriver, KubeletDriver, LiteDriver
from testkit.kubelet_lite import KubeletLite
from testkit.kubelet_observations import (
    SERVICE,
    call,
    event_digest,
    file_changes,
    file_marks,
    inventory,
    pod_digest,
)
from testkit.waiting import wait_until
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.inventory import Inventory
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_plugins import Warmup

pytestmark = pytest.mark.e2e

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}
CPUS = 4  # kubelet-lite's default --cpus
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
PLUGIN = "device-plugins/<plugin>.sock"
REGISTRATION = "device-plugins/kubelet.sock"
SOCKET = "pod-resources/kubelet.sock"
R = "replaced"

Action = Callable[[KubeletDriver], Awaitable[object]]


@dataclasses.dataclass(frozen=True)
class Play:
    """One step of the scenario and what it must show: the agent's event kinds (both kubelets)
    and the files each kubelet rewrote (real, fake)."""

    name: str
    action: Action
    kinds: list[str]
    real_files: dict[str, str]
    fake_files: dict[str, str]
    awaited: str = ""  # an event the step waits for (it comes from a watch, not the forced look)
    held: bool = False  # the agent holds the step's outcome back (a departed plugin's devices)


CAPACITY = "capacity.changed"
SCENARIO = [
    Play(
        "admit ml/a, 2 GPUs",
        lambda d: d.admit("ml", "a", {"main": {GPU: 2}}),
        ["allocation.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "admit ml/b, 1 GPU and a container without",
        lambda d: d.admit("ml", "b", {"main": {GPU: 1}, "side": {}}),
        ["allocation.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "gpu0 (held by ml/a) unhealthy",
        lambda d: d.set_healthy("gpu0", False),
        ["device.removed", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "gpu0 healthy again",
        lambda d: d.set_healthy("gpu0", True),
        ["device.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "hot-plug gpu4",
        lambda d: d.hot_plug("gpu4", (1,)),
        ["device.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "unplug gpu2 (held by ml/b)",
        lambda d: d.unplug("gpu2"),
        ["device.removed", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play(
        "remove ml/a",  # kept difference: the fake's free() rewrites the checkpoint
        lambda d: d.remove("ml", "a"),
        ["allocation.removed", CAPACITY],
        {},
        {CHECKPOINT: R},
    ),
    Play(
        "kubelet restart",  # kept difference: the fake has no registration socket
        lambda d: d.restart(),
        ["kubelet.restarted"],
        {SOCKET: R, CHECKPOINT: R, REGISTRATION: R, PLUGIN: R},
        {SOCKET: R, CHECKPOINT: R, PLUGIN: R},
        awaited="kubelet.restarted",
    ),
    Play(
        "plugin stops",
        lambda d: d.stop_plugin(),
        ["plugin.unregistered"],
        {PLUGIN: "deleted"},
        {PLUGIN: "deleted"},
        awaited="plugin.unregistered",
        held=True,
    ),
    Play(
        "plugin starts",
        lambda d: d.start_plugin(),
        ["plugin.registered"],
        {PLUGIN: "created", CHECKPOINT: R},
        {PLUGIN: "created", CHECKPOINT: R},
        awaited="plugin.registered",
    ),
    Play(
        "admit ml/c, 1 GPU",
        lambda d: d.admit("ml", "c", {"main": {GPU: 1}}),
        ["allocation.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R},
    ),
    Play("admit ml/d, no devices", lambda d: d.admit("ml", "d", {"main": {}}), [], {}, {}),
    Play(
        "remove ml/b",  # kept difference: free()
        lambda d: d.remove("ml", "b"),
        ["allocation.removed", CAPACITY],
        {},
        {CHECKPOINT: R},
    ),
]


@dataclasses.dataclass
class Seen:
    inventory: Inventory
    files: dict[str, str]
    events: list[tuple[str, str, dict[str, object]]]


async def _caught_up(run: AgentRun, socket_path: Path, step: str) -> Inventory:
    """The kubelet's answers, once the agent holds the same. The test's own calls share the
    kubelet's limiter with the agent, so the agent's look after a step can be refused; it looks
    again later (its back-off), and a forced look now brings that about."""
    for _ in range(20):
        answers = await inventory(socket_path)
        if run.agent.inventory == answers:
            return answers
        await run.quiet_cycle()
    raise AssertionError(f"{step}: the agent holds {run.agent.inventory}, the kubelet answers {answers}")


async def _play(driver: KubeletDriver, state: Path) -> list[Seen]:
    """SCENARIO on `driver` with the agent watching; what each step showed."""
    seen: list[Seen] = []
    plugin = f"device-plugins/{driver.plugin_socket}"
    async with agent_against(make_settings(state, kubelet_root=driver.root)) as run:
        await run.recorder.until(lambda: "watcher.started" in run.recorder.kinds())
        await run.released()
        for play in SCENARIO:
            mark = len(run.recorder.events)
            before = file_marks(driver.root)
            await play.action(driver)
            if play.awaited:
                await run.recorder.until(
                    lambda a=play.awaited, m=mark: a in run.recorder.kinds(m), timeout=30
                )
            # A departed plugin's devices are held back for a minute (not reported missing): one
            # more look then, not the end of the hold.
            await (run.quiet_cycle() if play.held else run.released())
            if play.held:  # the agent keeps the devices it holds back: its awaited event is the look
                answers = await inventory(driver.socket_path)
            else:
                answers = await _caught_up(run, driver.socket_path, play.name)
            files = file_changes(before, file_marks(driver.root))
            files = {PLUGIN if name == plugin else name: what for name, what in files.items()}
            events = event_digest(run.recorder.events[mark:])
            seen.append(Seen(answers, files, events))
    return seen


@pytest.fixture
async def fake_driver(short_tmp: Path) -> AsyncIterator[FakeDriver]:
    """The fake on a node like kubelet-lite's with GPUS, its plugin back a moment after a start."""
    node = FakeDriver.node(GPU, GPUS, CPUS)
    fake = FakeKubelet(short_tmp / "fake" / "kubelet", node, warmup=Warmup(plugin_delay=(0.1, 0.3)))
    async with fake:
        await fake.plugins.wait_settled()
        yield FakeDriver(fake, GPU)


@pytest.fixture
async def real_driver(kubelet_lite: KubeletLite) -> LiteDriver:
    return await LiteDriver.create(kubelet_lite, GPU, GPUS)


@pytest.mark.timeout(120)
async def test_one_scenario_shows_the_same_answers_events_and_files_on_both_kubelets(
    real_driver: LiteDriver, fake_driver: FakeDriver, short_tmp: Path
) -> None:
    real = await _play(real_driver, short_tmp / "real-agent")
    fake = await _play(fake_driver, short_tmp / "fake-agent")
    for play, r, f in zip(SCENARIO, real, fake, strict=True):
        assert r.inventory == f.inventory, f"{play.name}: the answers differ"
        assert r.events == f.events, f"{play.name}: the agent's events differ"
        assert [kind for kind, _, _ in r.events] == play.kinds, play.name
        assert (r.files, f.files) == (play.real_files, play.fake_files), f"{play.name}: files"
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
    real_driver: LiteDriver, fake_driver: FakeDriver
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
    real_driver: LiteDriver, fake_driver: FakeDriver
) -> None:
    async def burst(socket_path: Path) -> tuple[int, set[tuple[grpc.StatusCode, str]]]:
        async with aio.insecure_channel(f"unix:{socket_path}") as channel:
            method = channel.unary_unary(SERVICE + "List")
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
    real_driver: LiteDriver, fake_driver: FakeDriver
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
    real_driver: LiteDriver, fake_driver: FakeDriver
) -> None:
    """The kubelet's file store: a "." + digits file beside it (mode 0600), renamed over it."""
    seen = []
    for driver in (real_driver, fake_driver):
        directory = driver.root / "device-plugins"
        with NameEvents(directory) as watch:
            await driver.set_healthy("gpu3", False)
            # The device manager updates its healthy set before it writes the checkpoint: the
            # answer can show the change while the rename is still to come.
            await wait_until(
                lambda: ("moved-to", "kubelet_internal_checkpoint") in watch.events(),
                timeout=5,
                what="checkpoint renamed",
            )
            events = [(k, n) for k, n in watch.events() if not n.endswith(".sock")]
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
    real_driver: LiteDriver, fake_driver: FakeDriver
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
