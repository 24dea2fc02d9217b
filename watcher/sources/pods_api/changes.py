"""What the Pods API watch tells the cycle of a pod's change.

A change is told only when it moves something a cycle acts on: a new or gone pod, its phase or
generation (its holdings), its device verdicts, claims or extended-resource mappings (its devices'
health). A pod's labels and owner reach events only through the index, read as each event is made,
so a change of those alone updates the index and wakes nothing: a flood of label edits costs a
decode and a compare per event, never a re-query. What is told is bounded further on: status
changes are gathered into one re-query per burst (`watcher.kubelet.triggers`), reads by the
agent's own RPC cap.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from watcher.model.devicehealth.pods import PodMeta

__all__ = ["PodChange", "pod_change", "told"]


@dataclass(frozen=True)
class PodChange:
    """One pod that differs from what the agent held."""

    uid: str
    before: PodMeta | None  # None: a pod new to the agent
    after: PodMeta | None  # None: deleted
    resources: bool  # its holdings may have changed: the reactor re-reads it with pod-resources Get


def pod_change(uid: str, before: PodMeta | None, after: PodMeta | None) -> PodChange:
    # A new spec bumps the generation; a phase change starts or ends containers. A status update
    # alone (a device verdict) leaves what the pod holds as it was.
    resources = (
        before is None
        or after is None
        or before.phase != after.phase
        or before.generation != after.generation
    )
    return PodChange(uid, before, after, resources)


def told(before: PodMeta | None, after: PodMeta | None) -> bool:
    """Does a change from `before` to `after` move anything a cycle acts on? Not when only the
    labels or the owner differ: events read those from the index when they are made."""
    if before is None or after is None:
        return before is not after
    return dataclasses.replace(before, labels=after.labels, owner=after.owner) != after
