"""PagerDuty Events API v2: trigger a condition, resolve it with the same dedup_key.

Conditions (watcher.model.conditions): a device gone from allocatable (node +
resource + device) and the kubelet unreachable (node + kubelet). Keys that
are open are remembered in the outbox, so a resolve goes only to what was
triggered, and survives agent restarts.

A resolve waits `resolve_hold_down` (watcher.model.hold_down): a device failing again within it
keeps the incident open, with no second trigger: a flapping episode is one trigger and one
resolve. With `flap_updates` on, its device.flapping (and a flap that ends with the device missing)
is also sent, as a trigger with the same dedup key, which PagerDuty adds to the open incident's log
instead of opening another. Held resolves are kept with the open keys and sent by the sink's timer
when due, across restarts (watcher.sinks.hold_down).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from watcher.config import field_meta
from watcher.model.changes import Kind
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.affected import owner_text
from watcher.model.events import Event
from watcher.model.hold_down import HeldEnd, Step, decide
from watcher.secrets import Secret
from watcher.sinks.base import (
    BaseSinkSettings,
    Capabilities,
    HttpSinkSettings,
    KeyValue,
    Outcome,
    SeverityName,
    SinkContext,
)
from watcher.sinks.hold_down import HOLD_DOWN_DOC, HeldStore
from watcher.sinks.http import HttpClient, HttpSink
from watcher.sinks.registry import SinkType, register

log = structlog.get_logger("watcher.sinks.pagerduty")

__all__ = [
    "PagerDutySink",
    "PagerDutySinkSettings",
    "pagerduty_event",
    "dedup_key",
    "MAX_SUMMARY",
    "MAX_EVENT_BYTES",
]

MAX_SUMMARY = 1024
MAX_DEDUP = 255
MAX_EVENT_BYTES = 512 * 1024
SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}
# What `flap_updates` sends to an incident already open: the news that it flaps, and how a flap
# ended (missing). A plain failure again (within the hold-down) adds nothing to the page.
UPDATES = (Kind.DEVICE_FLAPPING, Kind.DEVICE_FLAP_ENDED)


@dataclass(frozen=True)
class PagerDutySinkSettings(BaseSinkSettings, HttpSinkSettings):
    routing_key: Secret | None = field(
        default=None, metadata=field_meta("32-character integration key (secret).", secret=True)
    )
    endpoint: str = field(
        default="https://events.pagerduty.com/v2/enqueue",
        metadata=field_meta("Events API v2 endpoint (EU: https://events.eu.pagerduty.com/v2/enqueue)."),
    )
    min_severity: SeverityName = field(
        default="warning", metadata=field_meta("Only conditions worth a page.")
    )
    rate: float = field(default=2.0, metadata=field_meta("Most messages per second.", min=0.001))
    resolve_hold_down: float = field(default=60.0, metadata=field_meta(HOLD_DOWN_DOC, min=0, max=86400))
    flap_updates: bool = field(
        default=False,
        metadata=field_meta(
            "Also tell an open incident that its device flaps (device.flapping, and a flap ended with "
            "the device missing): a second trigger with the same dedup_key, which PagerDuty adds to "
            "the incident's log without a new incident. Off: one trigger and one resolve per episode."
        ),
    )
    type: Literal["pagerduty"] = "pagerduty"


def dedup_key(condition_key: str) -> str:
    key = f"pod-resources-watcher/{condition_key}"
    if len(key) <= MAX_DEDUP:
        return key
    # Stable and unique even for absurdly long device names.
    return key[: MAX_DEDUP - 65] + "#" + hashlib.sha256(key.encode()).hexdigest()


def pagerduty_event(event: Event, routing_key: str, *, active_keys: set[str]) -> dict[str, Any] | None:
    """The Events API v2 body for `event`, or None when it neither starts nor ends a page."""
    condition = condition_of(event)
    if condition is None:
        return None
    key = dedup_key(condition.key)
    if not condition.active:
        if key not in active_keys:
            return None
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": key}
    details: dict[str, Any] = {
        "kind": str(event.kind),
        "seq": event.seq,
        "event_id": event.id,
        "details": dict(event.details),
    }
    summary = event.summary
    owner = owner_text(event.details)
    if owner is not None:
        # Who is hit, first: the owner is what the responder pages its team about.
        details["owner"] = owner
        summary = f"{owner}: {summary}"
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": key,
        "client": "pod-resources-watcher",
        "payload": {
            "summary": summary[:MAX_SUMMARY],
            "source": event.node,
            "severity": SEVERITY[str(event.severity)],
            "timestamp": event.time,
            "component": condition.labels.get("resource") or "kubelet",
            "group": "pod-resources",
            "class": str(event.kind),
            "custom_details": details,
        },
    }
    if len(json.dumps(body).encode()) > MAX_EVENT_BYTES:
        details["details"] = {"truncated": "the structured diff exceeded PagerDuty's 512 KB event limit"}
    return body


class PagerDutySink(HttpSink):
    def __init__(self, settings: PagerDutySinkSettings, *, node: str, store: KeyValue) -> None:
        assert settings.routing_key is not None
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.store = store
        self.http = HttpClient.for_sink(settings)
        self.held = HeldStore(
            store,
            f"pagerduty:{self.name}:held",
            settings.resolve_hold_down,
            sink=self.name,
            retry_cap=settings.retry_max_delay,
        )

    @property
    def _store_key(self) -> str:
        return f"pagerduty:{self.name}:open"

    async def _open_keys(self) -> set[str]:
        return set(await self.store.kv_get(self._store_key) or [])

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        assert self.settings.routing_key is not None
        hold_down = self.settings.resolve_hold_down
        async with self.held.lock:
            open_keys = await self._open_keys()
            held = await self.held.load()
            boot, now = self.held.clock()
            for event in events:
                condition = condition_of(event)
                if condition is None:
                    continue
                key = dedup_key(condition.key)
                step = decide(condition.active, is_open=key in open_keys, hold_down=hold_down)
                if step is Step.PASS:
                    continue
                if step is Step.HOLD:
                    held = held.hold(key, now=now, boot=boot, hold_down=hold_down, payload={"seq": event.seq})
                    await self.held.save(held)
                    continue
                if key in held.held:  # it started again within the hold-down: the same incident
                    held = held.cancel(key)
                    await self.held.save(held)
                if step is Step.UPDATE and not (self.settings.flap_updates and event.kind in UPDATES):
                    continue
                body = pagerduty_event(event, self.settings.routing_key.get(), active_keys=open_keys)
                if body is None:
                    continue
                outcome = await self._send(body, open_keys)
                if not outcome.delivered:
                    return outcome
        return Outcome.ok()

    async def _send(self, body: dict[str, Any], open_keys: set[str]) -> Outcome:
        """Send one trigger or resolve; the open keys follow what PagerDuty was told."""
        outcome = await self.send(
            self.settings.endpoint, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        if not outcome.delivered:
            if body["event_action"] == "resolve" and not outcome.retry and not outcome.gone:
                # Refused for good: the condition ends here all the same (logged; the event is
                # dead-lettered, or the held resolve dropped), rather than stay open forever.
                log.error(
                    "PagerDuty refused a resolve for good; the condition ends here, resolve the "
                    "incident by hand",
                    sink=self.name,
                    dedup_key=body["dedup_key"],
                    status=outcome.status,
                    error=outcome.error,
                )
                open_keys.discard(body["dedup_key"])
                await self.store.kv_set(self._store_key, sorted(open_keys))
            return outcome
        if body["event_action"] == "trigger":
            open_keys.add(body["dedup_key"])
        else:
            open_keys.discard(body["dedup_key"])
        await self.store.kv_set(self._store_key, sorted(open_keys))
        return outcome

    async def _resolve_held(self, key: str, _end: HeldEnd) -> Outcome:
        """A held resolve, due: sent if the incident is still open (the timer holds the lock)."""
        assert self.settings.routing_key is not None
        open_keys = await self._open_keys()
        if key not in open_keys:
            return Outcome.ok()
        body = {"routing_key": self.settings.routing_key.get(), "event_action": "resolve", "dedup_key": key}
        return await self._send(body, open_keys)

    def background(self) -> Callable[[], Awaitable[None]] | None:
        def send_held_resolves() -> Awaitable[None]:
            return self.held.run(self._resolve_held)

        return send_held_resolves


def _pagerduty_sink(settings: PagerDutySinkSettings, context: SinkContext) -> PagerDutySink:
    return PagerDutySink(settings, node=context.node, store=context.store)


register(
    SinkType(
        name="pagerduty",
        settings=PagerDutySinkSettings,
        factory=_pagerduty_sink,
        required_secrets=("routing_key",),
        capabilities=Capabilities(pages=True, notifies=True),
        order=40,
    )
)
