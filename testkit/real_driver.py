"""The upstream kubelet (`testkit.real_node.RealNode`) behind the `KubeletDriver` interface, so the
scenarios written for the fake kubelet and kubelet-lite play on a real node too.

Pods are made as a user makes them: a Pod bound to the node by `spec.nodeName` in the API server,
its containers asking for the given devices as limits; the kubelet admits it, the device manager
allocates, the fake CRI runs it. `admit` returns once the pod is Running and pod-resources `Get`
gives it what it holds (the devices as the kubelet gave them). `remove` deletes it from the API
server and returns once pod-resources no longer lists it, the API server no longer has it (so the
name can be taken again) and the kubelet's DRA manager has unprepared it (it rewrites
`dra_manager_state` for every pod, claims or not, once the pod's containers are gone). `restart`
returns once the plugin's devices are allocatable and pod-resources lists every pod again (the
kubelet lists none until it has its pods from the API server once more).

Not honoured: a `uid=` given to `admit`. The kubelet knows a pod by the uid the API server gave
it; `uid()` answers it, and tests that compare uids ask for it instead of naming one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.kubelet_driver import Containers, Held, PluginDriver
from testkit.kubelet_lite import DevicePlugin
from testkit.real_node import RealNode
from testkit.waiting import wait_until
from watcher.errors import PodNotFoundError, RateLimitedError
from watcher.kubelet.client import PodResourcesClient
from watcher.kubeletapi.v1 import api_pb2

__all__ = ["RealDriver", "pod_manifest"]

IMAGE = "registry.test/parity:1"  # fake-cri runs any image name
DRA_STATE = "dra_manager_state"


def pod_manifest(node: str, namespace: str, name: str, containers: Containers) -> dict[str, Any]:
    """A Pod bound to `node` with one container per entry, each asking for its devices as limits
    (an extended resource's request defaults to its limit)."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": container,
                "image": IMAGE,
                "resources": {"limits": {r: str(n) for r, n in resources.items() if n}},
            }
            for container, resources in containers.items()
        ],
    }
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class RealDriver(PluginDriver):
    """The upstream kubelet on `node` with one device-plugin process serving `resource`."""

    name = "upstream"

    def __init__(self, node: RealNode, plugin: DevicePlugin) -> None:
        super().__init__(node, plugin)
        self.node = node
        self._namespaces: set[str] = set()
        self._uids: dict[tuple[str, str], str] = {}

    @classmethod
    async def create(cls, node: RealNode, resource: str, devices: Mapping[str, Sequence[int]]) -> RealDriver:
        """Start the plugin on the running `node`; returns once its devices are allocatable."""
        return cls(node, await node.add_plugin(resource, devices))

    async def _get(self, namespace: str, pod: str) -> api_pb2.PodResources | None:
        """pod-resources `Get` (None: the kubelet has no such pod), waiting out the limiter the
        agent under test shares with us."""
        while True:
            try:
                async with PodResourcesClient(str(self.node.socket_path)) as client:
                    return (await client.get(namespace, pod)).pod_resources
            except PodNotFoundError:
                return None
            except RateLimitedError:
                await asyncio.sleep(0.02)  # a token comes back within 10 ms (100 a second)

    async def admit(
        self, namespace: str, pod: str, containers: Containers, *, uid: str | None = None
    ) -> Held:
        """`uid` is ignored (see the module's docstring)."""
        if namespace not in self._namespaces:
            await self.node.namespace(namespace)
            self._namespaces.add(namespace)
        await self.node.apply(pod_manifest(self.node.name, namespace, pod, containers))
        running = await self.node.wait_pod(namespace, pod)
        self._uids[(namespace, pod)] = running["metadata"]["uid"]
        answer = await self._get(namespace, pod)
        assert answer is not None, f"{namespace}/{pod} runs but pod-resources does not have it"
        held: Held = {c: {} for c in containers}
        for container in answer.containers:
            for entry in container.devices:
                ids = held[container.name].setdefault(entry.resource_name, [])
                ids.extend(entry.device_ids)
        return {c: {r: sorted(ids) for r, ids in by.items()} for c, by in held.items()}

    async def uid(self, namespace: str, pod: str) -> str:
        return self._uids[(namespace, pod)]

    async def remove(self, namespace: str, pod: str) -> None:
        uid = self._uids.pop((namespace, pod), None)
        dra_state = self.node.root / DRA_STATE
        before = _mark(dra_state)
        await self.node.delete_pod(namespace, pod)

        async def gone() -> bool:
            # The DRA manager unprepares every pod once its containers are gone (claims or not)
            # and rewrites its checkpoint then: the kubelet is done with the pod.
            if _mark(dra_state) == before or await self._get(namespace, pod) is not None:
                return False
            found = await asyncio.to_thread(
                self.node.kubectl,
                "get",
                "pod",
                pod,
                "-n",
                namespace,
                "--ignore-not-found",
                "-o",
                "jsonpath={.metadata.uid}",
            )
            return found.strip() != uid

        await wait_until(gone, 30, interval=0.1, what=f"{namespace}/{pod} gone from the kubelet")

    async def restart(self) -> None:
        """A kubelet restart, settled: the plugin's devices allocatable again and every pod listed
        again. The kubelet lists no pods until it has them from the API server once more."""
        before = await self._listed()
        await super().restart()

        async def back() -> bool:
            return await self._listed() == before

        await wait_until(back, 30, interval=0.1, what="the pods listed again after a restart")

    async def _listed(self) -> set[tuple[str, str]]:
        while True:
            try:
                async with PodResourcesClient(str(self.node.socket_path)) as client:
                    return {(p.namespace, p.name) for p in (await client.list()).pod_resources}
            except RateLimitedError:
                await asyncio.sleep(0.02)


def _mark(path: Path) -> tuple[int, int] | None:
    """The file's identity now (a rewrite by rename gives a new inode or time); None: absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns
