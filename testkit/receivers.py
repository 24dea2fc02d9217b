"""Real HTTP receivers for the sink tests: each enforces its service's documented rules.

The rules are each service's published ones (Slack's Block Kit limits, PagerDuty Events API
v2, CloudEvents 1.0, Standard Webhooks). Each records and can be scripted as every
`testkit.receiver.Receiver` can.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from testkit.receiver import Received, Receiver, json_body

__all__ = [
    "REQUIRED_CE",
    "CloudEventSeen",
    "PagerDutyReceiver",
    "PathEchoReceiver",
    "SlackReceiver",
    "WebhookReceiver",
    "parse_cloudevent",
]


@dataclass(frozen=True)
class CloudEventSeen:
    """A CloudEvent as the SDK parsed it."""

    attributes: Mapping[str, Any]
    data: Any

    @property
    def id(self) -> str:
        return str(self.attributes["id"])

    @property
    def source(self) -> str:
        return str(self.attributes["source"])

    @property
    def type(self) -> str:
        return str(self.attributes["type"])

    @property
    def subject(self) -> str | None:
        subject = self.attributes.get("subject")
        return None if subject is None else str(subject)


# --- Slack incoming webhooks ---


class SlackReceiver(Receiver):
    """Slack's incoming webhook: Block Kit limits, a `text` fallback, about one message a second.

    Success is 200 `ok`; a broken rule is 400 `invalid_payload` or `invalid_blocks` (the
    violation names the rule); a message sooner than 1/rate after the last accepted one is
    429 with `Retry-After` seconds.
    """

    MAX_BLOCKS = 50
    MAX_HEADER = 150
    MAX_SECTION = 3000
    MAX_FIELDS = 10
    MAX_FIELD = 2000
    MAX_BLOCK_ID = 255
    MAX_CONTEXT_ELEMENTS = 10
    MAX_TOTAL = 13000

    def __init__(self, *, rate: float = 1.0, tolerance: float = 0.1, retry_after: int = 1) -> None:
        super().__init__()
        self.rate = rate
        self.tolerance = tolerance
        self.retry_after = retry_after
        self.last_ok: float | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The accepted messages."""
        return [r.parsed for r in self.accepted]

    def _text_object(
        self, rec: Received, obj: Any, where: str, *, low: int, high: int, kinds: tuple[str, ...]
    ) -> int:
        if not isinstance(obj, Mapping) or obj.get("type") not in kinds:
            rec.violations.append(f"invalid_blocks: {where} must be a text object of type {kinds}")
            return 0
        text = obj.get("text")
        if not isinstance(text, str) or not low <= len(text) <= high:
            size = len(text) if isinstance(text, str) else None
            rec.violations.append(f"invalid_blocks: {where} text has {size} characters, not {low}..{high}")
            return 0
        return len(text)

    def inspect(self, rec: Received) -> None:
        msg = json_body(rec, bad="invalid_payload")
        if msg is None:
            return
        if not isinstance(msg, Mapping):
            rec.violations.append("invalid_payload: the body is not a JSON object")
            return
        text = msg.get("text")
        if not isinstance(text, str) or not text.strip():
            rec.violations.append("invalid_payload: no top-level `text` notification fallback")
            text = ""
        total = len(text)
        blocks = msg.get("blocks", [])
        if not isinstance(blocks, list):
            rec.violations.append("invalid_blocks: `blocks` is not a list")
            return
        if len(blocks) > self.MAX_BLOCKS:
            rec.violations.append(f"invalid_blocks: {len(blocks)} blocks > {self.MAX_BLOCKS}")
        for i, block in enumerate(blocks):
            total += self._block(rec, block, f"blocks[{i}]")
        if total > self.MAX_TOTAL:
            rec.violations.append(f"invalid_blocks: {total} characters in all > {self.MAX_TOTAL}")

    def _block(self, rec: Received, block: Any, where: str) -> int:
        """Check one block; the characters of text it holds."""
        if not isinstance(block, Mapping):
            rec.violations.append(f"invalid_blocks: {where} is not an object")
            return 0
        block_id = block.get("block_id")
        if block_id is not None and (not isinstance(block_id, str) or len(block_id) > self.MAX_BLOCK_ID):
            rec.violations.append(f"invalid_blocks: {where}.block_id longer than {self.MAX_BLOCK_ID}")
        kind = block.get("type")
        if kind == "header":
            text = block.get("text")
            return self._text_object(
                rec, text, f"{where}.text", low=1, high=self.MAX_HEADER, kinds=("plain_text",)
            )
        if kind == "section":
            return self._section(rec, block, where)
        if kind == "context":
            return self._context(rec, block, where)
        if kind != "divider":
            rec.violations.append(f"invalid_blocks: {where} has unsupported type {kind!r}")
        return 0

    def _section(self, rec: Received, block: Mapping[str, Any], where: str) -> int:
        total = 0
        if "text" not in block and "fields" not in block:
            rec.violations.append(f"invalid_blocks: {where} has neither text nor fields")
        if "text" in block:
            total += self._text_object(
                rec,
                block["text"],
                f"{where}.text",
                low=1,
                high=self.MAX_SECTION,
                kinds=("mrkdwn", "plain_text"),
            )
        fields = block.get("fields", [])
        if not isinstance(fields, list) or len(fields) > self.MAX_FIELDS:
            rec.violations.append(f"invalid_blocks: {where}.fields: at most {self.MAX_FIELDS}")
            fields = []
        for j, item in enumerate(fields):
            total += self._text_object(
                rec,
                item,
                f"{where}.fields[{j}]",
                low=1,
                high=self.MAX_FIELD,
                kinds=("mrkdwn", "plain_text"),
            )
        return total

    def _context(self, rec: Received, block: Mapping[str, Any], where: str) -> int:
        total = 0
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= self.MAX_CONTEXT_ELEMENTS:
            rec.violations.append(
                f"invalid_blocks: {where}.elements: 1..{self.MAX_CONTEXT_ELEMENTS} elements"
            )
            elements = []
        for j, element in enumerate(elements):
            if isinstance(element, Mapping) and element.get("type") == "image":
                continue
            total += self._text_object(
                rec,
                element,
                f"{where}.elements[{j}]",
                low=1,
                high=self.MAX_SECTION,
                kinds=("mrkdwn", "plain_text"),
            )
        return total

    def answer(self, rec: Received) -> tuple[int, dict[str, str], str]:
        if rec.violations:
            return 400, {"Content-Type": "text/plain"}, rec.violations[0].split(":", 1)[0]
        if self.last_ok is not None and rec.at - self.last_ok < 1.0 / self.rate - self.tolerance:
            rec.reason = "rate_limited"
            return 429, {"Retry-After": str(self.retry_after), "Content-Type": "text/plain"}, "rate_limited"
        self.last_ok = rec.at
        return 200, {"Content-Type": "text/plain"}, "ok"


# --- PagerDuty Events API v2 ---


class PagerDutyReceiver(Receiver):
    """Events API v2: validates every event, 202 on success and 400 on invalid.

    Keeps the open incidents per (routing_key, dedup_key). A resolve or acknowledge of a
    key never triggered with that routing key is answered 202 (as PagerDuty does) but
    recorded as a violation.
    """

    ACTIONS = ("trigger", "acknowledge", "resolve")
    SEVERITIES = ("critical", "error", "warning", "info")
    MAX_SUMMARY = 1024
    MAX_DEDUP = 255
    MAX_BYTES = 512 * 1024

    def __init__(self) -> None:
        super().__init__()
        self.open: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def events(self) -> list[dict[str, Any]]:
        """The accepted events, in order."""
        return [r.parsed for r in self.accepted]

    def incidents_opened(self) -> int:
        """Triggers that opened an incident: a trigger of a dedup key already open adds to it."""
        open_keys: set[str] = set()
        opened = 0
        for e in self.events:
            if e["event_action"] == "trigger":
                opened += e["dedup_key"] not in open_keys
                open_keys.add(e["dedup_key"])
            elif e["event_action"] == "resolve":
                open_keys.discard(e["dedup_key"])
        return opened

    def inspect(self, rec: Received) -> None:
        if len(rec.body) > self.MAX_BYTES:
            rec.violations.append(f"event is {len(rec.body)} bytes > {self.MAX_BYTES}")
        event = json_body(rec, bad="invalid event")
        if event is None:
            return
        if not isinstance(event, Mapping):
            rec.violations.append("the body is not a JSON object")
            return
        problems = rec.violations
        key = event.get("routing_key")
        if not isinstance(key, str) or len(key) != 32:
            problems.append("routing_key must be a 32-character integration key")
        action = event.get("event_action")
        if action not in self.ACTIONS:
            problems.append(f"event_action {action!r} not in {self.ACTIONS}")
        dedup = event.get("dedup_key")
        if dedup is not None and (not isinstance(dedup, str) or not 1 <= len(dedup) <= self.MAX_DEDUP):
            problems.append(f"dedup_key must be 1..{self.MAX_DEDUP} characters")
        if action in ("acknowledge", "resolve") and dedup is None:
            problems.append(f"{action} needs a dedup_key")
        if action != "trigger":
            return
        payload = event.get("payload")
        if not isinstance(payload, Mapping):
            problems.append("trigger needs a payload object")
            return
        self._payload(payload, problems)
        for name in ("images", "links"):
            if name in event and not isinstance(event[name], list):
                problems.append(f"{name} must be a list")

    def _payload(self, payload: Mapping[str, Any], problems: list[str]) -> None:
        """A trigger's `payload` object."""
        summary = payload.get("summary")
        if not isinstance(summary, str) or not 1 <= len(summary) <= self.MAX_SUMMARY:
            size = len(summary) if isinstance(summary, str) else None
            problems.append(f"payload.summary has {size} characters, not 1..{self.MAX_SUMMARY}")
        source = payload.get("source")
        if not isinstance(source, str) or not source:
            problems.append("payload.source must be a non-empty string")
        if payload.get("severity") not in self.SEVERITIES:
            problems.append(f"payload.severity {payload.get('severity')!r} not in {self.SEVERITIES}")
        if "custom_details" in payload and not isinstance(payload["custom_details"], Mapping):
            problems.append("payload.custom_details must be an object")
        timestamp = payload.get("timestamp")
        if timestamp is not None:
            try:
                datetime.fromisoformat(str(timestamp))
            except ValueError:
                problems.append(f"payload.timestamp {timestamp!r} is not ISO 8601")
        for name in ("component", "group", "class"):
            if name in payload and not isinstance(payload[name], str):
                problems.append(f"payload.{name} must be a string")

    def answer(self, rec: Received) -> tuple[int, dict[str, str], str]:
        if rec.violations:
            body = {"status": "invalid event", "message": "Event object is invalid", "errors": rec.violations}
            return 400, {"Content-Type": "application/json"}, json.dumps(body)
        event = rec.parsed
        routing_key, action = event["routing_key"], event["event_action"]
        dedup = event.get("dedup_key") or uuid.uuid4().hex
        if action == "trigger":
            self.open[(routing_key, dedup)] = event
        elif (routing_key, dedup) not in self.open:
            rec.violations.append(f"{action} of dedup_key {dedup!r} never triggered with this routing_key")
        elif action == "resolve":
            del self.open[(routing_key, dedup)]
        body = {"status": "success", "message": "Event processed", "dedup_key": dedup}
        return 202, {"Content-Type": "application/json"}, json.dumps(body)


# --- generic webhooks: JSON, CloudEvents, Standard Webhooks ---


def parse_cloudevent(headers: Mapping[str, str], body: bytes) -> CloudEventSeen:
    """Parse a structured- or binary-mode HTTP CloudEvent with the cloudevents SDK (2.x or 1.x)."""
    try:
        from cloudevents.core.bindings.http import HTTPMessage, from_http_event
    except ImportError:  # cloudevents 1.x
        from cloudevents.http import from_http  # type: ignore[import-not-found]

        event = from_http(dict(headers), body)
        return CloudEventSeen(dict(event.get_attributes()), event.get_data())
    event = from_http_event(HTTPMessage(dict(headers), body))
    return CloudEventSeen(dict(event.get_attributes()), event.get_data())


REQUIRED_CE = ("specversion", "id", "source", "type")


class WebhookReceiver(Receiver):
    """A generic endpoint: records raw requests; optionally verifies Standard Webhooks
    signatures (401 when wrong) and parses CloudEvents with the SDK (400 when invalid)."""

    def __init__(self, *, secret: str | None = None, cloudevents: bool = False, ok_status: int = 200) -> None:
        super().__init__()
        self.secret = secret
        self.cloudevents = cloudevents
        self.ok_status = ok_status

    def inspect(self, rec: Received) -> None:
        if self.secret is not None:
            self._verify(rec)
        if self.cloudevents:
            self._parse_cloudevents(rec)
            return
        json_body(rec, bad="invalid")

    def _verify(self, rec: Received) -> None:
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        assert self.secret is not None
        try:
            Webhook(self.secret).verify(rec.body, rec.headers, json_parse=False)
        except (WebhookVerificationError, ValueError) as err:
            rec.violations.append(f"signature: {err}")

    def _parse_cloudevents(self, rec: Received) -> None:
        content_type = rec.headers.get("content-type", "")
        binary = any(name.startswith("ce-") for name in rec.headers)
        try:
            if content_type.startswith("application/cloudevents-batch+json"):
                items = json.loads(rec.body)
                rec.parsed = items
                if not isinstance(items, list):
                    rec.violations.append("cloudevents: a batch must be a JSON array")
                    return
                for i, item in enumerate(items):
                    missing = [a for a in REQUIRED_CE if not (isinstance(item, dict) and item.get(a))]
                    if missing:
                        rec.violations.append(f"cloudevents: batch[{i}] lacks {missing}")
                        continue
                    one = json.dumps(item).encode()
                    ce_headers = {"content-type": "application/cloudevents+json"}
                    rec.cloudevents.append(parse_cloudevent(ce_headers, one))
            elif binary:
                missing = [a for a in REQUIRED_CE if not rec.headers.get(f"ce-{a}")]
                if missing:
                    rec.violations.append(f"cloudevents: binary mode lacks ce-{missing} headers")
                    return
                rec.cloudevents.append(parse_cloudevent(rec.headers, rec.body))
            elif content_type.startswith("application/cloudevents+json"):
                rec.parsed = json.loads(rec.body)
                missing = [a for a in REQUIRED_CE if not rec.parsed.get(a)]
                if missing:
                    rec.violations.append(f"cloudevents: structured event lacks {missing}")
                    return
                rec.cloudevents.append(parse_cloudevent(rec.headers, rec.body))
            else:
                rec.violations.append(f"cloudevents: Content-Type {content_type!r} is no CloudEvents mode")
        except Exception as err:  # the SDK's validation errors have no common base across versions
            rec.violations.append(f"cloudevents: {type(err).__name__}: {err}")
        for ce in rec.cloudevents:
            if ce.attributes.get("specversion") != "1.0":
                rec.violations.append(f"cloudevents: specversion {ce.attributes.get('specversion')!r}")

    def answer(self, rec: Received) -> tuple[int, dict[str, str], str]:
        if any(v.startswith("signature:") for v in rec.violations):
            return 401, {}, "bad signature"
        if rec.violations:
            return 400, {}, rec.violations[0]
        return self.ok_status, {}, ""


class PathEchoReceiver(Receiver):
    """Refuses every request and echoes back only the path it was called on (with `query`, the
    query string too), as many frameworks' "no route" pages do: a webhook's token in its URL
    comes back in the error body without the rest of the URL."""

    def __init__(self, *, status: int = 404, query: bool = False) -> None:
        super().__init__()
        self.status = status
        self.query = query

    def answer(self, rec: Received) -> tuple[int, dict[str, str], str]:
        shown = rec.path if self.query else rec.path.partition("?")[0]
        return self.status, {}, f"no route for {rec.method} {shown}"
