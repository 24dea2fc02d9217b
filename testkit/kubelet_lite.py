"""kubelet-lite and its device plugins (the Go test peers, peers/cmd/) run as child processes.

kubelet-lite serves upstream's device manager, pod-resources and Pods API servers under a root
directory; each `DevicePlugin` registers one resource with it. Both announce readiness on stdout
(kubelet-lite a `kubelet-lite ready` line, a plugin a JSON `registered` line per registration), so
nothing here sleeps: every wait is on a line. A kubelet restart is a new process on the same root.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit import unix_http
from testkit.peer_process import PeerProcess
from testkit.waiting import wait_until
from watcher.errors import RateLimitedError
from watcher.kubelet.client import PodResourcesClient

__all__ = ["AdmissionError", "DevicePlugin", "KubeletLite"]


class AdmissionError(Exception):
    """kubelet-lite refused a pod: the admission result's reason and message, upstream's text."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


async def wait_allocatable(socket: Path, resource: str, devices: set[str], timeout: float = 15.0) -> None:
    """Until `GetAllocatableResources` on `socket` lists exactly `devices` of `resource`. A
    registration is not enough: the kubelet then dials the plugin and learns its devices from
    ListAndWatch, and until then it admits pods asking for the resource without giving them any."""

    async def listed() -> bool:
        try:
            async with PodResourcesClient(str(socket)) as client:
                answer = await client.allocatable()
        except RateLimitedError:  # an agent under test shares the kubelet's limiter
            return False
        return {i for d in answer.devices if d.resource_name == resource for i in d.device_ids} == devices

    await wait_until(listed, timeout, interval=0.1, what=f"{resource} devices {sorted(devices)} allocatable")


class DevicePlugin:
    """`device-plugin` serving `resource` with `devices` (id -> NUMA nodes) in the plugin dir."""

    def __init__(
        self, binary: Path, socket_dir: Path, resource: str, devices: Mapping[str, Sequence[int]]
    ) -> None:
        self.binary = binary
        self.socket_dir = socket_dir
        self.resource = resource
        self.devices = {d: tuple(n) for d, n in devices.items()}  # the set a new process starts with
        self.socket_name = resource.replace("/", "_").replace(".", "_") + ".sock"
        self.process: PeerProcess | None = None
        self.starts = 0

    def _argv(self) -> list[str]:
        spec = ",".join(f"{d}:{'+'.join(map(str, n))}" if n else d for d, n in self.devices.items())
        return [
            str(self.binary),
            "--socket-dir",
            str(self.socket_dir),
            "--resource",
            self.resource,
            "--devices",
            spec,
        ]

    @property
    def registrations(self) -> int:
        """Registrations by the current process (a new process counts from zero)."""
        if self.process is None:
            return 0
        return sum(1 for line in self.process.lines if json.loads(line).get("event") == "registered")

    async def start(self) -> None:
        """Start a new process and wait for its first registration."""
        self.starts += 1
        log = self.socket_dir.parent / f"plugin-{self.socket_name}.{self.starts}.log"
        self.process = PeerProcess(self._argv(), log, stdin=True)
        await self.process.start()
        await self.wait_registered(1)

    async def wait_registered(self, count: int, timeout: float = 15.0) -> None:
        assert self.process is not None
        await self.process.until(lambda _lines: self.registrations >= count, timeout)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()

    async def leave(self, linger: float) -> None:
        """The plugin removes its socket, keeps serving its streams `linger` seconds, then ends."""
        await self._command(op="leave", linger_ms=round(linger * 1000))
        await self.stop()  # it ends by itself; this waits for that (and reaps it)

    async def restart(self) -> None:
        """The plugin process ends (its socket goes) and a new one starts and registers."""
        await self.stop()
        await self.start()

    async def _command(self, **command: Any) -> None:
        assert self.process is not None
        mark = len(self.process.lines)
        await self.process.send(json.dumps(command))
        await self.process.until(lambda lines: any('"op"' in line for line in lines[mark:]))
        (answer,) = [json.loads(line) for line in self.process.lines[mark:] if '"op"' in line][:1]
        if not answer["ok"]:
            raise AssertionError(f"device-plugin refused {command}: {answer['error']}")

    async def set_healthy(self, device: str, healthy: bool) -> None:
        """Send the device's new health through ListAndWatch."""
        await self._command(op="health", id=device, healthy=healthy)

    async def add_device(self, device: str, numa: Sequence[int] = ()) -> None:
        """Hot-plug: the device joins the list ListAndWatch sends (a restart keeps it)."""
        await self._command(op="add", id=device, numa=list(numa))
        self.devices[device] = tuple(numa)

    async def remove_device(self, device: str) -> None:
        """Unplug: the device leaves the list ListAndWatch sends."""
        await self._command(op="remove", id=device)
        self.devices.pop(device, None)


class KubeletLite:
    """kubelet-lite on `root` (a stand-in for /var/lib/kubelet), and the plugins registered with it."""

    def __init__(self, binary: Path, plugin_binary: Path, root: Path, *, numa_nodes: int = 2) -> None:
        self.binary = binary
        self.plugin_binary = plugin_binary
        self.root = root
        self.numa_nodes = numa_nodes
        self.socket_path = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir = root / "device-plugins"
        self.checkpoint_path = self.plugin_dir / "kubelet_internal_checkpoint"
        self.pods_api_socket = root / "pods-api" / "pods-api.sock"
        self.control_socket = root / "kubelet-lite.sock"
        self.plugins: list[DevicePlugin] = []
        self.process: PeerProcess | None = None
        self.starts = 0

    async def start(self) -> None:
        """Start a kubelet-lite process and wait until all its sockets accept."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        argv = [str(self.binary), "--root-dir", str(self.root), "--numa-nodes", str(self.numa_nodes)]
        self.process = PeerProcess(argv, self.root.parent / f"kubelet-lite.{self.starts}.log")
        await self.process.start()
        await self.process.until(lambda lines: any(line.startswith("kubelet-lite ready") for line in lines))

    async def stop(self) -> None:
        """Stop the process; like a stopped kubelet it leaves its sockets behind."""
        if self.process is not None:
            await self.process.stop()

    async def restart(self) -> None:
        """A kubelet restart: a new process on the same root restores from its checkpoint; every
        plugin sees the new registration socket and registers again before this returns."""
        before = [p.registrations for p in self.plugins]
        await self.stop()
        await self.start()
        for plugin, count in zip(self.plugins, before, strict=True):
            await plugin.wait_registered(count + 1)

    async def add_plugin(self, resource: str, devices: Mapping[str, Sequence[int]]) -> DevicePlugin:
        """Start a plugin and wait until the kubelet lists its devices as allocatable."""
        plugin = DevicePlugin(self.plugin_binary, self.plugin_dir, resource, devices)
        self.plugins.append(plugin)
        await plugin.start()
        await self.wait_allocatable(resource, set(devices))
        return plugin

    async def wait_allocatable(self, resource: str, devices: set[str], timeout: float = 15.0) -> None:
        await wait_allocatable(self.socket_path, resource, devices, timeout)

    async def close(self) -> None:
        """Stop every plugin and the kubelet, even when one of them fails to stop."""
        try:
            for plugin in self.plugins:
                await plugin.stop()
        finally:
            await self.stop()

    async def __aenter__(self) -> KubeletLite:
        """Started; on leaving, every process it or its plugins started is stopped (`close`)."""
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the control socket --

    async def admit(
        self,
        namespace: str,
        name: str,
        containers: Mapping[str, Mapping[str, int]],
        *,
        uid: str | None = None,
    ) -> dict[str, dict[str, list[str]]]:
        """Admit a pod (container -> resource -> count): the device manager allocates. Returns
        container -> resource -> device ids; AdmissionError when the kubelet refuses it."""
        spec = {
            "namespace": namespace,
            "name": name,
            "uid": uid or str(uuid.uuid4()),
            "containers": [{"name": c, "resources": dict(r)} for c, r in containers.items()],
        }
        status, body = await self._http("POST", "/pods", spec)
        if status == 409:
            raise AdmissionError(body["reason"], body["message"])
        if status != 200:
            raise AssertionError(f"kubelet-lite admit: {status} {body}")
        devices: dict[str, dict[str, list[str]]] = body["devices"]
        return devices

    async def remove(self, namespace: str, name: str) -> None:
        """The pod ends: it leaves the active pods and its devices are freed."""
        status, body = await self._http("DELETE", f"/pods/{namespace}/{name}")
        if status != 200:
            raise AssertionError(f"kubelet-lite remove: {status} {body}")

    async def pods(self) -> list[dict[str, Any]]:
        status, body = await self._http("GET", "/pods")
        assert status == 200, body
        return list(body or [])

    async def _http(self, method: str, path: str, payload: object = None) -> tuple[int, Any]:
        return await unix_http.request(self.control_socket, method, path, payload)
