"""The fake node's DRA devices as their drivers see them: each allocated device's health, which a
driver reports to the kubelet (the DRA health service, KEP-4680) and the kubelet copies into the
holder's Pod status. Scripted as `fake.dra`.

A device is named as DRA names it, driver/pool/device. Changing its health changes nothing that
pod-resources shows (its claim still holds it), only the Pods API's view of every pod holding it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from watcher.sim.fake_node import FakeClaimDevice, FakeNode

__all__ = ["HEALTH_STATES", "DraDevices", "registration_socket"]

HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")


def registration_socket(registry: Path, driver: str) -> Path:
    """Where a driver registers with the kubelet: `<driver>-reg.sock` in `plugins_registry/`, as
    upstream's kubeletplugin helper names it (here a plain file: nothing connects to it)."""
    return registry / f"{driver}-reg.sock"


class DraDevices:
    """The claims' devices on `node`; `on_change` is told when a driver's verdict changes."""

    def __init__(self, node: FakeNode, on_change: Callable[[], None]) -> None:
        self.node = node
        self.on_change = on_change

    def held(self, driver: str, pool: str, device: str) -> Iterator[FakeClaimDevice]:
        """Every allocation of the device (a shared device is held by several claims)."""
        for pod in self.node.pods.values():
            for container in pod.containers:
                for claim in container.claims:
                    for d in claim.devices:
                        if (d.driver, d.pool, d.device) == (driver, pool, device):
                            yield d

    def set_health(self, driver: str, pool: str, device: str, health: str, message: str = "") -> None:
        """The driver reports the device `health` with `message` (its own words, e.g. "critical
        XID 79 reported by NVML"). KeyError when no claim holds the device."""
        if health not in HEALTH_STATES:
            raise ValueError(f"health {health!r} is not one of {', '.join(HEALTH_STATES)}")
        found = list(self.held(driver, pool, device))
        if not found:
            raise KeyError(f"DRA device {driver}/{pool}/{device}")
        for d in found:
            d.health, d.message = health, message
        self.on_change()

    def register(self, driver: str, registry: Path) -> None:
        """The driver serves its registration socket in `registry` (the kubelet's plugins_registry/)."""
        registry.mkdir(parents=True, exist_ok=True)
        registration_socket(registry, driver).touch()

    def restart_driver(self, driver: str, registry: Path) -> None:
        """The driver's process restarts: its registration socket is removed and created anew, and
        the new process, which remembers no failure, reports every device it serves Healthy (as
        upstream's test driver's new process does once told so: a forgotten failure, not a heal)."""
        socket = registration_socket(registry, driver)
        socket.unlink(missing_ok=True)
        self.register(driver, registry)
        for pod in self.node.pods.values():
            for container in pod.containers:
                for claim in container.claims:
                    for d in claim.devices:
                        if d.driver == driver:
                            d.health, d.message = "Healthy", ""
        self.on_change()
