"""The notifier: the directory watch and the periodic timer, turned into re-query triggers.

The socket's directory is watched so a kubelet restart (the socket replaced) is queried at
once, on a fresh channel; the kubelet's checkpoint, CPU/memory manager state and device-plugin
sockets are watched because they are rewritten when the inventory changes; a jittered timer is
the safety net. All of them are subscribers of one watch (`watches`, shared with the Pods API
watch), which steps short only while a restart is awaited or nothing else would tell of one.
A reload retires one configuration's subscriptions and starts the next.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from watcher.kubelet.identity import FileIdentity, SocketState, is_replacement, probe_socket, replaced_since
from watcher.kubelet.triggers import Trigger
from watcher.kubelet.watching import DirectoryWatches
from watcher.settings import Settings, WatchSettings
from watcher.sources.pods_api.reads import POD_STATUS
from watcher.supervision import Scope

__all__ = ["CHECKPOINT_NAME", "NO_STREAM", "Notifier", "PLUGIN_FOLLOW_UPS", "STATE_FILE_NAMES"]

log = structlog.get_logger("watcher.cycle.notifier")

# Kubelet state files that are rewritten (temp + rename) when the inventory changes.
STATE_FILE_NAMES = ("cpu_manager_state", "memory_manager_state", "dra_manager_state")
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
# Looks after a device-plugin socket comes or goes (seconds after the change). The kubelet drops a
# departed plugin's devices when the plugin's ListAndWatch stream ends, a moment after its socket
# is gone, and rewrites no file then; and it lists a new plugin's devices only once its first
# ListAndWatch answer arrives. The re-query the socket change triggers can come before either, so
# without these the change would wait for the timer (seen against the kubelet's own device manager).
PLUGIN_FOLLOW_UPS = (0.5, 2.0)
# Why the watch steps short: no live Pods API stream to tell of a kubelet's end, or the kubelet is
# down (its new socket is awaited).
NO_STREAM, KUBELET_DOWN = "no-pods-api-stream", "kubelet-down"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _configure(watches: DirectoryWatches, w: WatchSettings) -> None:
    watches.configure(
        step_ms=_ms(w.step),
        hurry_step_ms=_ms(w.hurry_step),
        force_polling=w.force_polling,
        poll_delay_ms=_ms(w.poll_interval),
    )


def _gathering(settings: Settings) -> dict[str, float]:
    # A DRA driver's verdict reaches its devices' holders one pod status at a time: one re-query
    # for the burst, so a driver crash is one incident, not a page per cycle's share of it.
    return {POD_STATUS: settings.pods.status_gather}


class Notifier:
    """Fires `trigger` with a reason whenever the node may have changed; keeps the timer."""

    def __init__(self, settings: Settings, *, stop: asyncio.Event, rng: random.Random) -> None:
        self.settings = settings
        self.stop = stop
        self.rng = rng
        self.trigger = Trigger(_gathering(settings))
        self.next_periodic = 0.0
        # The directory said the socket's NAME was replaced (not only its metadata touched);
        # the reactor takes it when it checks the socket's identity.
        self.name_events = False
        # When a new socket was seen, for the reconnect latency; the reactor takes it too.
        self.socket_changed_at: float | None = None
        self._socket_seen: SocketState | None = None
        self._replaced = asyncio.Event()  # set whenever the watch sees the socket appear or replaced
        self._said_not_a_socket: FileIdentity | None = None
        self._generation = Scope(stop)
        self.watches = DirectoryWatches(stop=stop)
        _configure(self.watches, settings.watch)
        self.watches.hurry(NO_STREAM)  # until a Pods API stream is live
        # The pending follow-up looks (monotonic), earliest first; the reactor drops the past ones.
        self.follow_ups: list[float] = []

    @property
    def socket_path(self) -> Path:
        return self.settings.kubelet.socket

    def schedule_periodic(self, now: float) -> None:
        w = self.settings.watch
        self.next_periodic = now + w.interval * (1 + self.rng.uniform(-w.jitter, w.jitter))

    def reconfigure(self, settings: Settings) -> None:
        """Apply new kubelet/watch settings: the watches restart on them and a re-query comes."""
        if settings.kubelet.socket != self.settings.kubelet.socket:
            self._socket_seen = None
        self.settings = settings
        self.trigger.gather = _gathering(settings)
        _configure(self.watches, settings.watch)
        self._generation.set()
        self._generation = Scope(self.stop)
        self.trigger.fire("reload", urgent=True)

    # -- what tells of a restart --

    def pods_api_state(self, state: str, detail: str) -> None:
        """The Pods API watch's state: while its stream is live, its end tells of a kubelet that
        stopped, so the watch may step long; when it ends, query at once (as a vanished socket)."""
        live = state == "watching"
        was_live = not self.watches.hurrying(NO_STREAM)
        self.watches.hurry(NO_STREAM, not live)
        if was_live and not live:
            self.watches.hurry(KUBELET_DOWN)  # until a query says otherwise
            self.trigger.fire("pods-api-ended", urgent=True)

    async def until_replaced(self, seen: FileIdentity | None) -> None:
        """Return once another socket than `seen` is at the path (a cycle's calls are then given
        up: watcher.cycle.asking)."""
        while True:
            self._replaced.clear()
            if replaced_since(seen, self.socket_path):
                return
            await self._replaced.wait()

    def kubelet_answered(self, ok: bool) -> None:
        """After each re-query: a kubelet that is down has its new socket awaited, on short steps."""
        self.watches.hurry(KUBELET_DOWN, not ok)

    # -- the subscriptions (supervised tasks; the watch itself is `watches.run`) --

    async def watch_socket(self) -> None:
        while not self.stop.is_set():
            await self._watch_socket_once(self._generation)

    async def _watch_socket_once(self, generation: Scope) -> None:
        path = self.socket_path
        name = path.name
        sub = self.watches.subscribe(path.parent, lambda n: n == name, "socket")
        self._socket_seen = probe_socket(path)
        async for batch in sub.batches(generation):
            if batch.get(name, set()) & {"added", "deleted"}:
                self.name_events = True
            now = probe_socket(path)
            before, self._socket_seen = self._socket_seen, now
            if now.identity is not None and not now.is_socket:
                if self._said_not_a_socket != now.identity:
                    self._said_not_a_socket = now.identity
                    log.error(
                        "socket path exists but is not a socket; still watching",
                        socket=str(path),
                        hint="mount the kubelet's pod-resources DIRECTORY, not the socket file",
                    )
                continue
            if not now.present:
                if before is not None and before.present:
                    log.warning("kubelet socket vanished; waiting for it to come back", socket=str(path))
                    # Query now: the outage (and its grace) starts here, not at the next timer.
                    self.trigger.fire("socket-gone", urgent=True)
                continue
            assert now.identity is not None
            known = before.identity if before is not None and before.present else None
            if known is None or is_replacement(known, now.identity, name_events=self.name_events):
                # Appeared or replaced: query at once on a fresh channel.
                self.socket_changed_at = time.monotonic()
                self.trigger.fire("socket", urgent=True)
                self._replaced.set()

    async def watch_state_files(self) -> None:
        """Re-query when the kubelet's checkpoint, CPU/memory state or plugin sockets change.

        Both directories are waited for if the kubelet has not created them yet.
        """
        while not self.stop.is_set():
            generation = self._generation
            if not self.settings.watch.state_file_triggers:
                await generation.wait()
                continue
            root = self.settings.kubelet.root_dir
            plan = [
                (
                    root / "device-plugins",
                    lambda n: n == CHECKPOINT_NAME or n.endswith(".sock"),
                    "device-plugins",
                ),
                (root, lambda n: n in STATE_FILE_NAMES, "kubelet-root"),
            ]
            await asyncio.gather(*(self._watch_dir(d, m, n, generation) for d, m, n in plan))

    async def _watch_dir(
        self, directory: Path, match: Callable[[str], bool], name: str, generation: Scope
    ) -> None:
        async for batch in self.watches.subscribe(directory, match, name).batches(generation):
            if batch:
                if any(n.endswith(".sock") for n in batch):
                    now = time.monotonic()
                    self.follow_ups = sorted({*self.follow_ups, *(now + d for d in PLUGIN_FOLLOW_UPS)})
                self.trigger.fire("state-file:" + ",".join(sorted(batch)))
