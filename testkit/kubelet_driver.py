"""One scripting interface over the fake kubelet, kubelet-lite and the upstream kubelet
(`testkit.real_driver.RealDriver`), so a scenario plays on each.

A driver serves one device-plugin resource. Each step returns once the kubelet answers with its
outcome (a health change, a plug or a plugin's return is in `GetAllocatableResources`), so what
a test reads after a step is the settled state on either kubelet. The fake's allocations follow
the rule our device-plugin peer answers `GetPreferredAllocation` with (the device manager asks it
whenever it has more free devices than it needs), so both kubelets give a pod the same devices.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from testkit.kubelet_lite import DevicePlugin, KubeletLite
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeContainer, FakeDevice, FakeNode, FakePod
from watcher.sim.fake_plugins import plugin_socket_name

__all__ = ["FakeDriver", "KubeletDriver", "LiteDriver", "PluginDriver", "preferred_devices"]

# container -> resource -> how many devices
Containers = Mapping[str, Mapping[str, int]]
# container -> resource -> the device ids it was given
Held = dict[str, dict[str, list[str]]]


class KubeletDriver(Protocol):
    """A kubelet serving `resource` from one plugin, under `root` (a stand-in /var/lib/kubelet)."""

    name: str
    resource: str

    @property
    def root(self) -> Path: ...

    @property
    def socket_path(self) -> Path: ...

    @property
    def plugin_socket(self) -> str:
        """The socket the plugin serves in `device-plugins/` (the plugin's choice of name)."""
        ...

    @property
    def pods_api_socket(self) -> Path: ...

    async def admit(
        self, namespace: str, pod: str, containers: Containers, *, uid: str | None = None
    ) -> Held:
        """The pod running with `containers`; what each container holds. `uid` is the pod's uid
        where the kubelet takes it from the test (the fake, kubelet-lite); the upstream kubelet
        takes it from the API server and ignores it: tests ask `uid()` for the one it has."""
        ...

    async def uid(self, namespace: str, pod: str) -> str:
        """The uid the kubelet knows the admitted pod by."""
        ...

    async def remove(self, namespace: str, pod: str) -> None: ...

    async def set_healthy(self, device: str, healthy: bool) -> None: ...

    async def hot_plug(self, device: str, numa: Sequence[int]) -> None: ...

    async def unplug(self, device: str) -> None: ...

    async def restart(self) -> None: ...

    async def stop_plugin(self) -> None: ...

    async def start_plugin(self) -> None: ...


def preferred_devices(free: Mapping[str, int], count: int) -> list[str]:
    """`count` of the `free` devices (id -> NUMA node): the NUMA node with the most free first,
    then the lower node, then by id; the device-plugin peer's preference (devices.go)."""
    per_node: dict[int, int] = {}
    for node in free.values():
        per_node[node] = per_node.get(node, 0) + 1
    ranked = sorted(free, key=lambda d: (-per_node[free[d]], free[d], d))
    return ranked[:count]


class FakeDriver:
    """The Python fake kubelet (watcher.sim) serving `devices` of `resource` and `cpus` CPUs."""

    name = "fake"

    def __init__(self, fake: FakeKubelet, resource: str) -> None:
        self.fake = fake
        self.resource = resource

    @staticmethod
    def node(resource: str, devices: Mapping[str, Sequence[int]], cpus: int) -> FakeNode:
        """A node like kubelet-lite's: these devices, CPUs 0..cpus-1, no memory, no pods."""
        node = FakeNode(cpu_ids=set(range(cpus)))
        for device, numa in devices.items():
            node.add_device(FakeDevice(resource, device, tuple(numa)))
        return node

    @property
    def root(self) -> Path:
        return self.fake.root

    @property
    def socket_path(self) -> Path:
        return self.fake.socket_path

    @property
    def plugin_socket(self) -> str:
        return plugin_socket_name(self.resource)

    @property
    def pods_api_socket(self) -> Path:
        assert self.fake.pods_api is not None, "this fake kubelet serves no Pods API"
        return self.fake.pods_api.socket_path

    def _free(self) -> dict[str, int]:
        node = self.fake.node
        if self.resource in self.fake.plugins.down:
            return {}
        held = {i for p in node.pods.values() for c in p.containers for i in c.devices.get(self.resource, [])}
        return {
            d.id: (d.numa or (-1,))[0]
            for (r, _), d in node.devices.items()
            if r == self.resource and d.healthy and d.id not in held
        }

    async def admit(
        self, namespace: str, pod: str, containers: Containers, *, uid: str | None = None
    ) -> Held:
        if uid is not None:
            # The pod and its containers in one change; only those given devices are allocated.
            self.fake.add_pod(FakePod(namespace, pod, [FakeContainer(c) for c in containers], uid=uid))
        out: Held = {}
        for container, resources in containers.items():
            count = resources.get(self.resource, 0)
            if uid is not None and not count:
                out[container] = {}
                continue
            ids = preferred_devices(self._free(), count)
            if len(ids) < count:
                raise AssertionError(f"the fake has {len(ids)} free {self.resource}, not {count}")
            self.fake.allocate(namespace, pod, container, devices={self.resource: ids} if ids else None)
            out[container] = {self.resource: sorted(ids)} if ids else {}
        return out

    async def uid(self, namespace: str, pod: str) -> str:
        return self.fake.node.pods[(namespace, pod)].uid

    async def remove(self, namespace: str, pod: str) -> None:
        self.fake.free(namespace, pod)

    async def set_healthy(self, device: str, healthy: bool) -> None:
        self.fake.set_healthy(self.resource, device, healthy)

    async def hot_plug(self, device: str, numa: Sequence[int]) -> None:
        self.fake.add_device(self.resource, device, numa)

    async def unplug(self, device: str) -> None:
        self.fake.remove_device(self.resource, device)

    async def restart(self) -> None:
        await self.fake.restart()
        await self.fake.plugins.wait_settled()

    async def stop_plugin(self) -> None:
        self.fake.plugins.restart_plugin(self.resource, None)

    async def start_plugin(self) -> None:
        self.fake.plugins.register(self.resource)


class PluginHost(Protocol):
    """What a kubelet process with device plugins offers a driver (KubeletLite, RealNode)."""

    root: Path
    socket_path: Path
    pods_api_socket: Path

    async def wait_allocatable(self, resource: str, devices: set[str], timeout: float = 15.0) -> None: ...

    async def restart(self) -> None: ...


class PluginDriver:
    """The device-plugin steps on a kubelet process with one plugin serving `resource`; each
    settles on `GetAllocatableResources`. Pods are the subclass's (each kubelet admits its way)."""

    name = ""

    def __init__(self, host: PluginHost, plugin: DevicePlugin) -> None:
        self.host = host
        self.plugin = plugin
        self.resource = plugin.resource
        self._unhealthy: set[str] = set()

    @property
    def root(self) -> Path:
        return self.host.root

    @property
    def socket_path(self) -> Path:
        return self.host.socket_path

    @property
    def plugin_socket(self) -> str:
        return self.plugin.socket_name

    @property
    def pods_api_socket(self) -> Path:
        return self.host.pods_api_socket

    async def _settled(self) -> None:
        await self.host.wait_allocatable(self.resource, set(self.plugin.devices) - self._unhealthy)

    async def set_healthy(self, device: str, healthy: bool) -> None:
        await self.plugin.set_healthy(device, healthy)
        if healthy:
            self._unhealthy.discard(device)
        else:
            self._unhealthy.add(device)
        await self._settled()

    async def hot_plug(self, device: str, numa: Sequence[int]) -> None:
        await self.plugin.add_device(device, numa)
        await self._settled()

    async def unplug(self, device: str) -> None:
        await self.plugin.remove_device(device)
        self._unhealthy.discard(device)
        await self._settled()

    async def restart(self) -> None:
        await self.host.restart()
        await self._settled()

    async def stop_plugin(self) -> None:
        await self.plugin.stop()
        # The devices leave when the plugin's stream ends, a moment after its socket is gone.
        await self.host.wait_allocatable(self.resource, set())

    async def start_plugin(self) -> None:
        await self.plugin.start()
        self._unhealthy.clear()  # a new process reports every device healthy
        await self._settled()


class LiteDriver(PluginDriver):
    """kubelet-lite with one device-plugin process serving `resource`."""

    name = "lite"

    def __init__(self, lite: KubeletLite, plugin: DevicePlugin) -> None:
        super().__init__(lite, plugin)
        self.lite = lite
        self._uids: dict[tuple[str, str], str] = {}

    @classmethod
    async def create(
        cls, lite: KubeletLite, resource: str, devices: Mapping[str, Sequence[int]]
    ) -> LiteDriver:
        """Start the plugin on the running `lite`; returns once its devices are allocatable."""
        return cls(lite, await lite.add_plugin(resource, devices))

    async def admit(
        self, namespace: str, pod: str, containers: Containers, *, uid: str | None = None
    ) -> Held:
        uid = uid or str(uuid.uuid4())
        held = await self.lite.admit(namespace, pod, containers, uid=uid)
        self._uids[(namespace, pod)] = uid
        return {c: {r: sorted(ids) for r, ids in by.items()} for c, by in held.items()}

    async def uid(self, namespace: str, pod: str) -> str:
        return self._uids[(namespace, pod)]

    async def remove(self, namespace: str, pod: str) -> None:
        await self.lite.remove(namespace, pod)
