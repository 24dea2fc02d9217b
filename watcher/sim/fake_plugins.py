"""The fake kubelet's device plugins, and the warm-up after a restart that a real kubelet shows.

A real kubelet reads its checkpoint on start: allocations come back at once, but every
resource's healthy set starts empty until that resource's device plugin registers again (the
kubelet deletes the plugin sockets in `device-plugins/`; each plugin notices, serves a new
socket and registers, typically within a second or a few). `List` fills in as the kubelet's
pod sources sync. A plugin that restarts on its own takes all its resource's devices out of
allocatable until it is back; one that never returns leaves its resource empty.

`Warmup` says how long each of these takes; `Plugins` plays it against the fake node.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from watcher.sim.fake_node import FakeNode

__all__ = ["Plugins", "Warmup", "plugin_socket_name"]

KUBELET_REGISTRATION_SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class Warmup:
    """How the fake comes back from a (re)start. Delays are uniform in (low, high) seconds."""

    plugin_delay: tuple[float, float] = (0.2, 1.5)  # each plugin re-registers after this
    pods_delay: tuple[float, float] = (0.0, 0.0)  # each pod shows in List after this
    never: frozenset[str] = field(default_factory=frozenset)  # resources whose plugin never returns
    # A real plugin serves its socket and registers first, and its devices reach allocatable only
    # once the kubelet's ListAndWatch stream has them: this long after its socket is back.
    devices_lag: tuple[float, float] = (0.02, 0.2)


def plugin_socket_name(resource: str) -> str:
    """The socket a resource's plugin serves in `device-plugins/` (one plugin per resource here)."""
    return resource.replace("/", "_") + ".sock"


class Plugins:
    """Which resources' plugins are registered now, which pods `List` shows yet, and the sockets."""

    def __init__(
        self,
        directory: Path,
        node: FakeNode,
        *,
        warmup: Warmup | None,
        rng: random.Random,
        on_change: Callable[[], None],
    ) -> None:
        self.directory = directory
        self.node = node
        self.warmup = warmup
        self.rng = rng
        self.on_change = on_change
        self.down: set[str] = set()  # resources whose plugin is not registered
        self.hidden_pods: set[tuple[str, str]] = set()  # pods List does not show yet
        # Resources whose restarting plugin forgot its devices' health: it registers again listing
        # each Healthy, as NVIDIA's device plugin does (it keeps no health across a restart).
        self.forgetting: set[str] = set()
        self.registrations = 0  # plugin registrations after a warm-up or a plugin restart
        self.on_register: Callable[[str], None] | None = None  # told of each, e.g. by the demo
        self.on_shown: Callable[[], None] | None = None  # told when List shows one more pod
        self._tasks: set[asyncio.Task[None]] = set()
        self._settled = asyncio.Event()
        self._settled.set()

    def resources(self) -> set[str]:
        return {resource for resource, _ in self.node.devices}

    def kubelet_started(self) -> None:
        """The kubelet (re)started: plugin sockets deleted; with a warm-up, every plugin and pod
        comes back after its delay; without, all are there at once."""
        self._cancel()
        for sock in self._sockets():
            sock.unlink(missing_ok=True)
        resources = self.resources()
        if self.warmup is None:
            self.down.clear()
            self.hidden_pods.clear()
            for resource in resources:
                self._touch(resource)
            return
        self.down = set(resources)
        self._settled.clear()
        for resource in sorted(resources):
            if resource not in self.warmup.never:
                self._later(
                    self.rng.uniform(*self.warmup.plugin_delay), functools.partial(self._register, resource)
                )
        low, high = self.warmup.pods_delay
        if high > 0:
            self.hidden_pods = set(self.node.pods)
            for key in sorted(self.hidden_pods):
                self._later(self.rng.uniform(low, high), functools.partial(self._reveal, key))

    def restart_plugin(
        self, resource: str, downtime: float | None, *, stream_ends_after: float = 0.0, forgets: bool = False
    ) -> None:
        """The plugin of `resource` goes away (its devices leave allocatable) and registers again
        after `downtime` seconds; None: it never comes back.

        As with the kubelet's own device manager: the plugin's socket goes first; the devices leave
        allocatable when its ListAndWatch stream ends (`stream_ends_after` seconds later), and no
        state file is rewritten for that. `forgets`: it comes back calling every device Healthy,
        the unhealthy ones included (a reset, not a heal)."""
        self._settled.clear()
        if forgets:
            self.forgetting.add(resource)
        (self.directory / plugin_socket_name(resource)).unlink(missing_ok=True)
        if stream_ends_after > 0:
            self._later(stream_ends_after, functools.partial(self.down.add, resource))
        else:
            self.down.add(resource)
        if downtime is not None:
            self._later(stream_ends_after + downtime, functools.partial(self._register, resource))

    def register(self, resource: str) -> None:
        """The plugin of `resource` registers now (after `restart_plugin(resource, None)`, say):
        its socket is back and its devices are allocatable again, both at once."""
        self._touch(resource)
        self._devices_in(resource)

    async def wait_settled(self) -> None:
        """Until every plugin that will come back has registered and List shows every pod."""
        await self._settled.wait()

    async def stop(self) -> None:
        tasks = self._cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- inside --

    def _register(self, resource: str) -> None:
        """Serve and Register: the socket first; the devices follow when the stream has them."""
        self._touch(resource)
        lag = self.rng.uniform(*self.warmup.devices_lag) if self.warmup is not None else 0.0
        if lag > 0:
            self._later(lag, functools.partial(self._devices_in, resource))
        else:
            self._devices_in(resource)

    def _devices_in(self, resource: str) -> None:
        self.down.discard(resource)
        if resource in self.forgetting:
            self.forgetting.discard(resource)
            for (r, _), device in self.node.devices.items():
                if r == resource:
                    device.healthy = True
        self.registrations += 1
        self.on_change()  # the kubelet rewrites its checkpoint as the plugin's devices come in
        if self.on_register is not None:
            self.on_register(resource)
        self._check_settled()

    def _reveal(self, key: tuple[str, str]) -> None:
        self.hidden_pods.discard(key)
        if self.on_shown is not None:
            self.on_shown()
        self._check_settled()

    def _check_settled(self) -> None:
        never = self.warmup.never if self.warmup is not None else frozenset()
        # A task that has finished may still be in the set (its done callback runs on a later
        # loop turn): when two delays end on the same turn, counting it left the warm-up never
        # settled. Only a task still to run keeps it open.
        current = asyncio.current_task()
        pending = [t for t in self._tasks if t is not current and not t.done()]
        if not self.hidden_pods and self.down <= never and not pending:
            self._settled.set()

    def _touch(self, resource: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / plugin_socket_name(resource)).touch()

    def _sockets(self) -> Iterable[Path]:
        if not self.directory.is_dir():
            return []
        # The kubelet deletes every socket there, by type whatever its name; the fake's own plugin
        # sockets are plain files named *.sock, so those go by name.
        return [
            p
            for p in self.directory.iterdir()
            if (p.name.endswith(".sock") or p.is_socket()) and p.name != KUBELET_REGISTRATION_SOCKET
        ]

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            action()

        task = asyncio.get_running_loop().create_task(run(), name="fake-plugin")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel(self) -> list[asyncio.Task[None]]:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        self._tasks.clear()
        return tasks
