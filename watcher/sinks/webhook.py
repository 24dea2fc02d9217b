"""Generic webhooks: the event JSON (one, or a batch array), or CloudEvents 1.0, optionally
signed per Standard Webhooks (webhook-id = event id, so receivers can de-duplicate retries), and
optionally carrying an audit log's head (X-Audit-Head), so the node's log can be checked later
against what reached this receiver."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from watcher.config import ConfigError, field_meta
from watcher.model.events import Event
from watcher.secrets import Secret, expand_env
from watcher.sinks.audit import Head, HeadError, head_path
from watcher.sinks.base import BaseSinkSettings, HttpSinkSettings, Outcome, SinkContext
from watcher.sinks.http import HttpClient, HttpSink
from watcher.sinks.registry import SinkType, register

__all__ = [
    "WebhookSink",
    "WebhookSinkSettings",
    "check_signing_secret",
    "cloudevent",
    "sign",
    "message_id",
    "audit_head_header",
]

log = structlog.get_logger("watcher.sinks.webhook")


@dataclass(frozen=True)
class WebhookSinkSettings(BaseSinkSettings, HttpSinkSettings):
    url: Secret | None = field(
        default=None, metadata=field_meta("Where events are POSTed (secret).", secret=True)
    )
    format: Literal["json", "cloudevents", "cloudevents-binary"] = field(
        default="json",
        metadata=field_meta(
            "json: the event; cloudevents: structured CloudEvents 1.0; -binary: ce-* headers."
        ),
    )
    batch: bool = field(
        default=False,
        metadata=field_meta("POST up to max_batch events as one JSON array (not in binary mode)."),
    )
    type_prefix: str = field(
        default="io.github.pod-resources-watcher",
        metadata=field_meta("Reverse-DNS prefix of the CloudEvents type: PREFIX.device.removed."),
    )
    signing_secret: Secret | None = field(
        default=None, metadata=field_meta("Standard Webhooks secret, whsec_... (secret).", secret=True)
    )
    bearer_token: Secret | None = field(
        default=None, metadata=field_meta("Sent as Authorization: Bearer (secret).", secret=True)
    )
    headers: Mapping[str, str] = field(
        default_factory=dict,
        metadata=field_meta("Extra headers; values may use ${ENV} and, like secrets, are never printed."),
    )
    audit_head: str | None = field(
        default=None,
        metadata=field_meta(
            "Name of a file sink: every request carries its audit log's head as X-Audit-Head "
            "(NAME;n=N;hash=HASH), so a rewrite of the node's log shows from here "
            "(`audit verify --expect`)."
        ),
    )
    type: Literal["webhook"] = "webhook"


def check_signing_secret(value: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret `whsec_<base64 of 24..64 bytes>`."""
    if not value.startswith("whsec_"):
        raise ValueError("expected a Standard Webhooks secret starting with whsec_")
    try:
        key = base64.b64decode(value.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the part after whsec_ is not valid base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"the key must be 24 to 64 bytes, got {len(key)}")
    return key


def _check(path: str, settings: WebhookSinkSettings) -> None:
    if settings.signing_secret is not None:
        try:
            check_signing_secret(settings.signing_secret.get())
        except ValueError as err:
            raise ConfigError(f"{path}.signing_secret: {err}") from err
    if settings.batch and settings.format == "cloudevents-binary":
        raise ConfigError(
            f"{path}.batch: true is not allowed with format 'cloudevents-binary' (one event per request)"
        )


# Device ids and pod names are chosen by others: the subject also travels as a header (binary
# mode, percent-encoded, up to 3 bytes per character), and receivers cap headers at a few KiB.
MAX_SUBJECT = 512


def _subject(event: Event) -> str | None:
    d = event.details
    subject: str | None = None
    if isinstance(d.get("resource"), str) and isinstance(d.get("device"), str):
        subject = f"{d['resource']}/{d['device']}"
    elif all(isinstance(d.get(k), str) for k in ("namespace", "pod", "container")):
        subject = f"{d['namespace']}/{d['pod']}/{d['container']}"
    elif isinstance(d.get("resource"), str):
        subject = d["resource"]
    return None if subject is None else subject[:MAX_SUBJECT]


def ce_source(node: str) -> str:
    return f"/pod-resources-watcher/nodes/{node}"


def cloudevent(event: Event, *, type_prefix: str) -> dict[str, Any]:
    """The structured-mode CloudEvent for `event` (the data is the whole envelope)."""
    ce: dict[str, Any] = {
        "specversion": "1.0",
        "id": event.id,
        "source": ce_source(event.node),
        "type": f"{type_prefix}.{event.kind}",
        "time": event.time,
        "datacontenttype": "application/json",
        "data": event.to_dict(),
    }
    subject = _subject(event)
    if subject:
        ce["subject"] = subject
    return ce


def ce_header_value(value: str) -> str:
    """Percent-encode a binary-mode attribute (CloudEvents HTTP binding 3.1.3.2): UTF-8 bytes
    outside printable ASCII, and space, double quote and percent."""
    out = []
    for byte in value.encode():
        if 0x21 <= byte <= 0x7E and byte not in (0x22, 0x25):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def message_id(events: Sequence[Event]) -> str:
    """Stable across retries of the same batch: the event id, or one derived from the batch."""
    if len(events) == 1:
        return events[0].id
    joined = ",".join(e.id for e in events)
    return "batch_" + hashlib.sha256(joined.encode()).hexdigest()[:32]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks `webhook-signature` value (v1, HMAC-SHA256)."""
    key = check_signing_secret(secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def audit_head_header(sink: str, head: Head) -> str:
    """The X-Audit-Head value: which log, its last record's number and hash."""
    return f"{sink};n={head.n};hash={head.hash}"


class WebhookSink(HttpSink):
    def __init__(self, settings: WebhookSinkSettings, *, node: str, audit_log: Path | None = None) -> None:
        assert settings.url is not None
        self.name = settings.name
        self.settings = settings
        self.node = node
        self.http = HttpClient.for_sink(settings)
        self.audit_head_file = None if audit_log is None else head_path(audit_log)

    def _audit_head(self) -> str | None:
        """The X-Audit-Head value from the head file as it is on disk now (what the file sink
        saved after its records were written), or None when there is none yet."""
        if self.audit_head_file is None:
            return None
        try:
            head = Head.read(self.audit_head_file)
        except (HeadError, OSError) as err:
            # The file sink always leaves a whole head; say so, and send the event without one.
            log.warning(
                "cannot read the audit log's head; sending without X-Audit-Head",
                sink=self.name,
                path=str(self.audit_head_file),
                error=str(err),
            )
            return None
        assert self.settings.audit_head is not None
        return None if head is None else audit_head_header(self.settings.audit_head, head)

    def _request(
        self, events: Sequence[Event], audit_head: str | None = None
    ) -> tuple[bytes, dict[str, str]]:
        s = self.settings
        headers: dict[str, str] = {}
        if audit_head is not None:
            headers["X-Audit-Head"] = audit_head
        if s.format == "cloudevents-binary":
            (event,) = events
            ce = cloudevent(event, type_prefix=s.type_prefix)
            body_obj: Any = ce.pop("data")
            del ce["datacontenttype"]
            headers["Content-Type"] = "application/json"
            headers.update({f"ce-{k}": ce_header_value(str(v)) for k, v in ce.items()})
        elif s.format == "cloudevents":
            ces = [cloudevent(e, type_prefix=s.type_prefix) for e in events]
            body_obj = ces if s.batch else ces[0]
            headers["Content-Type"] = (
                "application/cloudevents-batch+json" if s.batch else "application/cloudevents+json"
            )
        else:
            dicts = [e.to_dict() for e in events]
            body_obj = dicts if s.batch else dicts[0]
            headers["Content-Type"] = "application/json"
        body = json.dumps(body_obj, separators=(",", ":"), ensure_ascii=False).encode()
        headers.update(self._extra_headers())
        if s.signing_secret is not None:
            msg_id = message_id(events)
            ts = int(time.time())
            headers["webhook-id"] = msg_id
            headers["webhook-timestamp"] = str(ts)
            headers["webhook-signature"] = sign(s.signing_secret.get(), msg_id, ts, body)
        return body, headers

    def _extra_headers(self) -> Mapping[str, str]:
        headers = {k: expand_env(v) for k, v in self.settings.headers.items()}
        if self.settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.settings.bearer_token.get()}"
        return headers

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        assert self.settings.url is not None
        one_per_request = not self.settings.batch or self.settings.format == "cloudevents-binary"
        groups = [[e] for e in events] if one_per_request else [list(events)]
        outcome = Outcome.ok()
        audit_head = None if self.audit_head_file is None else await asyncio.to_thread(self._audit_head)
        for group in groups:
            body, headers = self._request(group, audit_head)
            outcome = await self.send(self.settings.url.get(), body, headers)
            if not outcome.delivered:
                return outcome
        return outcome


def _webhook_sink(settings: WebhookSinkSettings, context: SinkContext) -> WebhookSink:
    audit_log = None
    if settings.audit_head is not None:
        audit_log = context.audit_logs.get(settings.audit_head)
        if audit_log is None:
            raise ConfigError(
                f"sinks.{settings.name}.audit_head: {settings.audit_head!r} is no file sink of this config"
            )
    return WebhookSink(settings, node=context.node, audit_log=audit_log)


register(
    SinkType(
        name="webhook",
        settings=WebhookSinkSettings,
        factory=_webhook_sink,
        required_secrets=("url",),
        validate=_check,
        order=50,
    )
)
