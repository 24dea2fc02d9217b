"""NodeExpectations: the devices the operator expects on this node, and what the kubelet knows of,
read from the agent's own Node through its KubeApi (watcher.kubeapi), for `device.missing`
(watcher.model.expected).

Every `interval` seconds it reads the Node's status subresource (`get` on nodes/status, which the
shipped RBAC already grants the kubernetes sink for its conditions: the whole Node comes back,
labels included): the labels `[expected] labels` names give a count each, `[expected] devices` the
rest, and `status.capacity` is the kubelet's device manager's count of every device it knows
(healthy + unhealthy). When either changes it fires the trigger's reason `node-expected` and the
next cycle judges. Made only when an expectation is configured: otherwise nothing is read.

A failure (403, the API server down) is logged once per kind until a read succeeds again and leaves
what was last read: an outage must neither open nor resolve anything. Until the first read the
evidence says nothing (None), so an agent that starts with the API server down judges nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import structlog

from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.client import KubernetesError, RefusedError
from watcher.kubelet.triggers import Trigger
from watcher.model.inventory import Inventory
from watcher.sources.base import Evidence
from watcher.sources.expected_settings import MAX_DEVICES, ExpectedSettings
from watcher.supervision import sleep_or_stop

__all__ = ["REASON", "NodeExpectations", "counts_of"]

log = structlog.get_logger("watcher.sources.node_expected")

REASON = "node-expected"


def _count(value: Any) -> int | None:
    """A whole, plausible device count from a label or a capacity quantity ("8"); else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        return None
    return number if 0 <= number <= MAX_DEVICES else None


def counts_of(
    node: Mapping[str, Any], settings: ExpectedSettings
) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(expected, capacity, labels that are not a count) of a Node as the API returns it. A label
    absent or not a whole number expects nothing: GPU feature discovery writes it once the node is
    labelled, and a wrong value must not page."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    expected = dict(settings.devices)
    bad: list[str] = []
    for resource, label in sorted(settings.labels.items()):
        if label not in labels:
            continue
        count = _count(labels[label])
        if count is None:
            bad.append(label)
        elif count > 0:  # 0: nothing to miss
            expected[resource] = count
    raw = (node.get("status") or {}).get("capacity") or {}
    capacity = {}
    for resource in expected:
        count = _count(raw.get(resource, "0"))
        if count is not None:
            capacity[resource] = count
    return expected, capacity, bad


def _trouble(err: Exception) -> tuple[str, str]:
    if isinstance(err, RefusedError):
        if err.status == 403:
            return "forbidden", (
                "the service account may not get its Node's status: apply the shipped ClusterRole "
                "(deploy/kubernetes/reporting), or remove [expected]"
            )
        if err.status is None:
            return "unreachable", "the API server did not answer"
        return f"http-{err.status}", "the API server refused the read"
    return "client", "the client could not be set up"


class NodeExpectations:
    """The supervised loop (`run`) and what it last read: a `Source`."""

    name = "node-expected"
    status_key = "expected_devices"

    def __init__(
        self,
        api: KubeApi,
        *,
        node: str,
        settings: ExpectedSettings,
        trigger: Trigger,
        stop: asyncio.Event,
    ) -> None:
        self.api = api
        self.node = node
        self.settings = settings
        self.trigger = trigger
        self.stop = stop
        self.expected: dict[str, int] | None = None
        self.capacity: dict[str, int] | None = None
        self.bad_labels: list[str] = []
        self.stale = False
        self.last_read: float | None = None
        self.trouble: str | None = None

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.read()
            await sleep_or_stop(self.stop, self.settings.interval)

    async def first_look(self) -> None:
        return None  # nothing is judged before the first read, which fires the trigger

    def status(self) -> dict[str, Any]:
        read = self.last_read
        return {
            "expected": self.expected,
            "capacity": self.capacity,
            "labels_not_a_count": self.bad_labels,
            "stale": self.stale,
            "problem": self.trouble,
            "last_read_age_s": None if read is None else round(time.monotonic() - read, 3),
        }

    def evidence(self, after: Inventory) -> Evidence:
        return Evidence(expected=self.expected, capacity=self.capacity)

    async def read(self) -> bool:
        """One read: True when it succeeded (and the trigger fired if anything changed)."""
        try:
            node = await self.api.call(self._get())
        except (RefusedError, KubernetesError) as err:
            self.stale = self.expected is not None
            kind, said = _trouble(err)
            if kind != self.trouble:
                self.trouble = kind
                log.warning(
                    "cannot read the node's labels and capacity; keeping what was last read",
                    problem=said,
                    error=str(err),
                )
            return False
        expected, capacity, bad = counts_of(node, self.settings)
        if bad and bad != self.bad_labels:
            log.warning("node labels that are not a device count: nothing expected from them", labels=bad)
        if self.trouble is not None:
            log.info("reading the node's labels and capacity again")
            self.trouble = None
        changed = (expected, capacity) != (self.expected, self.capacity)
        self.expected, self.capacity, self.bad_labels = expected, capacity, bad
        self.stale, self.last_read = False, time.monotonic()
        if changed:
            self.trigger.fire(REASON)
        return True

    async def _get(self) -> dict[str, Any]:
        from lightkube.resources.core_v1 import Node

        client: Any = self.api.client()  # the status subresource: lightkube types it loosely
        found = await client.get(Node.Status, self.node)
        return dict(found.to_dict())
