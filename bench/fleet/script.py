"""The simulated nodes' events: real inventories of the simulated kubelet's node, diffed by the
agent's model, so each step yields exactly the changes the agent would report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from watcher.model import lifecycle
from watcher.model.build import build
from watcher.model.changes import Change
from watcher.model.diff import diff
from watcher.model.inventory import Inventory
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node

__all__ = ["Cycle", "GPU", "NIC", "Script", "script"]

GPU = "nvidia.com/gpu"
NIC = "intel.com/sriov_netdevice"


@dataclass(frozen=True)
class Cycle:
    """One re-query's changes on a node, with the inventory hashes before and after it."""

    changes: tuple[Change, ...]
    before: str
    after: str


@dataclass(frozen=True)
class Script:
    start: Cycle  # watcher.started: an agent's first event
    steady: tuple[Cycle, ...]  # each node plays these in turn, from a random step
    burst: Cycle  # a GPU that a pod holds fails

    @property
    def mean_events(self) -> float:
        return sum(len(c.changes) for c in self.steady) / len(self.steady)


def script() -> Script:
    """Real inventories of the simulated node, diffed by the agent's model."""
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)

    def inventory() -> Inventory:
        return build(fake.allocatable_response(), fake.list_response())

    held = {
        (res, dev)
        for pod in fake.node.pods.values()
        for c in pod.containers
        for res, devs in c.devices.items()
        for dev in devs
    }
    free = {
        res: [d for (r, d) in sorted(fake.node.devices) if r == res and (r, d) not in held]
        for res in (GPU, NIC)
    }
    gpu_a, gpu_b, nic = free[GPU][0], free[GPU][1], free[NIC][0]
    steps: list[Callable[[], None]] = [
        lambda: fake.allocate("batch", "train-1", "main", devices={GPU: [gpu_a]}),
        lambda: fake.make_unhealthy(GPU, gpu_b),
        lambda: fake.allocate("net", "router-2", "app", devices={NIC: [nic]}),
        lambda: fake.heal(GPU, gpu_b),
        lambda: fake.free("batch", "train-1"),
        lambda: fake.free("net", "router-2"),
    ]
    base = inventory()
    start = Cycle(
        (lifecycle.started(base, baseline="fresh", changes=0, error=None),),
        base.content_hash,
        base.content_hash,
    )
    steady = []
    before = base
    for step in steps:
        step()
        after = inventory()
        steady.append(Cycle(diff(before, after), before.content_hash, after.content_hash))
        before = after
    assert before.content_hash == base.content_hash, "the steady script must come back to its start"
    holder = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
    fake.make_unhealthy(GPU, holder)
    failed = inventory()
    burst = Cycle(diff(base, failed), base.content_hash, failed.content_hash)
    assert all(c.changes for c in steady), "every scripted step is a change"
    assert burst.changes, "the failed GPU is a change"
    return Script(start, tuple(steady), burst)
