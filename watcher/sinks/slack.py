"""Slack incoming webhooks: one Block Kit message per group of events, inside Slack's limits.

Limits (Slack's Block Kit documentation): 50 blocks; section text 3000
characters; header 150; messages far above ~13k characters are refused. So a
cycle of 500 changes becomes one message with a section per kind, each cut
short with "... and N more", and a plain `text` fallback for notifications.

A person reads it, so a flapping device is one story here too: the end of a condition Slack told
(a device back, healthy again, a flap over) waits `resolve_hold_down`, like a paging sink's resolve
(watcher.sinks.hold_down keeps it and sends it when due, across restarts). A failure again within
that time adds nothing (the reader was told it failed, and not that it recovered), and neither does
the device.flapping of a condition already told; what ended the episode comes once, after it. A
failure of another device, or of the same one after its recovery was told, is told at once.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from watcher.config import field_meta
from watcher.model.changes import Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.affected import owner_text
from watcher.model.events import Event
from watcher.model.hold_down import HeldEnd, HeldEnds, Step, decide
from watcher.secrets import Secret
from watcher.sinks.base import (
    BaseSinkSettings,
    Capabilities,
    HttpSinkSettings,
    KeyValue,
    Outcome,
    SinkContext,
)
from watcher.sinks.hold_down import HeldStore
from watcher.sinks.http import HttpClient, HttpSink
from watcher.sinks.registry import SinkType, register

__all__ = [
    "SlackSink",
    "SlackSinkSettings",
    "slack_message",
    "MAX_BLOCKS",
    "MAX_SECTION",
    "MAX_HEADER",
    "MAX_TOTAL",
]

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_HEADER = 150
MAX_TOTAL = 12000  # characters of text across blocks: under Slack's ~13k refusal point
ICONS = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


@dataclass(frozen=True)
class SlackSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: Secret | None = field(
        default=None, metadata=field_meta("Incoming-webhook URL (secret).", secret=True)
    )
    group: Literal["none", "cycle", "window"] = field(
        default="cycle", metadata=field_meta("Slack gets one message per re-query by default.")
    )
    rate: float = field(
        default=1.0, metadata=field_meta("Slack allows about 1 message/s per webhook.", min=0.001)
    )
    max_batch: int = field(
        default=1000,
        metadata=field_meta("A whole re-query fits one message (cut short inside it).", min=1, max=10000),
    )
    resolve_hold_down: float = field(
        default=60.0,
        metadata=field_meta(
            "Seconds a recovery (a device back, a flap over) waits before it is said; failing again "
            "within it says nothing new (a flapping device is two messages: failed, then how it "
            "ended). 60 s, as the paging sinks' resolve_hold_down. 0: at once.",
            min=0,
            max=86400,
        ),
    )
    type: Literal["slack"] = "slack"


def _escape(text: str) -> str:
    # Slack mrkdwn control characters.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escaped_within(text: str, limit: int) -> str:
    """`text` cut, then escaped, within `limit` characters: never half an entity at the end."""
    keep = limit
    while len(escaped := _escape(_cut(text, keep))) > limit:
        keep -= len(escaped) - limit
    return escaped


def _section(title: str, lines: list[str], budget: int) -> str:
    """A section's text within `budget` characters, ending in "... and N more" when cut."""
    text = title
    for i, line in enumerate(lines):
        candidate = text + "\n• " + line
        # Keep room for the note in case a later line does not fit.
        if len(candidate) + len(f"\n… and {len(lines)} more") > budget:
            return text + f"\n… and {len(lines) - i} more"
        text = candidate
    return text


def _line(event: Event) -> str:
    """The event's line: its owner first when the Pods API named one, else the summary alone."""
    owner = owner_text(event.details)
    return event.summary if owner is None else f"{owner}: {event.summary}"


def slack_message(events: Sequence[Event], node: str) -> dict[str, Any]:
    worst = max((e.severity for e in events), key=lambda s: s.rank)
    n = len(events)
    title = _cut(
        f"{node}: {n} change{'s' if n != 1 else ''}" + (f" — {_line(events[0])}" if n == 1 else ""),
        MAX_HEADER,
    )
    by_kind: dict[str, list[Event]] = {}
    for e in events:
        by_kind.setdefault(str(e.kind), []).append(e)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}
    ]
    budget = MAX_TOTAL - len(title) - 200
    room = MAX_BLOCKS - 3  # header, context, and the "... and N more" note if needed
    omitted = 0
    for kind, group in by_kind.items():
        if len(blocks) > room or budget < 200:
            omitted += len(group)
            continue
        icon = ICONS[str(max((e.severity for e in group), key=lambda s: s.rank))]
        lines = [_escape(_cut(_line(e), 500)) for e in group]
        text = _section(f"{icon} *{kind}* ({len(group)})", lines, min(MAX_SECTION, budget))
        budget -= len(text)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    if omitted:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": f"… and {omitted} more changes"}}
        )
    seqs = f"seq {events[0].seq}" + (f"-{events[-1].seq}" if n > 1 else "")
    context = f"node *{_escape(node)}* · {events[-1].time} · {seqs} · {ICONS[str(worst)]} {worst}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    # The fallback is mrkdwn in notifications too: escape it like the blocks, after cutting (a cut
    # after escaping can end in half an entity, "&am").
    plain = f"{node}: {n} change(s); " + "; ".join(_line(e) for e in events[:3])
    fallback = _escaped_within(plain, 3000)
    return {"text": fallback, "blocks": blocks}


class SlackSink(HttpSink):
    def __init__(self, settings: SlackSinkSettings, *, node: str, store: KeyValue) -> None:
        assert settings.url is not None
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.store = store
        self.http = HttpClient.for_sink(settings)
        self.held = HeldStore(
            store,
            f"slack:{self.name}:held",
            settings.resolve_hold_down,
            sink=self.name,
            retry_cap=settings.retry_max_delay,
        )

    @property
    def _store_key(self) -> str:
        return f"slack:{self.name}:open"  # the conditions whose start Slack was told

    async def _post(self, events: Sequence[Event]) -> Outcome:
        assert self.settings.url is not None
        body = json.dumps(slack_message(events, self.node)).encode()
        return await self.send(self.settings.url.get(), body, {"Content-Type": "application/json"})

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        async with self.held.lock:
            told = set(await self.store.kv_get(self._store_key) or [])
            opened = set(told)
            before = await self.held.load()
            kept, held = self._sift(events, opened, before)
            outcome = Outcome.ok()
            if kept:
                outcome = await self._post(kept)
                if not outcome.delivered:
                    return outcome  # nothing saved: the batch is sifted afresh when retried
            if held != before:
                await self.held.save(held)
            if opened != told:
                await self.store.kv_set(self._store_key, sorted(opened))
        return outcome

    def _sift(
        self, events: Sequence[Event], opened: set[str], held: HeldEnds
    ) -> tuple[list[Event], HeldEnds]:
        """What of `events` to say now; `opened` and the held ends updated in place of the state."""
        hold_down = self.settings.resolve_hold_down
        least = Severity(self.settings.min_severity).rank
        boot, now = self.held.clock()
        kept: list[Event] = []
        withheld: set[str] = set()  # resources whose device changes wait or add nothing
        for event in events:
            condition = condition_of(event)
            if condition is None:
                kept.append(event)
                continue
            key = condition.key
            step = decide(condition.active, is_open=key in opened, hold_down=hold_down)
            if step is Step.HOLD and event.kind is Kind.WATCHER_STARTED:
                step = Step.END  # news of its own (the agent is back), said at once
            resource = str(event.details.get("resource", ""))
            if step is Step.HOLD:
                held = held.hold(key, now=now, boot=boot, hold_down=hold_down, payload=event.to_dict())
                withheld.add(resource)
                continue
            if step is Step.UPDATE:
                recovering = key in held.held
                held = held.cancel(key)
                if recovering or event.kind is Kind.DEVICE_FLAPPING:
                    withheld.add(resource)
                    continue  # the reader knows it failed and was not told it recovered
            elif step is Step.OPEN:
                opened.add(key)
            elif step is Step.END:
                opened.discard(key)
            elif event.severity.rank < least:
                continue  # the end of a condition never told: only what the route asked for
            kept.append(event)
        said = {str(e.details.get("resource", "")) for e in kept if condition_of(e) is not None}
        # A capacity change is said with the device change that explains it, or not at all.
        quiet = withheld - said
        return [
            e for e in kept if not (e.kind is Kind.CAPACITY_CHANGED and e.details.get("resource") in quiet)
        ], held

    async def _say_held(self, key: str, end: HeldEnd) -> Outcome:
        """A held recovery, due: said, and the condition is no longer told (the timer holds the lock)."""
        told = set(await self.store.kv_get(self._store_key) or [])
        if key not in told:
            return Outcome.ok()
        try:
            event = Event.from_dict(end.payload)
        except ValueError:
            event = None  # not readable (written by another version): the condition just ends
        outcome = Outcome.ok() if event is None else await self._post([event])
        if outcome.delivered or not (outcome.retry or outcome.gone):
            await self.store.kv_set(self._store_key, sorted(told - {key}))
        return outcome

    def background(self) -> Callable[[], Awaitable[None]] | None:
        def say_held_recoveries() -> Awaitable[None]:
            return self.held.run(self._say_held)

        return say_held_recoveries


def _slack_sink(settings: SlackSinkSettings, context: SinkContext) -> SlackSink:
    return SlackSink(settings, node=context.node, store=context.store)


register(
    SinkType(
        name="slack",
        settings=SlackSinkSettings,
        factory=_slack_sink,
        required_secrets=("url",),
        capabilities=Capabilities(notifies=True, resolves=True),
        order=30,
    )
)
