"""What the agent is composed of besides its loop: the sources it reads (as its settings ask) and
its one way to the API server. watcher/app.py wires these; this module decides which there are.
A new source is its module (watcher/sources/), its settings, and one statement in `sources_of`."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from watcher.backoff import Backoff
from watcher.cycle.notifier import Notifier
from watcher.kubeapi.settings import ConnectionSettings
from watcher.settings import Settings, pods_api_socket
from watcher.sinks.base import BaseSinkSettings, KeyValue, Sink
from watcher.sinks.registry import build_sinks
from watcher.sources.base import Source
from watcher.sources.pods_api.source import PodsApiSource

if TYPE_CHECKING:
    # Imported where the API server is used, not before: the agent's RSS is budgeted.
    from watcher.kubeapi.api import KubeApi
    from watcher.sinks.kubernetes import KubernetesSinkSettings

__all__ = ["kube_api_of", "sinks_of", "sources_of"]


def kube_api_of(settings: Settings, running: KubeApi | None = None) -> KubeApi | None:
    """The agent's one way to the API server, or None where it does not read it: `[kubernetes] api`
    auto (with a kubernetes sink) or on; connected as `[kubernetes]` says, or, with its connection
    fields left unset, as the first kubernetes sink's own fields say. `running`: kept (a reload)
    while the connection is the same."""
    k = settings.kubernetes
    kube = _kubernetes_sinks(settings.sinks)
    if k.api == "off" or (k.api == "auto" and not kube):
        return None
    connection: ConnectionSettings = kube[0] if kube and k.connection_is_default() else k
    if running is not None and running.connection.connection_fields() == connection.connection_fields():
        return running
    from watcher.kubeapi.api import KubeApi

    manager = kube[0].reporting_controller if kube else "pod-resources-watcher"
    return KubeApi(connection, field_manager=manager)


def sources_of(
    settings: Settings,
    kube_api: KubeApi | None,
    notifier: Notifier,
    stop: asyncio.Event,
    rng: random.Random,
) -> list[Source]:
    """What the agent reads besides pod-resources, as its settings ask. A new source is its
    module (watcher/sources/), its settings, and one statement here. Tests and embedders add
    theirs with `Agent(settings, sources=[...])`."""
    sources: list[Source] = []
    if settings.pods.api:  # the kubelet's Pods API: pod changes as they happen, and what pods are
        sources.append(_pods_api_source(settings, notifier, stop, rng))
    if settings.resource_slices.enabled and kube_api is not None:
        from watcher.sources.resource_slices import ResourceSliceTaints  # imported where used: RSS

        sources.append(
            ResourceSliceTaints(
                kube_api,
                node=settings.node,
                interval=settings.resource_slices.interval,
                trigger=notifier.trigger,
                stop=stop,
            )
        )
    if settings.device_taint_rules.enabled and kube_api is not None:
        from watcher.sources.device_taint_rules import DeviceTaintRules  # imported where used: RSS

        sources.append(
            DeviceTaintRules(
                kube_api, interval=settings.device_taint_rules.interval, trigger=notifier.trigger, stop=stop
            )
        )
    if settings.expected.configured and kube_api is not None:  # nothing read without an expectation
        from watcher.sources.node_expected import NodeExpectations  # imported where used: RSS

        sources.append(
            NodeExpectations(
                kube_api, node=settings.node, settings=settings.expected, trigger=notifier.trigger, stop=stop
            )
        )
    return sources


def sinks_of(settings: Settings, store: KeyValue, kube_api: KubeApi | None) -> list[Sink]:
    """The sinks the settings configure; a kubernetes sink shares `kube_api` with the sources."""
    return build_sinks(
        settings.sinks, node=settings.node, state_dir=settings.state_dir, store=store, kube_api=kube_api
    )


def _pods_api_source(
    settings: Settings, notifier: Notifier, stop: asyncio.Event, rng: random.Random
) -> PodsApiSource:
    return PodsApiSource(
        pods_api_socket(settings),
        labels=settings.pods.labels,
        trigger=notifier.trigger,
        watches=notifier.watches,
        backoff=Backoff(base=0.5, cap=30.0, rng=rng),
        stop=stop,
        on_state=notifier.pods_api_state,  # its stream's end: a restart, at once
        timeout=settings.kubelet.timeout,
        snapshot_timeout=settings.pods.snapshot_timeout,
        resync_interval=settings.pods.resync_interval,
    )


def _kubernetes_sinks(configs: Sequence[BaseSinkSettings]) -> list[KubernetesSinkSettings]:
    """The kubernetes sinks among `configs`. Their settings class exists only once its module is
    imported (the registry imports it for such a sink), so with none configured nothing is imported."""
    module = sys.modules.get("watcher.sinks.kubernetes.settings")
    if module is None:
        return []
    return [s for s in configs if isinstance(s, module.KubernetesSinkSettings)]
