"""The kubernetes sink: a batch of our events planned (`planner`), the owned conditions written
first (`conditions`), then the Events (`events`), with the state that needs (the missing devices,
the Events written, how far a batch got) kept in the outbox's key-value store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.client import KubernetesError, RefusedError
from watcher.kubeapi.kubeconfig import check_client_config, clear_text_warning
from watcher.model.events import Event
from watcher.sinks.base import Capabilities, KeyValue, Outcome, SinkContext
from watcher.sinks.kubernetes.condition_plan import NodeCondition, conditions_for, shared_types
from watcher.sinks.kubernetes.conditions import condition_patch, taken_types, write_conditions
from watcher.sinks.kubernetes.episodes import MISSING, REJECTING
from watcher.sinks.kubernetes.events import EventWriter, fresh_records
from watcher.sinks.kubernetes.planner import Missing, plan
from watcher.sinks.kubernetes.refusals import refused_outcome
from watcher.sinks.kubernetes.settings import KubernetesSinkSettings, check_settings
from watcher.sinks.registry import SinkType, register

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = ["KubernetesSink"]

log = structlog.get_logger("watcher.sinks.kubernetes")


class KubernetesSink:
    def __init__(
        self, settings: KubernetesSinkSettings, *, node: str, store: KeyValue, api: KubeApi | None = None
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.store = store
        # The agent's one KubeApi when it hands one over (its sources share the client and the
        # limiter); else one of the sink's own, from its connection fields, which the sink closes.
        self._own_api = api is None
        self.kube_api = (
            api if api is not None else KubeApi(settings, field_manager=settings.reporting_controller)
        )
        self.limiter = self.kube_api.limiter
        self._lock = asyncio.Lock()
        self._events = EventWriter(settings, node=node, limiter=self.limiter, api=self._api)

    @property
    def _key(self) -> str:
        return f"kubernetes:{self.name}:state"

    def _api(self) -> AsyncClient:
        return self.kube_api.client()

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        async with self._lock:
            try:
                self._api()
            except KubernetesError as err:
                return Outcome(retry=True, error=str(err))
            state: dict[str, Any] = dict(await self.store.kv_get(self._key) or {})
            applied = int(state.get("applied", 0))
            fresh = [e for e in events if e.seq > applied]
            if len(fresh) < len(events):
                # Applied before (a redelivery after a lost ack) or older than what is applied (a
                # dead letter put back): applying it again would say what is no longer true.
                log.info(
                    "events already applied or superseded are not applied again",
                    sink=self.name,
                    seqs=[e.seq for e in events if e.seq <= applied][:20],
                    applied=applied,
                )
            if not fresh:
                return Outcome.ok()
            batch = f"{fresh[0].id}:{fresh[-1].id}"
            progress = state.get("progress") or {}
            resumed = progress.get("batch") == batch
            # A batch retried half-way is planned from the state it started from, as the first time.
            base: Missing = (progress.get("base") if resumed else state.get("missing")) or {}
            done: list[str] = list(progress.get("done", [])) if resumed else []
            report = plan(fresh, base)
            # Fewer devices than expected: its own condition, kept beside the missing devices so
            # that every write (and a start's prune) carries it.
            short = MISSING.after(fresh, state.get("short") or {})
            short_moved = short != (state.get("short") or {})
            # A node that keeps rejecting a resource's pods: its own condition, kept beside the
            # missing devices so that every write (and a start's prune) carries it.
            rejecting = REJECTING.after(fresh, state.get("rejecting") or {})
            rejecting_moved = rejecting != (state.get("rejecting") or {})
            records: dict[str, Any] = fresh_records(state.get("events") or {}, self.settings.series_window)

            async def save(**more: Any) -> None:
                await self.store.kv_set(
                    self._key,
                    {
                        "applied": applied,
                        "missing": report.missing,
                        "short": short,
                        "rejecting": rejecting,
                        "events": records,
                        "progress": {"batch": batch, "done": done, "base": base},
                        **more,
                    },
                )

            try:
                # The condition first: one write, and what remediation acts on; a mass failure's
                # Events (one per pod hit, each a read and a write at api_rate) follow. Its state
                # is saved at once, so the store never disagrees with what the node says.
                moved = rejecting_moved or short_moved
                if self.settings.conditions and (report.resources or report.started or moved):
                    overrides = self.settings.condition_types
                    shared = shared_types(report.resources | set(report.missing), overrides)
                    if shared:
                        # Each shared condition says all of its resources (True while any of them
                        # has a device missing); which resource is which is for the config to say.
                        log.error(
                            "config error: resources share a Node condition type; give each its own "
                            "with condition_types",
                            sink=self.name,
                            shared=shared,
                        )
                    wanted = conditions_for(report.missing, report.resources, overrides)
                    wanted += MISSING.conditions(short)
                    wanted += REJECTING.conditions(rejecting)
                    await self._apply(wanted, prune=report.started)
                await save()
                if self.settings.events:
                    for kube_event in report.events:
                        if kube_event.key in done:
                            continue  # written before this batch was interrupted
                        await self._events.emit(kube_event, records, batch)
                        done.append(kube_event.key)
                        await save()
            except RefusedError as err:
                return refused_outcome(err, "Kubernetes API")
            applied = fresh[-1].seq
            await save(progress={})
        return Outcome.ok()

    async def _apply(self, wanted: Sequence[NodeCondition], *, prune: bool) -> None:
        """Make the node's owned conditions say `wanted`; with `prune`, owned conditions of
        resources no longer reported are removed. One write at most, none when nothing changes."""
        taken: list[str] = []

        def patch_of(current: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
            taken[:] = taken_types(current, wanted)
            return condition_patch(current, wanted, prune=prune, now=datetime.now(UTC))

        node, patch = await write_conditions(self._api(), self.limiter, self.node, patch_of)
        self._events.node_uid = node.metadata.uid
        if taken:
            log.error(
                "another writer has a Node condition of the type this agent would write: left as it "
                "is, and this agent's condition for it not written; give the resource a type of its "
                "own with condition_types. If an earlier build of this agent wrote it (its message has "
                "no 'pod-resources-watcher: ' mark), delete that condition once: this build never "
                "changes an unmarked one",
                sink=self.name,
                node=self.node,
                types=taken,
            )
        if patch:
            log.info(
                "node conditions written",
                sink=self.name,
                conditions={c.get("type"): c.get("status", "removed") for c in patch},
            )

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        if self._own_api:  # a shared one is the agent's to close: its sources still use it
            await self.kube_api.close()


def _check(path: str, settings: KubernetesSinkSettings) -> None:
    check_settings(path, settings)
    check_client_config(path, settings)  # last: the one check that reads files


def _warnings(path: str, settings: KubernetesSinkSettings) -> list[str]:
    warning = clear_text_warning(settings)
    key = "kubeconfig" if settings.kubeconfig is not None else "server"
    return [] if warning is None else [f"{path}.{key}: {warning}"]


def _kubernetes_sink(settings: KubernetesSinkSettings, context: SinkContext) -> KubernetesSink:
    # The agent's client only where it reaches the API server as this sink would: a second sink
    # with a connection of its own (another cluster, other credentials) keeps its own client.
    shared = context.kube_api
    if (
        not isinstance(shared, KubeApi)
        or shared.connection.connection_fields() != settings.connection_fields()
    ):
        shared = None
    api = shared
    return KubernetesSink(settings, node=context.node, store=context.store, api=api)


register(
    SinkType(
        name="kubernetes",
        settings=KubernetesSinkSettings,
        factory=_kubernetes_sink,
        validate=_check,
        warnings=_warnings,
        # pages: it must see the end of every condition it starts; notifies: people read its Events,
        # so a flapping device's single changes are left out (device.flapping says it once);
        # each_device: a mass failure's devices still come one by one, for the Pods' own Events.
        capabilities=Capabilities(pages=True, notifies=True, each_device=True),
        order=70,
    )
)
