"""Kubernetes: Events on the affected Pods and the Node, and the Node conditions the agent owns.

What to report is decided in `watcher.model.kube_reports`; this module makes the API calls, keeps the
state they need (the missing devices behind the conditions, the Events already created so a repeat
updates its series) in the outbox's key-value store, and turns the API server's answers into outcomes:

- 429 and 5xx are retried, 429's Retry-After honoured (through the delivery worker, like every sink);
- 409 on the node status (someone else wrote it since we read it) is re-read and re-applied;
- 401: the client re-reads the service-account token file (rotated about hourly) and tries again
  once; still refused, the delivery is retried later, as a rotation may be under way;
- an Event refused for good (422: a name the API server will not take; its namespace being
  deleted) is logged and skipped, never holding up the others; a refusal of our permissions (403) or
  of the condition write is permanent and its message says what to fix.
- a batch already applied (seq at or below the last one applied: redelivered, or a dead letter put
  back) is not applied again.

Requests go out at most `api_rate` per second, whatever the batch: the API server is shared by the
whole cluster. A batch that fails half-way is retried without creating its Events twice: the keys of
those already written are saved as they are written.

The client library (lightkube) is imported when the sink is first used, so an agent without this
sink pays nothing for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import structlog

from watcher.config import ConfigError, field_meta
from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.model.kube_reports import (
    CONDITION_SUFFIX,
    KubeEvent,
    Missing,
    NodeCondition,
    check_condition_type,
    conditions_for,
    plan,
)
from watcher.ratelimit import RateLimiter
from watcher.secrets import redact
from watcher.sinks.base import BaseSinkSettings, Capabilities, KeyValue, Outcome, SinkContext
from watcher.sinks.http import parse_retry_after
from watcher.sinks.registry import SinkType, register

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = [
    "KubernetesSink",
    "KubernetesSinkSettings",
    "KubernetesError",
    "connect",
    "remove_owned_conditions",
    "SERVICE_ACCOUNT_DIR",
]

log = structlog.get_logger("watcher.sinks.kubernetes")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Answers worth another try later: unauthorized (a token rotating), timeout, conflict, too many requests.
_RETRYABLE = (401, 408, 409, 429)
# Re-reads and re-applies of the node status when someone else keeps writing it.
CONFLICT_RETRIES = 5
# The kinds the conditions are built from: a sink whose `kinds` left these out would report
# conditions that never clear, so check-config refuses that.
_NEEDED_KINDS = (
    Kind.WATCHER_STARTED,
    Kind.DEVICE_REMOVED,
    Kind.DEVICE_ADDED,
    Kind.DEVICE_FLAPPING,
    Kind.DEVICE_FLAP_ENDED,
    Kind.DEVICE_INCIDENT,
)


@dataclass(frozen=True)
class KubernetesSinkSettings(BaseSinkSettings):
    kubeconfig: Path | None = field(
        default=None,
        metadata=field_meta(
            "A kubeconfig file to connect with (the systemd deployment). Unset: in-cluster, with the "
            "pod's service-account token (re-read as it rotates) and CA from service_account_dir."
        ),
    )
    context: str | None = field(
        default=None, metadata=field_meta("The kubeconfig context to use (unset: its current-context).")
    )
    server: str | None = field(
        default=None,
        metadata=field_meta(
            "In-cluster only: the API server URL. Unset: https://$KUBERNETES_SERVICE_HOST:"
            "$KUBERNETES_SERVICE_PORT, as Kubernetes sets them in every pod."
        ),
    )
    service_account_dir: Path = field(
        default=SERVICE_ACCOUNT_DIR,
        metadata=field_meta("In-cluster only: where the service-account token, ca.crt and namespace are."),
    )
    events: bool = field(
        default=True, metadata=field_meta("Create Events on the affected Pods and the Node.")
    )
    conditions: bool = field(
        default=True, metadata=field_meta("Keep one Node condition per device resource (see the README).")
    )
    condition_types: Mapping[str, str] = field(
        default_factory=dict,
        metadata=field_meta(
            "Condition type per resource, overriding the derived one (nvidia.com/gpu -> "
            f"NvidiaGpu{CONDITION_SUFFIX}); every type must end in {CONDITION_SUFFIX!r}."
        ),
    )
    event_namespace: str = field(
        default="default",
        metadata=field_meta("Namespace of the Node's Events (a Node has none; kubectl looks in default)."),
    )
    reporting_controller: str = field(
        default="pod-resources-watcher",
        metadata=field_meta("The Events' reportingController; reportingInstance is the node name."),
    )
    api_rate: float = field(
        default=5.0,
        metadata=field_meta("Most API requests per second, whatever the batch.", min=0.1, max=100),
    )
    series_window: float = field(
        default=1800.0,
        metadata=field_meta(
            "Seconds within which a repeat of the same Event updates its series instead of creating "
            "another (keep under the API server's event TTL, 1 h by default).",
            min=1,
            max=86400,
        ),
    )
    timeout: float = field(
        default=10.0, metadata=field_meta("API request timeout, seconds.", min=0.1, max=300)
    )
    # One delivery per re-query, whole: a mass failure becomes one Event per pod, one condition write.
    group: Literal["none", "cycle", "window"] = field(
        default="cycle",
        metadata=field_meta("cycle (default): one delivery per re-query; see the other sinks for the rest."),
    )
    max_batch: int = field(
        default=1000, metadata=field_meta("Most events in one delivery.", min=1, max=10000)
    )
    type: Literal["kubernetes"] = "kubernetes"


def _check(path: str, s: KubernetesSinkSettings) -> None:
    from fnmatch import fnmatchcase

    for kind in _NEEDED_KINDS:
        if not any(fnmatchcase(str(kind), p) for p in s.kinds):
            raise ConfigError(
                f"{path}.kinds: must let {kind} through: the Node conditions are built from "
                + ", ".join(str(k) for k in _NEEDED_KINDS)
            )
    for key in ("resources", "namespaces"):
        if getattr(s, key) != ("*",):
            raise ConfigError(
                f'{path}.{key}: must stay ["*"] for a kubernetes sink: its conditions are reconciled '
                "from events that name no resource or namespace"
            )
    if s.min_severity != "info":
        raise ConfigError(
            f'{path}.min_severity: must stay "info" for a kubernetes sink (it reconciles at start)'
        )
    for resource, ctype in s.condition_types.items():
        problem = check_condition_type(ctype)
        if problem is not None:
            raise ConfigError(f"{path}.condition_types.{resource}: {problem}")
    if s.event_namespace not in ("default", "kube-system"):
        raise ConfigError(
            f"{path}.event_namespace: the API server keeps Events about a Node (which has no namespace) "
            'only in "default" or "kube-system"'
        )
    if not _QUALIFIED.fullmatch(s.reporting_controller):
        raise ConfigError(
            f"{path}.reporting_controller: not a qualified name (e.g. example.com/pod-resources-watcher)"
        )
    if s.kubeconfig is not None and s.server is not None:
        raise ConfigError(f"{path}.server: only for in-cluster use; the kubeconfig names its server")


# What the API server takes as an Event's reportingController: [DNS subdomain "/"] name.
_QUALIFIED = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


class KubernetesError(Exception):
    """The Kubernetes API could not be reached or configured; the message says what to do."""


# --- connecting ---


def connect(settings: KubernetesSinkSettings) -> AsyncClient:
    """A client for the settings: the kubeconfig, or in-cluster from the service-account files."""
    import httpx2
    from lightkube import AsyncClient, KubeConfig
    from lightkube import ConfigError as LightkubeConfigError
    from lightkube.config.models import Cluster, User

    try:
        if settings.kubeconfig is not None:
            config = KubeConfig.from_file(settings.kubeconfig)
            single = config.get(context_name=settings.context)
        else:
            directory = settings.service_account_dir
            token = directory / "token"
            if not token.is_file():
                raise KubernetesError(
                    f"no service-account token at {token}: not running in a pod with a token "
                    "(apply the kubernetes-reporting overlay), or set kubeconfig"
                )
            server = settings.server or _in_cluster_server()
            namespace = directory / "namespace"
            config = KubeConfig.from_one(
                cluster=Cluster(server=server, certificate_auth=str(directory / "ca.crt")),
                # token_file: read per request and again on a 401, as the kubelet rotates it.
                user=User(token_file=str(token)),
                namespace=namespace.read_text().strip() if namespace.is_file() else "default",
            )
            single = config.get()
    except (LightkubeConfigError, OSError, ValueError, KeyError) as err:
        raise KubernetesError(f"cannot load the Kubernetes client configuration: {err}") from err
    if single is None:
        raise KubernetesError(f"kubeconfig {settings.kubeconfig} has no usable context")
    return AsyncClient(
        config=single,
        timeout=httpx2.Timeout(settings.timeout),
        field_manager=settings.reporting_controller.replace("/", "-")[:128],
        trust_env=False,  # never a proxy from the environment between us and the API server
        lazy=False,
    )


def _in_cluster_server() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubernetesError(
            "KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?): set server or kubeconfig"
        )
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


# --- answers ---


@dataclass
class _RefusedError(Exception):
    """The API server answered a request with an error status (or did not answer: status None)."""

    status: int | None
    message: str
    retry_after: float | None = None

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}" if self.status else self.message


async def _call(limiter: RateLimiter, request: Awaitable[Any]) -> Any:
    """One API request, paced, its failure as _RefusedError."""
    import httpx2
    from lightkube import ApiError

    await limiter.acquire()
    try:
        return await request
    except ApiError as err:
        retry_after = parse_retry_after(err.response.headers.get("Retry-After")) if err.response else None
        code = err.status.code if err.status is not None else None
        message = (err.status.message if err.status is not None else None) or str(err)
        raise _RefusedError(code, message, retry_after) from err
    except httpx2.HTTPStatusError as err:  # an error answer that is not a Status object (a proxy's)
        response = err.response
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        raise _RefusedError(response.status_code, redact(response.text[:200]), retry_after) from err
    except (httpx2.HTTPError, OSError, ValueError) as err:
        raise _RefusedError(None, f"{type(err).__name__}: {err}") from err
    finally:
        # The slot counts from the answer: the server saw the request somewhere between the slot
        # and now, and only now keeps every one-second window at the server within the rate.
        limiter.answered(1)


def _outcome(err: _RefusedError, what: str) -> Outcome:
    error = f"{what}: {err}"
    # 409 reaches here only after CONFLICT_RETRIES re-reads: someone keeps writing the node; later.
    if err.status is None or err.status in _RETRYABLE or err.status >= 500:
        return Outcome(retry=True, retry_after=err.retry_after, status=err.status, error=error)
    if err.status == 403:
        error += (
            " (the service account lacks this permission, or the admission policy refused it: "
            "apply deploy/overlays/kubernetes-reporting and check the node name)"
        )
    if err.status == 404:
        error += " (no such node in the API server: the agent's `node` must be the Kubernetes node name)"
    return Outcome(status=err.status, error=error)


def _micro(moment: datetime) -> str:
    """A MicroTime: RFC 3339 with exactly six fractional digits (the API server refuses others)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the sink ---


class KubernetesSink:
    def __init__(self, settings: KubernetesSinkSettings, *, node: str, store: KeyValue) -> None:
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.store = store
        self.limiter = RateLimiter(settings.api_rate)
        self._client: AsyncClient | None = None
        self._node_uid: str | None = None
        self._lock = asyncio.Lock()
        self._warned: set[str] = set()

    @property
    def _key(self) -> str:
        return f"kubernetes:{self.name}:state"

    def _api(self) -> AsyncClient:
        if self._client is None:
            self._client = connect(self.settings)
        return self._client

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
            records: dict[str, Any] = _fresh(state.get("events") or {}, self.settings.series_window)

            async def save(**more: Any) -> None:
                await self.store.kv_set(
                    self._key,
                    {
                        "applied": applied,
                        "missing": report.missing,
                        "events": records,
                        "progress": {"batch": batch, "done": done, "base": base},
                        **more,
                    },
                )

            try:
                # The condition first: one write, and what remediation acts on; a mass failure's
                # Events (one per pod hit, each a read and a write at api_rate) follow. Its state
                # is saved at once, so the store never disagrees with what the node says.
                if self.settings.conditions and (report.resources or report.started):
                    wanted = conditions_for(report.missing, report.resources, self.settings.condition_types)
                    await self._apply(wanted, prune=report.started)
                await save()
                if self.settings.events:
                    for kube_event in report.events:
                        if kube_event.key in done:
                            continue  # written before this batch was interrupted
                        await self._emit(kube_event, records, batch)
                        done.append(kube_event.key)
                        await save()
            except _RefusedError as err:
                return _outcome(err, "Kubernetes API")
            applied = fresh[-1].seq
            await save(progress={})
        return Outcome.ok()

    # -- events --

    async def _regarding(self, kube_event: KubeEvent) -> dict[str, Any] | None:
        """The Event's `regarding`, with the object's uid (kubectl describe matches Events by it);
        None when the pod it is about is not there any more: gone, or replaced by another pod of
        the same name (elsewhere, or created after what happened), which must not be blamed."""
        from lightkube.resources.core_v1 import Node, Pod

        r = kube_event.regarding
        if r.kind == "Node":
            if self._node_uid is None:
                node = await _call(self.limiter, self._api().get(Node.Status, self.node))
                self._node_uid = node.metadata.uid
            return {"apiVersion": "v1", "kind": "Node", "name": r.name, "uid": self._node_uid}
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": r.namespace, "name": r.name}
        where = f"{r.namespace}/{r.name}"
        try:
            pod = await _call(self.limiter, self._api().get(Pod, r.name, namespace=r.namespace))
        except _RefusedError as err:
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

    async def _emit(self, kube_event: KubeEvent, records: dict[str, Any], batch: str) -> None:
        """Create the Event, or update its series if it is a repeat. A refusal of this one Event
        for good (a 4xx but the retryable ones and a 403 of our permissions) is logged and skipped:
        one pod's Event (its namespace being deleted, a name the API server will not take) never
        holds up the rest."""
        try:
            await self._write_event(kube_event, records, batch)
        except _RefusedError as err:
            if err.status is None or err.status in _RETRYABLE or err.status >= 500:
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

    async def _write_event(self, kube_event: KubeEvent, records: dict[str, Any], batch: str) -> None:
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
                await _call(
                    self.limiter,
                    self._api().patch(
                        ApiEvent, record["name"], patch, namespace=record["namespace"], patch_type=_merge()
                    ),
                )
                records[kube_event.key] = {**record, "count": count, "last": now}
                return
            except _RefusedError as err:
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
            await _call(self.limiter, self._api().create(cast(ApiEvent, ApiEvent.from_dict(body))))
        except _RefusedError as err:
            if err.status != 409:
                raise
            # 409 AlreadyExists: this batch created it before it was interrupted.
        records[kube_event.key] = {"name": name, "namespace": namespace, "count": 1, "last": now}

    # -- conditions --

    async def _apply(self, wanted: Sequence[NodeCondition], *, prune: bool) -> None:
        """Make the node's owned conditions say `wanted`; with `prune`, owned conditions of
        resources no longer reported are removed. One write at most, none when nothing changes."""
        node, patch = await _write_conditions(
            self._api(),
            self.limiter,
            self.node,
            lambda current: _condition_patch(current, wanted, prune=prune, now=datetime.now(UTC)),
        )
        self._node_uid = node.metadata.uid
        if patch:
            log.info(
                "node conditions written",
                sink=self.name,
                conditions={c.get("type"): c.get("status", "removed") for c in patch},
            )

    def _warn_once(self, what: str, message: str, **fields: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, sink=self.name, **fields)

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE


def _strategic() -> Any:
    from lightkube.types import PatchType

    return PatchType.STRATEGIC


def _fresh(records: Mapping[str, Any], window: float) -> dict[str, Any]:
    """The Event records still inside the series window (older ones start a new Event anyway)."""
    cutoff = datetime.now(UTC).timestamp() - window
    return {k: v for k, v in records.items() if isinstance(v, Mapping) and float(v.get("last", 0)) >= cutoff}


def _conditions_of(node: Any) -> dict[str, dict[str, Any]]:
    status = node.status
    out = {}
    for c in (status.conditions if status is not None else None) or []:
        out[c.type] = {
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": c.lastTransitionTime,
        }
    return out


def _condition_patch(
    current: Mapping[str, Mapping[str, Any]], wanted: Sequence[NodeCondition], *, prune: bool, now: datetime
) -> list[dict[str, Any]]:
    """The strategic-merge list items (merged by `type`) that bring `current` to `wanted`."""
    out: list[dict[str, Any]] = []
    for c in wanted:
        have = current.get(c.type)
        if have is not None and (have["status"], have["reason"], have["message"]) == (
            c.status,
            c.reason,
            c.message,
        ):
            continue
        # lastTransitionTime changes only with the status: a new message for a condition that stays
        # True keeps the time it became True.
        since = have["lastTransitionTime"] if have is not None and have["status"] == c.status else None
        since_text = (
            _seconds(since) if isinstance(since, datetime) else (str(since) if since else _seconds(now))
        )
        out.append(
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastHeartbeatTime": _seconds(now),
                "lastTransitionTime": since_text,
            }
        )
    if prune:
        keep = {c.type for c in wanted}
        for ctype in sorted(current):
            if ctype.endswith(CONDITION_SUFFIX) and ctype not in keep:
                out.append({"type": ctype, "$patch": "delete"})
    return out


async def remove_owned_conditions(
    settings: KubernetesSinkSettings, nodes: Sequence[str] | None
) -> dict[str, list[str]]:
    """Remove every condition the agent owns (type ending in the suffix) from `nodes` (None: every
    node, which needs `list` on nodes): the uninstall step. Returns node -> the types removed.
    Raises KubernetesError saying what went wrong."""
    from lightkube.resources.core_v1 import Node

    client = connect(settings)
    limiter = RateLimiter(settings.api_rate)
    out: dict[str, list[str]] = {}
    try:
        if nodes is None:
            await limiter.acquire()
            nodes = sorted(
                [n.metadata.name async for n in client.list(Node) if n.metadata and n.metadata.name]
            )
        for node in nodes:
            out[node] = await _remove_owned(client, limiter, node)
        return out
    except _RefusedError as err:
        raise KubernetesError(_outcome(err, "removing the conditions").error) from err
    except Exception as err:  # the listing's errors come unwrapped
        import httpx2
        from lightkube import ApiError

        if isinstance(err, ApiError):
            raise KubernetesError(f"listing the nodes: {err.status.message}") from err
        if isinstance(err, httpx2.HTTPError | OSError):
            raise KubernetesError(f"listing the nodes: {type(err).__name__}: {err}") from err
        raise
    finally:
        await client.close()


async def _remove_owned(client: AsyncClient, limiter: RateLimiter, node: str) -> list[str]:
    def deletions(current: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [{"type": t, "$patch": "delete"} for t in sorted(current) if t.endswith(CONDITION_SUFFIX)]

    _, patch = await _write_conditions(client, limiter, node, deletions)
    return [str(item["type"]) for item in patch]


async def _write_conditions(
    client: AsyncClient,
    limiter: RateLimiter,
    node: str,
    patch_of: Callable[[Mapping[str, Mapping[str, Any]]], list[dict[str, Any]]],
) -> tuple[Any, list[dict[str, Any]]]:
    """Read the node's status, patch its conditions with what `patch_of` makes of the current ones
    (strategic merge, merged by `type`; nothing when it makes nothing), carrying the
    resourceVersion read: if someone wrote the node in between (409), read again and re-apply.
    Returns the node as last read and the patch written."""
    from lightkube.resources.core_v1 import Node

    for _ in range(CONFLICT_RETRIES):
        got = await _call(limiter, client.get(Node.Status, node))
        patch = patch_of(_conditions_of(got))
        if not patch:
            return got, []
        body = {
            "metadata": {"resourceVersion": got.metadata.resourceVersion},
            "status": {"conditions": patch},
        }
        try:
            await _call(limiter, client.patch(Node.Status, node, body, patch_type=_strategic()))
            return got, patch
        except _RefusedError as err:
            if err.status != 409:
                raise
    raise _RefusedError(409, f"node {node} kept changing over {CONFLICT_RETRIES} writes")


def _kubernetes_sink(settings: KubernetesSinkSettings, context: SinkContext) -> KubernetesSink:
    return KubernetesSink(settings, node=context.node, store=context.store)


register(
    SinkType(
        name="kubernetes",
        settings=KubernetesSinkSettings,
        factory=_kubernetes_sink,
        validate=_check,
        # pages: it must see the end of every condition it starts; notifies: people read its Events,
        # so a flapping device's single changes are left out (device.flapping says it once);
        # each_device: a mass failure's devices still come one by one, for the Pods' own Events.
        capabilities=Capabilities(pages=True, notifies=True, each_device=True),
        order=70,
    )
)
