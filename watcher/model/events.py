"""The event envelope: the public contract every sink receives.

Shipped with a JSON Schema (`event.schema.json` in this package, `SCHEMA`
below) that the tests validate every event against. Fields:
schema, id, seq, time, node, kind, severity, summary, details, cycle,
inventory {before, after}.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.wording import printable

__all__ = ["SCHEMA_VERSION", "Event", "new_cycle_id", "envelope", "event_schema"]

SCHEMA_VERSION = "pod-resources-watcher.event/v1"


def new_cycle_id() -> str:
    return uuid.uuid4().hex[:16]


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Event:
    """A Change wrapped for delivery. `id` is minted once and kept on every redelivery."""

    id: str
    seq: int
    time: str
    node: str
    kind: Kind
    severity: Severity
    summary: str
    details: Mapping[str, Any]
    cycle: str
    inventory_before: str | None
    inventory_after: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "id": self.id,
            "seq": self.seq,
            "time": self.time,
            "node": self.node,
            "kind": str(self.kind),
            "severity": str(self.severity),
            "summary": self.summary,
            "details": _plain(self.details),
            "cycle": self.cycle,
            "inventory": {"before": self.inventory_before, "after": self.inventory_after},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Read an event back (outbox, audit log); raises ValueError on a foreign shape."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not a {SCHEMA_VERSION} event: schema={data.get('schema')!r}")
        try:
            inv = data["inventory"]
            return cls(
                id=str(data["id"]),
                seq=int(data["seq"]),
                time=str(data["time"]),
                node=str(data["node"]),
                kind=Kind(data["kind"]),
                severity=Severity(data["severity"]),
                summary=str(data["summary"]),
                details=dict(data["details"]),
                cycle=str(data["cycle"]),
                inventory_before=inv["before"],
                inventory_after=inv["after"],
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed event: {err!r}") from err


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """Copy read-only mappings and tuples into plain JSON types."""
    # Exact types first: every event is serialized for the outbox and again by each sink, and
    # an isinstance check against the Mapping ABC costs more than the rest of the walk. (Folding
    # the exact checks into the isinstance lines below measured slower: kept apart on purpose.)
    cls = type(value)
    if cls in _SCALARS:
        return value
    if cls is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if cls is list:
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def envelope(
    change: Change,
    *,
    seq: int,
    node: str,
    cycle: str,
    before: str | None,
    after: str | None,
    now: datetime | None = None,
) -> Event:
    return Event(
        id=str(uuid.uuid4()),
        seq=seq,
        time=rfc3339(now or datetime.now(UTC)),
        node=node,
        kind=change.kind,
        severity=change.severity,
        summary=printable(change.summary),
        details=change.details,
        cycle=cycle,
        inventory_before=before,
        inventory_after=after,
    )


@cache
def event_schema() -> dict[str, Any]:
    """The JSON Schema of the envelope, as shipped in the package."""
    text = resources.files("watcher").joinpath("event.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema
