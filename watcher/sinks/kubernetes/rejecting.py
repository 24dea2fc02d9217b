"""The Node condition of a node that keeps rejecting pods: `<Vendor><Resource>PodsRejected`
(nvidia.com/gpu -> NvidiaGpuPodsRejected), True while `node.rejecting_pods` is open for that
resource, False once `node.rejecting_pods_ended` says the window passed quiet. Pure.

Its state (resource -> open, and what the condition says) is kept by the sink with the missing
devices, so every write of the agent's conditions (and the prune at a start) carries it: a restart
neither drops a True condition nor leaves a stale one. Like the device conditions, its message
starts with OWNER_MARK; its own suffix is REJECTING_SUFFIX, which the admission policy allows too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.model.wording import printable
from watcher.sinks.kubernetes.condition_plan import (
    CONDITION_SUFFIX,
    MAX_MESSAGE_BYTES,
    OWNER_MARK,
    REJECTING_SUFFIX,
    NodeCondition,
    condition_type,
)
from watcher.sinks.kubernetes.notes import fit

__all__ = ["REJECTING_SUFFIX", "Rejecting", "rejecting_type", "rejecting_after", "rejecting_conditions"]

# resource -> {"open": bool, "text": the incident's summary when it opened or ended}
Rejecting = dict[str, dict[str, Any]]


def rejecting_type(resource: str) -> str:
    """NvidiaGpuPodsRejected for nvidia.com/gpu: the device condition's derivation, our suffix."""
    return condition_type(resource).removesuffix(CONDITION_SUFFIX) + REJECTING_SUFFIX


def rejecting_after(events: Sequence[Event], before: Mapping[str, Any]) -> Rejecting:
    """The state after one batch of our events (in seq order), from the state saved before it. An
    incident with no resource named (a device manager's words that name none) has no condition."""
    state: Rejecting = {
        str(r): {"open": v.get("open") is True, "text": str(v.get("text", ""))}
        for r, v in before.items()
        if isinstance(v, Mapping)
    }
    for event in events:
        if event.kind not in (Kind.NODE_REJECTING_PODS, Kind.NODE_REJECTING_PODS_ENDED):
            continue
        resource = str(event.details.get("resource", ""))
        if resource:
            state[resource] = {"open": event.kind is Kind.NODE_REJECTING_PODS, "text": event.summary}
    return state


def rejecting_conditions(state: Mapping[str, Mapping[str, Any]]) -> list[NodeCondition]:
    """One condition per resource the state has, in order of type."""
    out = []
    for resource, v in sorted(state.items(), key=lambda rv: rejecting_type(rv[0])):
        message = fit(printable(OWNER_MARK + str(v.get("text", ""))), MAX_MESSAGE_BYTES)
        if v.get("open"):
            out.append(NodeCondition(rejecting_type(resource), "True", "PodsRejected", message))
        else:
            out.append(NodeCondition(rejecting_type(resource), "False", "PodsAdmitted", message))
    return out
