"""A Node condition that follows one episode per resource: an event kind opens it (True), another
ends it (False), and the sink keeps its state with the other conditions' so every write of the
agent's conditions (and the prune at a start) carries it: a restart neither drops a True condition
nor leaves a stale one. Two episodes, each one `EpisodeCondition` value:

- MISSING: `<Vendor><Resource>DevicesMissing` (nvidia.com/gpu -> NvidiaGpuDevicesMissing), True while
  `device.missing` is open for the resource, False once `device.missing_resolved` says the count is
  back (watcher.model.expected). An expectation withdrawn (the count no longer configured or
  labelled) removes nothing: the condition says False with the words why.
- REJECTING: `<Vendor><Resource>PodsRejected`, True while `node.rejecting_pods` is open for the
  resource, False once `node.rejecting_pods_ended` says the window passed quiet
  (watcher.model.rejections).

The type derives from the device condition's (nvidia.com/gpu -> NvidiaGpu...) with the episode's own
suffix, which the admission policy allows; the message starts with OWNER_MARK like every condition
the agent writes. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.model.wording import printable
from watcher.sinks.kubernetes.condition_plan import (
    CONDITION_SUFFIX,
    MAX_MESSAGE_BYTES,
    MISSING_SUFFIX,
    OWNER_MARK,
    REJECTING_SUFFIX,
    NodeCondition,
    condition_type,
)
from watcher.sinks.kubernetes.notes import fit

__all__ = ["MISSING", "REJECTING", "EpisodeCondition", "EpisodeState"]

# resource -> {"open": bool, "text": the event's summary when the episode opened or ended}
EpisodeState = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class EpisodeCondition:
    """One kind of episode: the kinds that open and end it, its type suffix and its two reasons."""

    suffix: str
    opens: Kind
    ends: Kind
    open_reason: str
    ended_reason: str

    def type_of(self, resource: str) -> str:
        return condition_type(resource).removesuffix(CONDITION_SUFFIX) + self.suffix

    def after(self, events: Sequence[Event], before: Mapping[str, Any]) -> EpisodeState:
        """The state after one batch of our events (in seq order), from the state saved before it. An
        event naming no resource has no condition."""
        state: EpisodeState = {
            str(r): {"open": v.get("open") is True, "text": str(v.get("text", ""))}
            for r, v in before.items()
            if isinstance(v, Mapping)
        }
        for event in events:
            if event.kind not in (self.opens, self.ends):
                continue
            resource = str(event.details.get("resource", ""))
            if resource:
                state[resource] = {"open": event.kind is self.opens, "text": event.summary}
        return state

    def conditions(self, state: Mapping[str, Mapping[str, Any]]) -> list[NodeCondition]:
        """One condition per resource the state has, in order of type."""
        out = []
        for resource, v in sorted(state.items(), key=lambda rv: self.type_of(rv[0])):
            message = fit(printable(OWNER_MARK + str(v.get("text", ""))), MAX_MESSAGE_BYTES)
            if v.get("open"):
                out.append(NodeCondition(self.type_of(resource), "True", self.open_reason, message))
            else:
                out.append(NodeCondition(self.type_of(resource), "False", self.ended_reason, message))
        return out


MISSING = EpisodeCondition(
    MISSING_SUFFIX, Kind.DEVICE_MISSING, Kind.DEVICE_MISSING_RESOLVED, "DevicesMissing", "DevicesAsExpected"
)
REJECTING = EpisodeCondition(
    REJECTING_SUFFIX, Kind.NODE_REJECTING_PODS, Kind.NODE_REJECTING_PODS_ENDED, "PodsRejected", "PodsAdmitted"
)
