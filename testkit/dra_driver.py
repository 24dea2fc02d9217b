"""The DRA test driver (the Go test peer peers/cmd/dra-test-driver, upstream's
test/e2e/dra/test-driver/app) run as a child process: a kubelet plugin under a kubelet root
directory that publishes one pool's ResourceSlice for its node, driven through its control socket
(health reports, device taints, a muted health stream, its state).

It prints `dra-test-driver ready` once its sockets listen, so starting it is awaited on that line.
A driver restart is a new process on the same directories; what the old process was told (taints,
health, mute) goes with it, as it would with a real driver's restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from testkit import unix_http
from testkit.peer_process import PeerProcess

__all__ = ["ControlError", "DraDriver", "Health"]

Health = Literal["Healthy", "Unhealthy", "Unknown"]


class ControlError(AssertionError):
    """The driver refused a control request: the HTTP status and its `error` text."""

    def __init__(self, path: str, status: int, body: Any) -> None:
        self.status = status
        self.error = body.get("error", "") if isinstance(body, dict) else str(body)
        super().__init__(f"dra-test-driver {path}: {status} {self.error}")


class DraDriver:
    """`dra-test-driver` as driver `driver` on `node`, its kubelet root `root` (a stand-in for
    /var/lib/kubelet), publishing `devices` in `pool` (default: the node's name) with the
    API server's credentials in `kubeconfig`. `health`: serve the DRAResourceHealth service."""

    def __init__(
        self,
        binary: Path,
        root: Path,
        *,
        kubeconfig: Path,
        node: str,
        driver: str,
        devices: Sequence[str] = ("dev0", "dev1"),
        pool: str | None = None,
        health: bool = True,
    ) -> None:
        self.binary = binary
        self.root = root
        self.kubeconfig = kubeconfig
        self.node = node
        self.driver = driver
        self.devices = tuple(devices)
        self.pool = pool or node
        self.health = health
        self.data_dir = root / "plugins" / driver
        self.plugin_socket = self.data_dir / "dra.sock"  # upstream's name in the data directory
        self.registration_socket = root / "plugins_registry" / f"{driver}-reg.sock"
        self.control_socket = self.data_dir / "control.sock"
        self.cdi_dir = root / "cdi"
        self.process: PeerProcess | None = None
        self.starts = 0

    def _argv(self) -> list[str]:
        argv = [
            str(self.binary),
            "--kubeconfig",
            str(self.kubeconfig),
            "--node-name",
            self.node,
            "--driver-name",
            self.driver,
            "--kubelet-root",
            str(self.root),
            "--cdi-dir",
            str(self.cdi_dir),
            "--pool",
            self.pool,
            "--devices",
            ",".join(self.devices),
            "--control",
            str(self.control_socket),
        ]
        return [*argv, "--health"] if self.health else argv

    async def start(self) -> None:
        """Start a new process and wait until its plugin and control sockets listen."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = self.root.parent / f"dra-driver-{self.driver}.{self.starts}.log"
        self.process = PeerProcess(self._argv(), log)
        await self.process.start()
        await self.process.until(lambda lines: "dra-test-driver ready" in lines, timeout=30.0)

    async def stop(self) -> None:
        """SIGTERM: upstream's Stop closes the gRPC servers, which removes both plugin sockets."""
        if self.process is not None:
            await self.process.stop()

    async def restart(self) -> None:
        """The driver process ends and a new one starts on the same directories."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> DraDriver:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the control socket --

    async def _post(self, path: str, payload: object = None) -> Any:
        status, body = await unix_http.request(self.control_socket, "POST", path, payload)
        if status != 200:
            raise ControlError(path, status, body)
        return body

    async def set_health(self, pool: str | None, device: str, health: Health, message: str = "") -> None:
        """Upstream's DeviceHealthUpdate on the plugin's HealthControlChan (`pool` None: the
        driver's pool); the next report on the health stream carries it."""
        payload = {"pool": pool or self.pool, "device": device, "health": health, "message": message}
        await self._post("/health", payload)

    async def taint(self, device: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        """Republish the pool's ResourceSlice with this taint on the device (replacing one with
        the same key). Publishing is asynchronous: wait on the API server for it."""
        await self._post("/taint", {"device": device, "key": key, "value": value, "effect": effect})

    async def untaint(self, device: str, key: str) -> None:
        """Republish without the device's taint with this key."""
        await self._post("/untaint", {"device": device, "key": key})

    async def mute(self) -> None:
        """The health stream stays open and the plugin registered, but no report reaches the
        kubelet until `unmute`: a driver that stops reporting."""
        await self._post("/mute")

    async def unmute(self) -> None:
        await self._post("/unmute")

    async def state(self) -> dict[str, Any]:
        """Prepared claims, `registered`, the health stream's figures (`health_streams`,
        `reports_sent`, `reports_withheld`, `muted`), `taints` and publishing `errors`."""
        status, body = await unix_http.request(self.control_socket, "GET", "/state")
        if status != 200:
            raise ControlError("/state", status, body)
        state: dict[str, Any] = body
        return state
