"""A name or id that is not valid UTF-8 in the kubelet's answers, against the agent and the fake
kubelet: reported once as api.invalid_text, and every other change still reported at once while
the bad bytes stay in every answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from testkit.agent import Running, make_settings, running_agent
from watcher.model.inventory import Inventory
from watcher.sim.fake_kubelet import FakeKubelet

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"
FREE_NIC = "0000:86:02.2"  # one the default node's pods do not hold
# A change the agent is up to date with reaches it in well under a second; 12 s was the miss.
PROMPT = 3.0


@pytest.fixture
async def fake(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(short_tmp / "kubelet", seed=42)
    yield kubelet
    await kubelet.stop(remove_socket=True)


# Where the bad byte goes: the text put in place by the fake (its `-` becomes 0xff on the wire),
# and the change that puts that text into an answer.
PLANTS: dict[str, tuple[str, Callable[[FakeKubelet], None]]] = {
    # Only GetAllocatableResources carries it: a free device a plugin named.
    "allocatable-device-id": ("GPU-evil", lambda k: k.add_device(GPU, "GPU-evil", (0,))),
    # Only List carries these: a device held but not allocatable, a pod's name, a container's name.
    "list-device-id": ("GPU-evil", lambda k: k.allocate("team", "holder", "c", devices={GPU: ["GPU-evil"]})),
    "list-pod-name": ("pod-evil", lambda k: k.allocate("team", "pod-evil", "c", cpu_ids=[90])),
    "list-container-name": ("ctr-evil", lambda k: k.allocate("team", "holder", "ctr-evil", cpu_ids=[90])),
}
CASES = [pytest.param(plant, False, id=f"{plant}-list-only") for plant in PLANTS] + [
    # With the Pods API, a pod's allocation is read alone with Get, the next List then compared.
    pytest.param("allocatable-device-id", True, id="allocatable-device-id-pods-api"),
]


def _texts(inventory: Inventory | None) -> set[str]:
    """Every device id, pod name and container name the agent holds."""
    assert inventory is not None
    pods = inventory.pods
    containers = [c for p in pods for c in p.containers]
    devices = [*inventory.devices, *(d for c in containers for d in c.devices)]
    return {d.id for d in devices} | {p.name for p in pods} | {c.name for c in containers}


async def _reported(run: Running, act: Callable[[], None], kind: str) -> None:
    """`act`, then its `kind` event, within PROMPT seconds (the fake's own triggers, no wake-up)."""
    mark = len(run.recorder.events)
    act()
    await run.recorder.until(lambda: kind in run.recorder.kinds(mark), timeout=PROMPT)


@pytest.mark.parametrize(("plant", "pods_api"), CASES)
async def test_every_change_is_reported_at_once_while_a_text_is_not_utf8(
    fake: FakeKubelet, short_tmp: Path, plant: str, pods_api: bool
) -> None:
    text, put = PLANTS[plant]
    bad = text.replace("-", "\\xff")  # as the agent shows it: the bad byte escaped
    await fake.start()
    async with running_agent(make_settings(short_tmp, pods_api=pods_api), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        start = len(run.recorder.events)
        fake.faults.substitute(text.encode(), text.encode().replace(b"-", b"\xff"))
        put(fake)
        await run.recorder.until(lambda: "api.invalid_text" in run.recorder.kinds(start))
        await run.quiet_cycle()
        mark = len(run.recorder.events)

        await _reported(
            run, lambda: fake.allocate("team", "job-1", "c", devices={NIC: [FREE_NIC]}), "allocation.added"
        )
        await _reported(run, lambda: fake.add_device(GPU, "GPU-hotplug", (1,)), "device.added")
        await _reported(run, lambda: fake.free("team", "job-1"), "allocation.removed")
        await run.quiet_cycle()

        assert bad in _texts(run.agent.inventory)  # the bad byte was in every answer throughout
        # Each change once, and nothing else: no pod taken as gone, none taken as held still.
        assert sorted(run.recorder.kinds(mark)) == sorted(
            ["allocation.added", "device.added", "allocation.removed"] + ["capacity.changed"] * 3
        )
        warned = [e.details["strings"] for e in run.recorder.events[start:] if e.kind == "api.invalid_text"]
        assert warned == [[bad]]  # once, not again with each answer that still carries it
        assert "kubelet.unreachable" not in run.recorder.kinds(start)
