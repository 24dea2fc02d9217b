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
from watcher.sinks.kubernetes.condition_plan import REJECTING_SUFFIX, NodeCondition
from watcher.sinks.kubernetes.episodes import EpisodeCondition, EpisodeState

__all__ = ["REJECTING_SUFFIX", "Rejecting", "rejecting_type", "rejecting_after", "rejecting_conditions"]

Rejecting = EpisodeState
EPISODE = EpisodeCondition(
    REJECTING_SUFFIX, Kind.NODE_REJECTING_PODS, Kind.NODE_REJECTING_PODS_ENDED, "PodsRejected", "PodsAdmitted"
)


def rejecting_type(resource: str) -> str:
    return EPISODE.type_of(resource)


def rejecting_after(events: Sequence[Event], before: Mapping[str, Any]) -> Rejecting:
    return EPISODE.after(events, before)


def rejecting_conditions(state: Mapping[str, Mapping[str, Any]]) -> list[NodeCondition]:
    return EPISODE.conditions(state)
