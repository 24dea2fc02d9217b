"""The Node conditions the agent owns, written: a strategic-merge patch of the node's status that
brings them to what `condition_plan` says (re-read and re-applied when someone else wrote the node
meanwhile), and their removal, the uninstall step. Owned means written by us (`is_owned`: our
suffix and our mark), never merely named like ours: another writer's condition is left as it is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from watcher.kubeapi.client import KubernetesError, RefusedError, call, connect
from watcher.ratelimit import RateLimiter
from watcher.sinks.kubernetes.condition_plan import NodeCondition, is_owned
from watcher.sinks.kubernetes.refusals import refused_outcome
from watcher.sinks.kubernetes.settings import KubernetesSinkSettings

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = [
    "CONFLICT_RETRIES",
    "condition_patch",
    "taken_types",
    "write_conditions",
    "remove_owned_conditions",
]

# Re-reads and re-applies of the node status when someone else keeps writing it.
CONFLICT_RETRIES = 5


def _seconds(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _strategic() -> Any:
    from lightkube.types import PatchType

    return PatchType.STRATEGIC


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


def taken_types(current: Mapping[str, Mapping[str, Any]], wanted: Sequence[NodeCondition]) -> list[str]:
    """The types in `wanted` that the node already has as another writer's condition."""
    return sorted(
        c.type for c in wanted if c.type in current and not is_owned(c.type, current[c.type]["message"])
    )


def condition_patch(
    current: Mapping[str, Mapping[str, Any]], wanted: Sequence[NodeCondition], *, prune: bool, now: datetime
) -> list[dict[str, Any]]:
    """The strategic-merge list items (merged by `type`) that bring `current` to `wanted`, but for
    the `taken_types`: another writer's condition is never rewritten. With `prune`, our own
    conditions that `wanted` no longer has are removed."""
    out: list[dict[str, Any]] = []
    taken = set(taken_types(current, wanted))
    for c in wanted:
        if c.type in taken:
            continue
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
            if is_owned(ctype, current[ctype]["message"]) and ctype not in keep:
                out.append({"type": ctype, "$patch": "delete"})
    return out


async def remove_owned_conditions(
    settings: KubernetesSinkSettings, nodes: Sequence[str] | None
) -> dict[str, list[str]]:
    """Remove every condition the agent wrote (`is_owned`: our suffix and our mark; another writer's
    of a similar name stays) from `nodes` (None: every node, which needs `list` on nodes): the
    uninstall step. Returns node -> the types removed.
    Raises KubernetesError saying what went wrong."""
    from lightkube.resources.core_v1 import Node

    client = connect(settings, field_manager=settings.reporting_controller)
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
    except RefusedError as err:
        raise KubernetesError(refused_outcome(err, "removing the conditions").error) from err
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
        return [
            {"type": t, "$patch": "delete"} for t in sorted(current) if is_owned(t, current[t]["message"])
        ]

    _, patch = await write_conditions(client, limiter, node, deletions)
    return [str(item["type"]) for item in patch]


async def write_conditions(
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
        got = await call(limiter, client.get(Node.Status, node))
        patch = patch_of(_conditions_of(got))
        if not patch:
            return got, []
        body = {
            "metadata": {"resourceVersion": got.metadata.resourceVersion},
            "status": {"conditions": patch},
        }
        try:
            await call(limiter, client.patch(Node.Status, node, body, patch_type=_strategic()))
            return got, patch
        except RefusedError as err:
            if err.status != 409:
                raise
    raise RefusedError(409, f"node {node} kept changing over {CONFLICT_RETRIES} writes")
