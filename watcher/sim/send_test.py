"""Synthetic events for `send-test`, and an in-memory key-value store for one-off deliveries."""

from __future__ import annotations

from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope, new_cycle_id

__all__ = ["MemoryStore", "synthetic_events", "TEST_RESOURCE"]

TEST_RESOURCE = "test.pod-resources-watcher/device"


class MemoryStore:
    """The KeyValue a paging sink needs, kept in memory (nothing outlives the command)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    async def kv_get(self, key: str) -> Any:
        return self.data.get(key)

    async def kv_set(self, key: str, value: Any) -> None:
        self.data[key] = value


def synthetic_events(node: str, *, paging: bool) -> list[Event]:
    """A test condition and, for paging sinks, its resolution (so no page is left open)."""
    details = {"resource": TEST_RESOURCE, "device": "send-test", "numa": [], "test": True}
    cycle = new_cycle_id()
    events = [
        envelope(
            Change(
                Kind.DEVICE_REMOVED,
                Severity.WARNING,
                "TEST from pod-resources-watcher send-test: no action needed",
                {**details, "allocated_to": [], "namespaces": []},
            ),
            seq=1,
            node=node,
            cycle=cycle,
            before=None,
            after=None,
        )
    ]
    if paging:
        events.append(
            envelope(
                Change(
                    Kind.DEVICE_ADDED,
                    Severity.INFO,
                    "TEST from pod-resources-watcher send-test: resolved",
                    details,
                ),
                seq=2,
                node=node,
                cycle=cycle,
                before=None,
                after=None,
            )
        )
    return events
