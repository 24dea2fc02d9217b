"""The kubernetes sink's Events: each one's `regarding` (with its object's uid, or skipped when
its pod is gone or replaced), created once per batch, or its series updated when it repeats."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import structlog

from watcher.kubeapi.client import RefusedError, call
from watcher.ratelimit import RateLimiter
from watcher.sinks.kubernetes.planner import KubeEvent
from watcher.sinks.kubernetes.settings import KubernetesSinkSettings

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = ["EventWriter", "fresh_records"]

log = structlog.get_logger("watcher.sinks.kubernetes")


class EventWriter:
    """Writes one sink's Events through its client and limiter. `records` (Event key -> the
    Event written and its count) are the caller's, saved with its state between writes."""

    def __init__(
        self,
        settings: KubernetesSinkSettings,
        *,
        node: str,
        limiter: RateLimiter,
        api: Callable[[], AsyncClient],
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.limiter = limiter
        self._api = api
        # The Node's uid for its Events: read once, or learnt from the sink's reads of the node.
        self.node_uid: str | None = None
        self._warned: set[str] = set()

    async def emit(self, kube_event: KubeEvent, records: dict[str, Any], batch: str) -> None:
        """Create the Event, or update its series if it is a repeat. A refusal of this one Event
        for good (a 4xx but the retryable ones and a 403 of our permissions) is logged and skipped:
        one pod's Event (its namespace being deleted, a name the API server will not take) never
        holds up the rest."""
        try:
            await self._write(kube_event, records, batch)
        except RefusedError as err:
            if err.retryable:
                raise
            if err.status == 403 and "being terminated" not in err.message:
                # Not this pod's namespace going away but our permissions: every Event would meet
                # it, so the batch fails where `outbox list` shows it, not one skip at a time.
                raise
            log.error(
                "the API server refused an Event for good; it is skipped",
                sink=self.name,
                reason=kube_event.reason,
                regarding=f"{kube_event.regarding.namespace}/{kube_event.regarding.name}",
                error=str(err),
            )

    async def _write(self, kube_event: KubeEvent, records: dict[str, Any], batch: str) -> None:
        from lightkube.resources.events_v1 import Event as ApiEvent

        # When it happened (the agent's observation), not when it is delivered: a batch that waited
        # out an API server outage must not date the failure at its delivery.
        seen = kube_event.observed
        if seen.microsecond == 0:
            # lightkube's encoder drops an all-zero fraction, and the API server refuses a MicroTime
            # without its six digits: one microsecond later is the same moment to anyone reading.
            seen += timedelta(microseconds=1)
        now = datetime.now(UTC).timestamp()
        record = records.get(kube_event.key)
        namespace = kube_event.regarding.namespace or self.settings.event_namespace
        if record is not None:
            count = int(record["count"]) + 1
            patch = {"series": {"count": count, "lastObservedTime": _micro(seen)}}
            try:
                await call(
                    self.limiter,
                    self._api().patch(
                        ApiEvent, record["name"], patch, namespace=record["namespace"], patch_type=_merge()
                    ),
                )
                records[kube_event.key] = {**record, "count": count, "last": now}
                return
            except RefusedError as err:
                if err.status != 404:
                    raise
                # Gone (the API server's event TTL): a new Event starts a new series.
        regarding = await self._regarding(kube_event)
        if regarding is None:
            return
        # Named after the batch, so a retried batch meets its own Event (409) instead of making two.
        # The object's part is cut to leave room and must not end in '-' or '.' (an invalid name).
        suffix = hashlib.sha256(f"{kube_event.key}:{batch}".encode()).hexdigest()[:16]
        name = f"{kube_event.regarding.name[:200].rstrip('-.')}.{suffix}"
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": _micro(seen),
            "reportingController": self.settings.reporting_controller,
            "reportingInstance": self.node[:128],
            "action": kube_event.action,
            "reason": kube_event.reason,
            "type": kube_event.type,
            "note": kube_event.note,
            "regarding": regarding,
        }
        try:
            await call(self.limiter, self._api().create(cast(ApiEvent, ApiEvent.from_dict(body))))
        except RefusedError as err:
            if err.status != 409:
                raise
            # 409 AlreadyExists: this batch created it before it was interrupted.
        records[kube_event.key] = {"name": name, "namespace": namespace, "count": 1, "last": now}

    async def _regarding(self, kube_event: KubeEvent) -> dict[str, Any] | None:
        """The Event's `regarding`, with the object's uid (kubectl describe matches Events by it):
        the one the agent's events carried (then no read), else read from the pod; None when the
        pod it is about is not there any more: gone, or replaced by another pod of the same name
        (elsewhere, or created after what happened), which must not be blamed."""
        from lightkube.resources.core_v1 import Node, Pod

        r = kube_event.regarding
        if r.kind == "Node":
            if self.node_uid is None:
                node = await call(self.limiter, self._api().get(Node.Status, self.node))
                self.node_uid = node.metadata.uid
            return {"apiVersion": "v1", "kind": "Node", "name": r.name, "uid": self.node_uid}
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": r.namespace, "name": r.name}
        if r.uid:
            # The uid the kubelet's Pods API gave when it happened names that very pod: no read,
            # and no other pod of the same name (recreated since, elsewhere) can be blamed.
            return {**ref, "uid": r.uid}
        where = f"{r.namespace}/{r.name}"
        try:
            pod = await call(self.limiter, self._api().get(Pod, r.name, namespace=r.namespace))
        except RefusedError as err:
            if err.status == 404:
                log.info("pod is gone; its Event is skipped", sink=self.name, pod=where)
                return None
            if err.status != 403:
                raise
            self._warn_once(
                "pods",
                "cannot read pods (RBAC get on pods): the pods' Events carry no uid, so "
                "`kubectl describe pod` will not show them (`kubectl get events` does)",
                error=str(err),
            )
            return ref
        node = pod.spec.nodeName if pod.spec is not None else None
        created = pod.metadata.creationTimestamp if pod.metadata is not None else None
        if node != self.node or (
            isinstance(created, datetime) and created > kube_event.observed + timedelta(seconds=1)
        ):
            log.info(
                "the pod of that name now is another pod (on another node, or newer than what "
                "happened); its Event is skipped",
                sink=self.name,
                pod=where,
                pod_node=node,
            )
            return None
        return {**ref, "uid": pod.metadata.uid}

    def _warn_once(self, what: str, message: str, **fields: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, sink=self.name, **fields)


def _micro(moment: datetime) -> str:
    """A MicroTime: RFC 3339 with exactly six fractional digits (the API server refuses others)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE


def fresh_records(records: Mapping[str, Any], window: float) -> dict[str, Any]:
    """The Event records still inside the series window (older ones start a new Event anyway)."""
    cutoff = datetime.now(UTC).timestamp() - window
    return {k: v for k, v in records.items() if isinstance(v, Mapping) and float(v.get("last", 0)) >= cutoff}
