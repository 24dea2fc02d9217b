"""The source seam: what the agent reads besides the kubelet's pod-resources answers.

A source (as a monitor of node-problem-detector, or a provider of the kubelet) is a supervised loop
that keeps what it last read, says how it is doing in `/readyz`, and hands each cycle its evidence as
one frozen value. The reactor gets its sources when it is made; the agent supervises them, `/readyz`
lists them, and `findings.conclude` takes their evidence merged. Adding one is a module here, its
settings, and one line where the agent is composed (watcher/parts.py `sources_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from watcher.model.devicehealth.pods import PodIndex, PodMeta
from watcher.model.devicehealth.taint_rules import TaintRule
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.inventory import Inventory

__all__ = ["Evidence", "Source", "merged"]

PodKey = tuple[str, str]


@dataclass(frozen=True)
class Evidence:
    """What the sources say of the node for one cycle, beside pod-resources' answer.

    `pods`: the Pods API's complete, live view of the node's pods (None: no watch live now); with it,
    a DRA device's verdict in its holders' Pod status is a change too, and every change names the
    pods it hits. `taints`: the node's DRA device taints as last read (None: none read).
    `gone`: pods that ended since the last cycle, by name, so that their removal names them.
    `rules`: the cluster's DeviceTaintRules as last read (None: none read); their taints on the
    node's devices are in `taints` already, these are for the rules that evict from every device.
    """

    pods: PodIndex | None = None
    taints: tuple[DeviceTaint, ...] | None = None
    gone: Mapping[PodKey, PodMeta] = field(default_factory=dict)
    # The devices the operator expects per resource and the Node's status.capacity counts, as the
    # Node was last read (watcher.sources.node_expected); None: not read, nothing judged.
    expected: Mapping[str, int] | None = None
    capacity: Mapping[str, int] | None = None
    rules: tuple[TaintRule, ...] | None = None


def merged(parts: Sequence[Evidence]) -> Evidence:
    """The sources' evidence as one value: the pods as the one source of them says (the Pods API),
    every source's taints together (None only when none has read any), every ended pod, the
    rules as the one source of them says."""
    pods = next((e.pods for e in parts if e.pods is not None), None)
    rules = next((e.rules for e in parts if e.rules is not None), None)
    read = [e.taints for e in parts if e.taints is not None]
    taints = tuple(dict.fromkeys(t for ts in read for t in ts)) if read else None
    expected = next((e.expected for e in parts if e.expected is not None), None)
    capacity = next((e.capacity for e in parts if e.capacity is not None), None)
    gone: dict[PodKey, PodMeta] = {}
    for e in parts:
        gone.update(e.gone)
    return Evidence(pods=pods, taints=taints, gone=gone, expected=expected, capacity=capacity, rules=rules)


class Source(Protocol):
    """One thing the agent reads. `name` is its supervised task's; `status_key` its `/readyz` entry."""

    @property
    def name(self) -> str: ...

    @property
    def status_key(self) -> str: ...

    async def run(self) -> None:
        """Read until the agent stops; never raises for its peer's sake (an outage is a state)."""

    async def first_look(self) -> None:
        """Return once the agent's first cycle may use what this source reads (bounded)."""

    def status(self) -> dict[str, Any]:
        """How it is doing, for `/readyz` (never a reason to be unready on its own)."""

    def evidence(self, after: Inventory) -> Evidence:
        """What it says for the cycle that reports `after` (it may hand over what it kept for it)."""
