"""The composition root: the agent's parts, wired, run under one supervisor, and reloaded.

Data flow: the notifier's watches and timer fire a trigger -> the reactor re-queries the
kubelet (decode, diff, the kubelet's health machine) -> the committer stores the events with
the new state in one outbox transaction -> the dispatcher's workers deliver them to the sinks.
A cycle's events are durable before the state moves past them; delivery never holds up the loop.
Nothing here decides anything: it builds the parts, starts their tasks and swaps settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from watcher.backoff import Backoff
from watcher.cycle.committer import Committer, EventObserver
from watcher.cycle.notifier import Notifier
from watcher.cycle.reactor import CycleObserver, Reactor
from watcher.cycle.state import CycleState
from watcher.delivery.dispatcher import DeliveryObserver, Dispatcher
from watcher.kubelet.decoding import Decoder
from watcher.kubelet.health import KubeletHealth
from watcher.model.inventory import Inventory
from watcher.model.settling import Settling
from watcher.ops import notify
from watcher.ops.connections import ConnectionLimits
from watcher.ops.http import FD_OWN, HttpOptions, HttpServer
from watcher.ops.metrics import Metrics
from watcher.parts import kube_api_of, sinks_of, sources_of
from watcher.settings import HttpSettings, Settings
from watcher.settings_file import config_warnings, parse_listen
from watcher.sinks.base import BaseSinkSettings, HttpSinkSettings, Sink
from watcher.sinks.http import HTTP_SINK_CONNECTIONS
from watcher.sources.base import Source
from watcher.sources.pods_api.watch import PodsWatch
from watcher.status import AgentStatus
from watcher.store.outbox import OUTBOX_FILE
from watcher.store.store import Store
from watcher.supervision import Supervisor, sleep_or_stop, wait_any
from watcher.tls import ServerTls

if TYPE_CHECKING:
    # Imported where the API server is used, not before: the agent's RSS is budgeted.
    from watcher.kubeapi.api import KubeApi
    from watcher.sources.resource_slices import ResourceSliceTaints

__all__ = ["Agent", "http_options"]

log = structlog.get_logger("watcher.app")

SHUTDOWN_GRACE_S = 5.0
# The sources that read through the agent's KubeApi (watcher.parts.sources_of): they keep it until a restart.
_API_SOURCES = frozenset({"resource-slices", "device-taint-rules"})
# A reload waits for this much quiet after the last request, so a burst of SIGHUPs (a config
# tool that signals per file it writes) is one reload of the final file ...
RELOAD_QUIET_S = 0.2
# ... but never longer than this after the first one, so a steady stream cannot starve it.
RELOAD_MAX_WAIT_S = 2.0


def http_options(http: HttpSettings, sinks: Sequence[BaseSinkSettings] = ()) -> HttpOptions:
    """The HTTP server's options from the validated [http] settings; `sinks` for the descriptors
    they hold beside the server's (an HTTP sink's pool up to its connection limit, a file one)."""
    host, port = parse_listen(http.listen)
    tls = None
    if http.tls_cert_file is not None and http.tls_key_file is not None:
        tls = ServerTls(http.tls_cert_file, http.tls_key_file, http.tls_client_ca_file)
    return HttpOptions(
        host=host,
        port=port,
        limits=ConnectionLimits(
            max_connections=http.max_connections,
            header_timeout=http.header_timeout,
            idle_timeout=http.idle_timeout,
            request_timeout=http.request_timeout,
        ),
        inventory=http.inventory,
        inventory_token=http.inventory_token,
        tls=tls,
        other_descriptors=FD_OWN
        + sum(HTTP_SINK_CONNECTIONS if isinstance(s, HttpSinkSettings) else 1 for s in sinks),
    )


class Agent:
    """One node's watcher: `run()` until `stop` is set; `reload()` applies a new configuration.

    Test and benchmark seams (public, documented in docs/architecture.md): `open()` then `requery()` drives
    cycles without the loop; `wake(reason)` asks the running loop for one; `subscribe`,
    `subscribe_cycles` and `subscribe_deliveries` tell of every stored event, finished re-query
    and delivery; `metrics.value(...)` reads the counters; `kubelet_health`, `seq` and
    `inventory` are the committed state.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        sinks: Sequence[Sink] | None = None,
        sources: Sequence[Source] = (),
        stop: asyncio.Event | None = None,
        rng: random.Random | None = None,
        load_settings: Callable[[], Settings] | None = None,
    ) -> None:
        self.settings = settings
        # Where `request_reload()` reads the new settings from (the config file); None: nowhere.
        self.load_settings = load_settings
        self._reload_wanted = asyncio.Event()
        # Set once every task is running: from then on a reload request is acted on.
        self.started = asyncio.Event()
        self.stop = stop if stop is not None else asyncio.Event()
        self.rng = rng if rng is not None else random.Random()
        self.metrics = Metrics(max_device_series=settings.http.max_device_series)
        self.outbox = Store(settings.state_dir / OUTBOX_FILE)
        self.storage = self.outbox.health
        self.storage.subscribe(lambda writable: self.metrics.state_writable.set(int(writable)))
        # The one way to the API server, shared by the kubernetes sink and the sources reading it.
        self.kube_api = kube_api_of(settings)
        if sinks is None:
            sinks = sinks_of(settings, self.outbox, self.kube_api)
        self.dispatcher = Dispatcher(
            self.outbox, sinks, stop=self.stop, rng=self.rng, on_outbox_error=self._outbox_trouble
        )
        self.dispatcher.observers.append(self.metrics.observe_delivery)
        self.notifier = Notifier(settings, stop=self.stop, rng=self.rng)
        self.retry_backoff = Backoff(base=0.5, cap=min(10.0, settings.watch.interval), rng=self.rng)
        self.committer, self.reactor = self._cycle_parts(settings, sources)
        self.supervisor = Supervisor(self.stop, grace=SHUTDOWN_GRACE_S)
        self.status = AgentStatus(
            settings=lambda: self.settings,
            tasks=lambda: self.supervisor.tasks,
            reactor=self.reactor,
            committer=self.committer,
            dispatcher=self.dispatcher,
            outbox=self.outbox,
            metrics=self.metrics,
        )
        self.http: HttpServer | None = None
        self._reload_lock = asyncio.Lock()

    def _cycle_parts(self, settings: Settings, sources: Sequence[Source]) -> tuple[Committer, Reactor]:
        """The committer and the reactor, which reads the sources the settings ask for and `sources`."""
        committer = Committer(
            settings,
            outbox=self.outbox,
            dispatcher=self.dispatcher,
            metrics=self.metrics,
            backoff=self.retry_backoff,
            wake=lambda reason, urgent: self.notifier.trigger.fire(reason, urgent=urgent),
            state=CycleState(last_snapshot=time.monotonic()),
        )
        reactor = Reactor(
            settings,
            notifier=self.notifier,
            committer=committer,
            metrics=self.metrics,
            rate_backoff=Backoff(base=0.2, cap=10.0, rng=self.rng),
            retry_backoff=self.retry_backoff,
            stop=self.stop,
            sources=[*sources_of(settings, self.kube_api, self.notifier, self.stop, self.rng), *sources],
        )
        reactor.observers.append(lambda _: self.notifier.kubelet_answered(not committer.state.health.failing))
        return committer, reactor

    @property
    def pods_watch(self) -> PodsWatch | None:
        """The Pods API watch, when the agent runs one (a test and benchmark seam)."""
        return self.reactor.pods_api.watch if self.reactor.pods_api is not None else None

    @property
    def slice_taints(self) -> ResourceSliceTaints | None:
        """The ResourceSlices source, when the agent runs one (a test seam)."""
        return next((s for s in self.reactor.sources if s.name == "resource-slices"), None)  # type: ignore[return-value]

    # -- seams --

    def subscribe(self, observer: EventObserver) -> None:
        """Call `observer` with every event once it is durably queued."""
        self.committer.observers.append(observer)

    def subscribe_cycles(self, observer: CycleObserver) -> None:
        """Call `observer` with the cycle's trigger reasons after every re-query, successful or not."""
        self.reactor.observers.append(observer)

    def subscribe_deliveries(self, observer: DeliveryObserver) -> None:
        """Call `observer(sink, result, events, seconds)` after every delivery attempt's outcome."""
        self.dispatcher.observers.append(observer)

    def wake(self, reason: str, *, urgent: bool = False) -> None:
        """Ask the running loop for a re-query, as if `reason` had happened (`urgent`: not
        debounced, as for a replaced socket)."""
        self.notifier.trigger.fire(reason, urgent=urgent)

    async def requery(self, reasons: frozenset[str] = frozenset({"requested"})) -> None:
        """Run one complete re-query now (after `open()`), as the loop would."""
        await self.reactor.requery(reasons)

    async def open(self) -> bool:
        """Open the outbox and restore the saved state, as `run()` does first; False (said
        loudly) if the state directory refuses, and then nothing can be stored yet."""
        async with self.reactor.lock:
            return await self.committer.open(first=True)

    @property
    def seq(self) -> int:
        return self.committer.state.seq

    @property
    def inventory(self) -> Inventory | None:
        return self.committer.state.inventory

    @property
    def kubelet_health(self) -> KubeletHealth:
        return self.committer.state.health

    @property
    def settling(self) -> Settling:
        """What the kubelet's warm-up holds back now (`.holding`: anything)."""
        return self.committer.state.settling

    @property
    def decoder(self) -> Decoder:
        return self.reactor.decoder

    # -- running --

    async def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Run until `stop` is set; `on_started` is called once every task is running."""
        structlog.contextvars.bind_contextvars(node=self.settings.node)
        _warn_about_config(self.settings)
        try:
            tasks: dict[str, Callable[[], Awaitable[None]]] = {
                "query-loop": self.reactor.run,
                "directory-watch": self.notifier.watches.run,
                "socket-watch": self.notifier.watch_socket,
                "state-watch": self.notifier.watch_state_files,
                "delivery": self._deliver_once_open,
            }
            for source in self.reactor.sources:
                if source.name in tasks:  # one would silently replace the other
                    raise ValueError(f"two supervised tasks are named {source.name!r}: name the source apart")
                tasks[source.name] = source.run
            if not self.storage.ready.is_set() and not await self.open():
                tasks["outbox-open"] = self._open_later
            if self.settings.http.enabled:
                self.http = HttpServer(
                    self.status, http_options(self.settings.http, self.settings.sinks), self.metrics
                )
                tasks["http"] = self.http.serve(self.stop)
            if self.load_settings is not None:
                tasks["reloader"] = self._reloader
            log.info(
                "watcher starting",
                socket=str(self.settings.kubelet.socket),
                state_dir=str(self.settings.state_dir),
                seq=self.seq,
                baseline="saved" if self.inventory is not None else "none",
                sinks=sorted(self.dispatcher.workers),
                tasks=sorted(tasks),
            )
            for name, factory in tasks.items():
                self.supervisor.spawn(name, factory)
            self.started.set()
            if on_started is not None:
                on_started()
            notify.ready(f"watching {self.settings.kubelet.socket}")
            await self.supervisor.run()
        finally:
            notify.stopping()
            await self.close()
            log.info("watcher stopped", seq=self.seq)

    async def close(self) -> None:
        """Close the kubelet channel, the sinks and the outbox (what `run()` does last)."""
        closing = [self.reactor.client.close, self.dispatcher.close, self.outbox.close]
        if self.kube_api is not None:
            closing.insert(2, self.kube_api.close)  # after the sinks and sources that use it
        for close in closing:
            try:
                await close()
            except Exception as err:  # one failing close must not skip the others
                log.error("error while shutting down", error=repr(err))

    def _outbox_trouble(self, err: Exception) -> None:
        self.committer.outbox_trouble(err)

    async def _open_later(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            await sleep_or_stop(self.stop, self.retry_backoff.delay(attempt))
            attempt += 1
            if not self.stop.is_set():
                async with self.reactor.lock:
                    if await self.committer.open(first=False):
                        break
        await self.stop.wait()  # a supervised task ends with the agent

    async def _deliver_once_open(self) -> None:
        # The sinks read their queues from the outbox: nothing to do before it is open.
        await wait_any(self.storage.ready, self.stop)
        if not self.stop.is_set():
            await self.dispatcher.run()

    # -- reload --

    def request_reload(self) -> None:
        """Ask for the settings to be read again from `load_settings` and applied (SIGHUP).

        Requests coalesce: one that arrives while another waits or runs is folded into the
        next reload, which reads the file as it is then. Before the agent has started and
        once it is stopping, requests are ignored: there is nothing yet, or any more, to apply
        them to.
        """
        if self.load_settings is None or not self.started.is_set() or self.stop.is_set():
            log.info("reload request ignored", started=self.started.is_set(), stopping=self.stop.is_set())
            return
        self._reload_wanted.set()

    async def _reloader(self) -> None:
        assert self.load_settings is not None
        loop = asyncio.get_running_loop()
        while True:
            await wait_any(self._reload_wanted, self.stop)
            if self.stop.is_set():
                return
            give_up_waiting = loop.time() + RELOAD_MAX_WAIT_S
            while True:  # wait for the burst to end
                self._reload_wanted.clear()
                quiet = min(RELOAD_QUIET_S, give_up_waiting - loop.time())
                if quiet <= 0:
                    break
                await wait_any(self._reload_wanted, self.stop, within=quiet)
                if self.stop.is_set():
                    return
                if not self._reload_wanted.is_set():
                    break
            notify.reloading()
            try:
                new = self.load_settings()
            except Exception as err:  # a broken file must not take the agent down
                log.error("reload failed; keeping the running configuration", error=str(err))
            else:
                await self.reload(new)
            notify.ready("configuration reloaded")

    async def reload(self, settings: Settings) -> None:
        """Apply a new configuration: sinks and routes swap without losing queued events; a new
        socket path or kubelet root dir restarts the watches and reconnects."""
        if self.stop.is_set():
            return  # shutting down: nothing would run the new sinks
        async with self._reload_lock:  # two quick SIGHUPs apply one after the other
            await self._reload(settings)

    async def _reload(self, settings: Settings) -> None:
        old = self.settings
        if settings.state_dir != old.state_dir:
            log.warning("state_dir changes need a restart; keeping the old one", state_dir=str(old.state_dir))
            settings = dataclasses.replace(settings, state_dir=old.state_dir)
        if settings.node != old.node:
            log.warning("the node name changes only on restart; keeping it", node=old.node)
            settings = dataclasses.replace(settings, node=old.node)
        _warn_about_config(settings)
        if settings.pods != old.pods:
            log.warning("[pods] changes apply on restart; keeping the running watch")
            settings = dataclasses.replace(settings, pods=old.pods)
        if dataclasses.replace(settings.http, ready_stale_after=0) != dataclasses.replace(
            old.http, ready_stale_after=0
        ):
            # ready_stale_after is read on every /readyz and a token file is re-read when it
            # changes; the rest is the running server's shape.
            log.warning("[http] changes other than ready_stale_after apply on restart")
        if settings.resource_slices != old.resource_slices:
            log.warning("[resource_slices] changes apply on restart; keeping the running source")
            settings = dataclasses.replace(settings, resource_slices=old.resource_slices)
        if settings.device_taint_rules != old.device_taint_rules:
            log.warning("[device_taint_rules] changes apply on restart; keeping the running source")
            settings = dataclasses.replace(settings, device_taint_rules=old.device_taint_rules)
        shared, retired = self._reload_api(settings)
        sinks = sinks_of(settings, self.outbox, shared)
        self.settings = settings
        self.committer.settings = settings
        try:
            changed = await self.dispatcher.reload(sinks)
        finally:
            # The kubelet side applies whatever happened to the sinks.
            if settings.kubelet != old.kubelet or settings.watch != old.watch:
                await self.reactor.swap_client(settings)
            if retired is not None:  # after the sinks that used it are replaced
                await retired.close()
        log.info("configuration reloaded", sinks_changed=changed, socket=str(settings.kubelet.socket))

    def _reload_api(self, settings: Settings) -> tuple[KubeApi | None, KubeApi | None]:
        """The client the reloaded sinks share, and one to close once the old sinks are gone. A
        changed connection reaches the sinks now; a source reading through the running client
        keeps it until a restart, and the sinks then get clients of their own meanwhile."""
        wanted = kube_api_of(settings, self.kube_api)
        if wanted is self.kube_api:
            return wanted, None
        if any(s.name in _API_SOURCES for s in self.reactor.sources):
            log.warning(
                "the API server connection changed: the kubernetes sinks use the new one now, the "
                "sources that read the API keep the running one until a restart"
            )
            return None, None
        retired, self.kube_api = self.kube_api, wanted
        return wanted, retired


def _warn_about_config(settings: Settings) -> None:
    # A warning, not a refusal: the agent works, but a secret is exposed to more than it.
    for warning in config_warnings(settings):
        log.warning("a secret is less private than it should be", problem=warning)
