"""One scenario for a kubelet driver (`testkit.kubelet_driver`): devices, pods, a kubelet restart and
a plugin's departure and return, played with the agent watching, and what each step showed (the
agent's decoded answers, its events, the watched files the kubelet rewrote). What each kubelet
must show is in `Play`; tests/test_e2e_kubelet_parity.py compares the kubelets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.kubelet_driver import KubeletDriver
from testkit.kubelet_observations import event_digest, file_changes, file_marks, inventory
from watcher.model.inventory import Inventory

__all__ = ["GPU", "GPUS", "SCENARIO", "Play", "Seen", "play_scenario"]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (0,), "gpu2": (1,), "gpu3": (1,)}
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
PLUGIN = "device-plugins/<plugin>.sock"
REGISTRATION = "device-plugins/kubelet.sock"
SOCKET = "pod-resources/kubelet.sock"
DRA = "dra_manager_state"
R = "replaced"

Action = Callable[[KubeletDriver], Awaitable[object]]


@dataclasses.dataclass(frozen=True)
class Play:
    """One step of the scenario and what it must show: the agent's event kinds (every kubelet)
    and the files each kubelet rewrote (lite, fake; upstream's where they differ from lite's)."""

    name: str
    action: Action
    kinds: list[str]
    lite_files: dict[str, str]
    fake_files: dict[str, str]
    awaited: str = ""  # an event the step waits for (it comes from a watch, not the forced look)
    held: bool = False  # the agent holds the step's outcome back (a departed plugin's devices)
    upstream_files: dict[str, str] | None = None

    def files(self, kubelet: str) -> dict[str, str]:
        if kubelet == "fake":
            return self.fake_files
        if kubelet == "upstream" and self.upstream_files is not None:
            return self.upstream_files
        return self.lite_files


CAPACITY = "capacity.changed"
SCENARIO = [
    Play(
        "admit ml/a, 2 GPUs",
        lambda d: d.admit("ml", "a", {"main": {GPU: 2}}),
        ["allocation.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R, DRA: R},
        upstream_files={CHECKPOINT: R, DRA: R},
    ),
    Play(
        "admit ml/b, 1 GPU and a container without",
        lambda d: d.admit("ml", "b", {"main": {GPU: 1}, "side": {}}),
        ["allocation.added", CAPACITY],
        {CHECKPOINT: R},
        {CHECKPOINT: R, DRA: R},
        upstream_files={CHECKPOINT: R, DRA: R},
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
        {CHECKPOINT: R, DRA: R},
        upstream_files={DRA: R},
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
        {CHECKPOINT: R, DRA: R},
        upstream_files={CHECKPOINT: R, DRA: R},
    ),
    Play(
        "admit ml/d, no devices",
        lambda d: d.admit("ml", "d", {"main": {}}),
        [],
        {},
        {DRA: R},
        upstream_files={DRA: R},
    ),
    Play(
        "remove ml/b",  # kept difference: free()
        lambda d: d.remove("ml", "b"),
        ["allocation.removed", CAPACITY],
        {},
        {CHECKPOINT: R, DRA: R},
        upstream_files={DRA: R},
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


def _seen(run: AgentRun, kind: str, mark: int) -> Callable[[], bool]:
    return lambda: kind in run.recorder.kinds(mark)


async def play_scenario(driver: KubeletDriver, state: Path) -> list[Seen]:
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
                await run.recorder.until(_seen(run, play.awaited, mark), timeout=30)
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
