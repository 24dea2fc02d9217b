"""The fake node's DRA devices as their drivers see them: each allocated device's health, which a
driver reports to the kubelet (the DRA health service, KEP-4680) and the kubelet copies into the
holder's Pod status. Scripted as `fake.dra`.

A device is named as DRA names it, driver/pool/device. Changing its health changes nothing that
pod-resources shows (its claim still holds it), only the Pods API's view of every pod holding it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from watcher.sim.fake_node import FakeClaimDevice, FakeNode

__all__ = ["HEALTH_STATES", "DraDevices"]

HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")


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
