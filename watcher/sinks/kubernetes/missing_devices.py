"""The Node condition of a resource with fewer devices than expected: `<Vendor><Resource>DevicesMissing`
(nvidia.com/gpu -> NvidiaGpuDevicesMissing), True while `device.missing` is open for that resource,
False once `device.missing_resolved` says the count is back (watcher.model.expected). Pure.

Its state (resource -> open, and what the condition says) is kept by the sink with the other
conditions', so every write of the agent's conditions (and the prune at a start) carries it: a
restart neither drops a True condition nor leaves a stale one. Its message starts with OWNER_MARK;
its suffix is MISSING_SUFFIX, which the admission policy allows too. An expectation withdrawn (the
count no longer configured or labelled) removes nothing: the condition says False with the words why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.sinks.kubernetes.condition_plan import MISSING_SUFFIX, NodeCondition
from watcher.sinks.kubernetes.episodes import EpisodeCondition, EpisodeState

__all__ = ["MISSING_SUFFIX", "Short", "missing_type", "short_after", "short_conditions"]

Short = EpisodeState
EPISODE = EpisodeCondition(
    MISSING_SUFFIX, Kind.DEVICE_MISSING, Kind.DEVICE_MISSING_RESOLVED, "DevicesMissing", "DevicesAsExpected"
)


def missing_type(resource: str) -> str:
    return EPISODE.type_of(resource)


def short_after(events: Sequence[Event], before: Mapping[str, Any]) -> Short:
    return EPISODE.after(events, before)


def short_conditions(state: Mapping[str, Mapping[str, Any]]) -> list[NodeCondition]:
    return EPISODE.conditions(state)
