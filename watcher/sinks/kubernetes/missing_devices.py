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
from watcher.model.wording import printable
from watcher.sinks.kubernetes.condition_plan import (
    CONDITION_SUFFIX,
    MAX_MESSAGE_BYTES,
    MISSING_SUFFIX,
    OWNER_MARK,
    NodeCondition,
    condition_type,
)
from watcher.sinks.kubernetes.notes import fit

__all__ = ["MISSING_SUFFIX", "Short", "missing_type", "short_after", "short_conditions"]

# resource -> {"open": bool, "text": the event's summary when it opened or ended}
Short = dict[str, dict[str, Any]]


def missing_type(resource: str) -> str:
    """NvidiaGpuDevicesMissing for nvidia.com/gpu: the device condition's derivation, our suffix."""
    return condition_type(resource).removesuffix(CONDITION_SUFFIX) + MISSING_SUFFIX


def short_after(events: Sequence[Event], before: Mapping[str, Any]) -> Short:
    """The state after one batch of our events (in seq order), from the state saved before it."""
    state: Short = {
        str(r): {"open": v.get("open") is True, "text": str(v.get("text", ""))}
        for r, v in before.items()
        if isinstance(v, Mapping)
    }
    for event in events:
        if event.kind not in (Kind.DEVICE_MISSING, Kind.DEVICE_MISSING_RESOLVED):
            continue
        resource = str(event.details.get("resource", ""))
        if resource:
            state[resource] = {"open": event.kind is Kind.DEVICE_MISSING, "text": event.summary}
    return state


def short_conditions(state: Mapping[str, Mapping[str, Any]]) -> list[NodeCondition]:
    """One condition per resource the state has, in order of type."""
    out = []
    for resource, v in sorted(state.items(), key=lambda rv: missing_type(rv[0])):
        message = fit(printable(OWNER_MARK + str(v.get("text", ""))), MAX_MESSAGE_BYTES)
        if v.get("open"):
            out.append(NodeCondition(missing_type(resource), "True", "DevicesMissing", message))
        else:
            out.append(NodeCondition(missing_type(resource), "False", "DevicesAsExpected", message))
    return out
