"""The upstream kubelet as a test peer: `kubelet` (peers/cmd/kubelet, upstream's whole kubelet with
the real container manager) on `fake-cri` (upstream's fake CRI runtime, a process of its own that
outlives kubelet restarts as containerd does), registered as a Node of a kube-testcluster API
server, with device plugins (peers/cmd/device-plugin) and DRA drivers registered with it.

`RealNode(cluster, directory, name)` is an async context manager: on entry fake-cri and the
kubelet run and the Node is Ready and schedulable; on exit every process it started is stopped,
and the Node and every pod bound to it are deleted from the (shared) API server.

The kubelet runs in a private mount namespace where `directory/var-lib` is its /var/lib: from
the host (where the tests and the agent run), its root dir is `directory/var-lib/kubelet`.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.kube_testcluster import KubeTestCluster
from testkit.kubelet_lite import AdmissionError, DevicePlugin, wait_allocatable
from testkit.peer_process import PeerProcess
from testkit.peers import peer, require_root
from testkit.waiting import wait_until
from watcher.errors import RateLimitedError
from watcher.kubelet.client import PodResourcesClient

__all__ = ["NOT_READY_TAINT", "RealNode", "held_devices"]

# The kubelet registers its Node with this taint; the node lifecycle controller (not run here)
# removes it once the Node is Ready. The harness does that controller's part.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# A cold kubelet start (its first API calls, the container manager) measured ~1 s; a busy
# 2-core machine running the suite takes several times that.
START_TIMEOUT_S = 60.0


class RealNode:
    """fake-cri, the kubelet and its plugins under `directory`, as Node `name` of `cluster`."""

    def __init__(
        self, cluster: KubeTestCluster, directory: Path, name: str, *, cpus: int = 4, numa_nodes: int = 2
    ) -> None:
        self.cluster = cluster
        self.directory = directory
        self.name = name
        self.cpus = cpus
        self.numa_nodes = numa_nodes
        self.root = directory / "var-lib" / "kubelet"
        self.socket_path = self.root / "pod-resources" / "kubelet.sock"
        self.pods_api_socket = self.root / "pods-api" / "pods-api.sock"
        self.plugin_dir = self.root / "device-plugins"
        self.cri_socket = directory / "cri.sock"
        self.plugins: list[DevicePlugin] = []
        # What else runs against this node (DRA drivers): stopped before the kubelet on close.
        self.closers: list[Callable[[], Awaitable[None]]] = []
        self._namespaces: set[str] = set()
        self.cri: PeerProcess | None = None
        self.process: PeerProcess | None = None
        self.starts = 0

    # -- processes --

    async def start(self) -> None:
        """fake-cri (if not running) and a new kubelet process; returns once its pod-resources and
        Pods API sockets accept."""
        require_root("the kubelet peer enters a mount namespace of its own (unshare --mount)")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.cri is None:
            self.cri = PeerProcess(
                [str(peer("fake-cri")), "--socket", str(self.cri_socket)], self.directory / "fake-cri.log"
            )
            await self.cri.start()
            await self.cri.until(lambda lines: "fake-cri ready" in lines)
        self.starts += 1
        argv = [
            str(peer("kubelet")),
            "--dir",
            str(self.directory),
            "--kubeconfig",
            str(self.cluster.admin_kubeconfig),
            "--node-name",
            self.name,
            "--cri-socket",
            str(self.cri_socket),
            "--cpus",
            str(self.cpus),
            "--numa-nodes",
            str(self.numa_nodes),
        ]
        self.process = PeerProcess(argv, self.directory / f"kubelet.{self.starts}.log")
        await self.process.start()
        await self.process.until(
            lambda lines: any(line.startswith("kubelet ready") for line in lines), START_TIMEOUT_S
        )

    @property
    def pid(self) -> int:
        """The running kubelet's process id (as it printed it once ready)."""
        assert self.process is not None
        (line,) = [line for line in self.process.lines if line.startswith("kubelet ready pid=")][-1:]
        return int(line.removeprefix("kubelet ready pid="))

    async def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """Stop the kubelet (SIGTERM, or SIGKILL: no chance to clean up); fake-cri and the pods'
        containers stay, as they do on a node whose kubelet stops."""
        if self.process is None:
            return
        if how == signal.SIGKILL:
            await self.process.kill()
        else:
            await self.process.stop()

    async def restart(self, how: signal.Signals = signal.SIGTERM) -> None:
        """A kubelet restart: a new process on the same root dir; every device plugin sees the new
        registration socket and registers again before this returns."""
        before = [p.registrations for p in self.plugins]
        await self.stop(how)
        await self.start()
        for plugin, count in zip(self.plugins, before, strict=True):
            await plugin.wait_registered(count + 1, timeout=START_TIMEOUT_S)

    async def close(self) -> None:
        """Stop every plugin, the kubelet and fake-cri, then forget the Node in the API server."""
        try:
            for plugin in self.plugins:
                await plugin.stop()
            for close in self.closers:
                await close()
        finally:
            try:
                await self.stop()
            finally:
                if self.cri is not None:
                    await self.cri.stop()
                await asyncio.to_thread(self._forget)

    async def __aenter__(self) -> RealNode:
        try:
            await self.start()
            await self.wait_ready()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the API server's view --

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.cluster.kubectl(*args, input=input, check=check).stdout

    async def get(self, *args: str) -> Any:
        """`kubectl get ARGS -o json`, parsed, off the event loop."""
        return await asyncio.to_thread(self.cluster.get, *args)

    async def apply(self, *objects: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self.cluster.apply, *objects)

    async def wait_ready(self) -> None:
        """Until the Node is Ready; then drop the not-ready taint the kubelet registered it with."""

        async def ready() -> bool:
            result = await asyncio.to_thread(
                self.cluster.kubectl, "get", "node", self.name, "-o", "json", check=False
            )
            if result.returncode != 0:
                return False
            conditions = json.loads(result.stdout)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await wait_until(ready, START_TIMEOUT_S, interval=0.2, what=f"Node {self.name} Ready")
        await asyncio.to_thread(
            self.cluster.kubectl, "taint", "node", self.name, f"{NOT_READY_TAINT}:NoSchedule-", check=False
        )

    def _forget(self) -> None:
        """The Node and its pods out of the shared API server: nothing else would (no node
        lifecycle controller, no pod garbage collector), and a scheduler would keep using it."""
        self.cluster.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)
        pods = self.cluster.get("pods", "-A", "--field-selector", f"spec.nodeName={self.name}")
        for pod in pods.get("items", []):
            meta = pod["metadata"]
            self.cluster.kubectl(
                "delete",
                "pod",
                meta["name"],
                "-n",
                meta["namespace"],
                "--force",
                "--grace-period=0",
                check=False,
            )

    # -- devices --

    async def add_plugin(self, resource: str, devices: Mapping[str, Sequence[int]]) -> DevicePlugin:
        """Start a device plugin and wait until the kubelet lists its devices as allocatable."""
        plugin = DevicePlugin(peer("device-plugin"), self.plugin_dir, resource, devices)
        self.plugins.append(plugin)
        await plugin.start()
        await self.wait_allocatable(resource, set(devices))
        return plugin

    async def wait_allocatable(self, resource: str, devices: set[str], timeout: float = 15.0) -> None:
        """Until `GetAllocatableResources` lists exactly `devices` of `resource`."""
        await wait_allocatable(self.socket_path, resource, devices, timeout)

    # -- pods, as a user creates them --

    async def namespace(self, name: str) -> str:
        """A namespace ready for pods: its `default` service account and `kube-root-ca.crt`
        ConfigMap (every pod's projected token volume needs it) are what the controller-manager
        would create."""
        ca = self.cluster.ca_file.read_text()
        await self.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": name},
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": name},
                "data": {"ca.crt": ca},
            },
        )
        return name

    def pod(
        self,
        namespace: str,
        name: str,
        limits: Mapping[str, int | str] | None = None,
        *,
        owner: Mapping[str, str] | None = None,
        bound: bool = True,
    ) -> dict[str, Any]:
        """A Pod with one container `main` asking for `limits`; `bound`: on this node by
        `spec.nodeName` (no scheduler), else kept to it by a node selector for the scheduler."""
        spec: dict[str, Any] = {
            "containers": [
                {"name": "main", "image": "registry.test/job:1", "resources": {"limits": dict(limits or {})}}
            ],
            "terminationGracePeriodSeconds": 0,
        }
        if bound:
            spec["nodeName"] = self.name
        else:
            spec["nodeSelector"] = {"kubernetes.io/hostname": self.name}
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if owner is not None:
            meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    async def wait_pod(self, namespace: str, name: str, phase: str = "Running", timeout: float = 30.0) -> Any:
        """Until the pod's phase is `phase` (its containers started, for Running); the pod."""
        seen: dict[str, Any] = {}

        async def reached() -> bool:
            result = await asyncio.to_thread(
                self.cluster.kubectl, "get", "pod", name, "-n", namespace, "-o", "json", check=False
            )
            if result.returncode != 0:
                return False
            seen["pod"] = json.loads(result.stdout)
            status = seen["pod"].get("status", {})
            started = all(c.get("state", {}).get("running") for c in status.get("containerStatuses", [{}]))
            return bool(status.get("phase") == phase and (phase != "Running" or started))

        await wait_until(reached, timeout, interval=0.1, what=f"pod {namespace}/{name} {phase}")
        return seen["pod"]

    async def delete_pod(self, namespace: str, name: str, *, force: bool = False) -> None:
        """Delete the pod (with `force`: from the API server at once, whatever the kubelet does)."""
        extra = ["--force", "--grace-period=0"] if force else ["--wait=false"]
        await asyncio.to_thread(self.kubectl, "delete", "pod", name, "-n", namespace, *extra)

    # -- kubelet-lite's interface, so a scenario written for it plays here --

    async def admit(
        self, namespace: str, name: str, containers: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, list[str]]]:
        """A pod (container -> resource -> count) bound to this node, as a user creates one; returns
        once it runs: container -> resource -> the device ids the device manager gave it. Refused at
        admission: AdmissionError with the kubelet's reason and message (the pod's status)."""
        if namespace not in self._namespaces:
            await self.namespace(namespace)
            self._namespaces.add(namespace)
        pod = self.pod(namespace, name)
        pod["spec"]["containers"] = [
            {"name": c, "image": "registry.test/job:1", "resources": {"limits": dict(r)}}
            for c, r in containers.items()
        ]
        await self.apply(pod)

        async def settled() -> bool:
            got = await self.get("pod", "-n", namespace, name)
            status = got.get("status", {})
            if status.get("phase") == "Failed":
                return True
            running = status.get("containerStatuses", [])
            return status.get("phase") == "Running" and all(s["state"].get("running") for s in running)

        await wait_until(
            settled, START_TIMEOUT_S, interval=0.1, what=f"pod {namespace}/{name} admitted or refused"
        )
        status = (await self.get("pod", "-n", namespace, name))["status"]
        if status.get("phase") == "Failed":
            raise AdmissionError(status.get("reason", ""), status.get("message", ""))
        async with PodResourcesClient(str(self.socket_path)) as client:
            answer = await client.get(namespace, name)
        held: dict[str, dict[str, list[str]]] = {c: {} for c in containers}
        for container in answer.pod_resources.containers:
            for device in container.devices:
                held.setdefault(container.name, {}).setdefault(device.resource_name, []).extend(
                    device.device_ids
                )
        return held

    async def remove(self, namespace: str, name: str) -> None:
        """Delete the pod; returns once pod-resources no longer lists it (its devices freed)."""
        await self.delete_pod(namespace, name)

        async def gone() -> bool:
            try:
                async with PodResourcesClient(str(self.socket_path)) as client:
                    listed = await client.list()
            except RateLimitedError:
                return False
            return not any((p.namespace, p.name) == (namespace, name) for p in listed.pod_resources)

        await wait_until(gone, START_TIMEOUT_S, interval=0.1, what=f"pod {namespace}/{name} gone from List")


def held_devices(pod: Mapping[str, Any], resource: str | None = None) -> list[str]:
    """The device plugin devices (of `resource`, or any) the kubelet says `pod`'s containers hold,
    from the pod's status as the API server has it."""
    return [
        device["resourceID"]
        for status in pod["status"].get("containerStatuses", [])
        for entry in status.get("allocatedResourcesStatus", [])
        if resource is None or entry["name"] == resource
        for device in entry.get("resources", [])
    ]
