"""Prometheus Alertmanager (API v2): active conditions as alerts, re-sent while they last.

An alert stays firing only while it is re-posted, so active alerts go out
again every `resend_interval` with `endsAt` a few intervals ahead (if the
agent dies they expire by themselves), and a cleared condition is posted
once with `endsAt` = now. Labels are fixed when a condition starts, so the
resolve matches its alert exactly. Alertmanager then groups and de-duplicates
across the cluster.

A resolve waits `resolve_hold_down` (watcher.model.hold_down): meanwhile the alert stays active and
re-sent, a device failing again within it (or flapping) updates that same alert, and the timer
(watcher.sinks.hold_down) posts the held resolve when it is due, across restarts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import structlog

from watcher.config import field_meta
from watcher.model.conditions import condition_of
from watcher.model.events import Event, rfc3339
from watcher.model.hold_down import HeldEnd, Step, decide
from watcher.secrets import Secret
from watcher.sinks.base import (
    BaseSinkSettings,
    Capabilities,
    HttpSinkSettings,
    KeyValue,
    Outcome,
    SinkContext,
)
from watcher.sinks.hold_down import HOLD_DOWN_DOC, HeldStore
from watcher.sinks.http import HttpClient, HttpSink
from watcher.sinks.registry import SinkType, register

__all__ = ["AlertmanagerSink", "AlertmanagerSinkSettings"]

log = structlog.get_logger("watcher.sinks.alertmanager")


@dataclass(frozen=True)
class AlertmanagerSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: str = field(default="http://alertmanager:9093", metadata=field_meta("Alertmanager base URL."))
    resend_interval: float = field(
        default=60.0,
        metadata=field_meta(
            "Re-post active alerts this often; keep well inside resolve_timeout.", min=1, max=3600
        ),
    )
    bearer_token: Secret | None = field(
        default=None, metadata=field_meta("Sent as Authorization: Bearer (secret).", secret=True)
    )
    resolve_hold_down: float = field(default=60.0, metadata=field_meta(HOLD_DOWN_DOC, min=0, max=86400))
    type: Literal["alertmanager"] = "alertmanager"


class AlertmanagerSink(HttpSink):
    def __init__(self, settings: AlertmanagerSinkSettings, *, node: str, store: KeyValue) -> None:
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.store = store
        self.url = settings.url.rstrip("/") + "/api/v2/alerts"
        self.http = HttpClient.for_sink(settings)
        self.held = HeldStore(
            store,
            f"alertmanager:{self.name}:held",
            settings.resolve_hold_down,
            sink=self.name,
            retry_cap=settings.retry_max_delay,
        )
        self._lock = self.held.lock  # deliver, the re-sends and the held resolves change the alerts

    @property
    def _store_key(self) -> str:
        return f"alertmanager:{self.name}:active"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.settings.bearer_token.get()}"
        return headers

    def _ends_at(self, now: datetime, starts_at: str) -> str:
        return _not_before(now + timedelta(seconds=3 * self.settings.resend_interval), starts_at)

    async def _post(self, alerts: list[dict[str, Any]]) -> Outcome:
        return await self.send(self.url, json.dumps(alerts).encode(), self._headers())

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        hold_down = self.settings.resolve_hold_down
        async with self._lock:
            before: dict[str, dict[str, Any]] = dict(await self.store.kv_get(self._store_key) or {})
            active = dict(before)
            held = await self.held.load()
            boot, clock = self.held.clock()
            now = datetime.now(UTC)
            changed: list[dict[str, Any]] = []
            resolved: list[str] = []
            for event in events:
                condition = condition_of(event)
                if condition is None:
                    continue
                step = decide(condition.active, is_open=condition.key in active, hold_down=hold_down)
                if step is Step.HOLD:  # the alert stays active (and re-sent) until the resolve is due
                    held = held.hold(
                        condition.key,
                        now=clock,
                        boot=boot,
                        hold_down=hold_down,
                        payload={"summary": event.summary},
                    )
                    await self.held.save(held)
                    continue
                if condition.key in held.held:  # active again within the hold-down: the same alert
                    held = held.cancel(condition.key)
                    await self.held.save(held)
                if condition.active:
                    alert = active.get(condition.key) or {
                        "labels": dict(condition.labels),
                        "startsAt": event.time,
                    }
                    alert["annotations"] = {
                        "summary": event.summary,
                        "event_id": event.id,
                        "seq": str(event.seq),
                    }
                    active[condition.key] = alert
                    changed.append({**alert, "endsAt": self._ends_at(now, alert["startsAt"])})
                elif condition.key in active:
                    alert = active.pop(condition.key)
                    alert["annotations"] = {**alert.get("annotations", {}), "resolved_by": event.summary}
                    resolved.append(condition.key)
                    changed.append({**alert, "endsAt": _not_before(now, alert["startsAt"])})
            if changed:
                outcome = await self._post(changed)
                if not outcome.delivered:
                    if resolved and not outcome.retry and not outcome.gone:
                        # Refused for good: the condition ends here all the same. Kept active, it
                        # would be re-sent every interval for a device that is healthy again.
                        log.error(
                            "Alertmanager refused resolving alerts for good; they end here and are no "
                            "longer re-sent (they expire there on their own)",
                            sink=self.name,
                            alerts=resolved,
                            status=outcome.status,
                            error=outcome.error,
                        )
                        await self.store.kv_set(self._store_key, _without(before, resolved))
                    return outcome
            await self.store.kv_set(self._store_key, active)
        return Outcome.ok()

    async def _resend(self) -> None:
        async with self._lock:
            active: dict[str, dict[str, Any]] = dict(await self.store.kv_get(self._store_key) or {})
        if not active:
            return
        now = datetime.now(UTC)
        outcome = await self._post(
            [{**a, "endsAt": self._ends_at(now, a["startsAt"])} for a in active.values()]
        )
        if not outcome.delivered:
            log.warning(
                "re-sending active alerts failed; next try in one interval",
                sink=self.name,
                error=outcome.error,
            )

    async def _resolve_held(self, key: str, end: HeldEnd) -> Outcome:
        """A held resolve, due: its alert posted ended, if still active (the timer holds the lock)."""
        active: dict[str, dict[str, Any]] = dict(await self.store.kv_get(self._store_key) or {})
        alert = active.get(key)
        if alert is None:
            return Outcome.ok()
        annotations = {**alert.get("annotations", {}), "resolved_by": str(end.payload.get("summary", ""))}
        ended = {
            **alert,
            "annotations": annotations,
            "endsAt": _not_before(datetime.now(UTC), alert["startsAt"]),
        }
        outcome = await self._post([ended])
        if outcome.delivered or not (outcome.retry or outcome.gone):
            if not outcome.delivered:
                log.error(
                    "Alertmanager refused a held resolve for good; the alert ends here (it expires there)",
                    sink=self.name,
                    alert=key,
                    status=outcome.status,
                    error=outcome.error,
                )
            await self.store.kv_set(self._store_key, _without(active, [key]))
        return outcome

    def background(self) -> Callable[[], Awaitable[None]] | None:
        async def resend_active_alerts() -> None:
            while True:
                await asyncio.sleep(self.settings.resend_interval)
                await self._resend()

        async def alerts_and_held_resolves() -> None:
            # Both loops are endless; a crash in one ends the other and reaches the supervisor.
            async with asyncio.TaskGroup() as group:
                group.create_task(resend_active_alerts())
                group.create_task(self.held.run(self._resolve_held))

        return alerts_and_held_resolves


def _not_before(when: datetime, starts_at: str) -> str:
    """`when` as an alert's endsAt, never before its startsAt (Alertmanager refuses that with 400:
    after a clock step the wall clock can read earlier than an alert's start)."""
    start = datetime.fromisoformat(starts_at.replace("Z", "+00:00"))
    return rfc3339(max(when, start))


def _without(alerts: dict[str, dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in alerts.items() if k not in keys}


def _alertmanager_sink(settings: AlertmanagerSinkSettings, context: SinkContext) -> AlertmanagerSink:
    return AlertmanagerSink(settings, node=context.node, store=context.store)


register(
    SinkType(
        name="alertmanager",
        settings=AlertmanagerSinkSettings,
        factory=_alertmanager_sink,
        capabilities=Capabilities(pages=True, notifies=True),
        order=60,
    )
)
