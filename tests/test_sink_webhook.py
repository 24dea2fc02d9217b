"""The webhook sink against receivers that check what they are sent (testkit/receivers.py): JSON,
CloudEvents (structured, batched, binary), Standard Webhooks signatures, custom headers and bearer
tokens, TLS with a private CA, and names that cannot forge lines or oversize headers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from testkit.certificates import self_signed, server_context
from testkit.http_sinks import GPU, NODE, SIGNING_SECRET, added, hook_config, make_event, removed, sink_config
from testkit.receivers import WebhookReceiver
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import envelope, event_schema
from watcher.store.store import Store


@pytest.fixture
async def ce_hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver(cloudevents=True))


async def test_webhook_json_single_event(hook: WebhookReceiver, make_sink: Any) -> None:
    event = removed(1)
    assert (await make_sink(hook_config(hook)).deliver([event])).delivered
    (req,) = hook.requests
    assert req.accepted and req.path == "/hook"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["user-agent"].startswith("pod-resources-watcher/")
    assert req.parsed == event.to_dict()
    jsonschema.validate(req.parsed, event_schema())


async def test_webhook_json_batch(hook: WebhookReceiver, make_sink: Any) -> None:
    events = [removed(1), added(2), added(3, "GPU-1")]
    assert (await make_sink(hook_config(hook, batch=True)).deliver(events)).delivered
    (req,) = hook.requests
    assert req.accepted and req.parsed == [e.to_dict() for e in events]


async def test_webhook_cloudevents_structured(ce_hook: WebhookReceiver, make_sink: Any) -> None:
    event = removed(1)
    cfg = hook_config(ce_hook, format="cloudevents", type_prefix="com.example.inventory")
    assert (await make_sink(cfg).deliver([event])).delivered
    (req,) = ce_hook.requests
    assert req.accepted, req.violations
    assert req.headers["content-type"].startswith("application/cloudevents+json")
    (ce,) = req.cloudevents
    assert ce.id == event.id and ce.type == "com.example.inventory.device.removed"
    assert NODE in ce.source and ce.subject == f"{GPU}/GPU-0"
    assert ce.data == event.to_dict()
    assert ce.attributes["time"] == datetime.fromisoformat(event.time)


async def test_webhook_cloudevents_structured_batch(ce_hook: WebhookReceiver, make_sink: Any) -> None:
    events = [removed(1), added(2, "GPU-1"), make_event(Kind.MEMORY_CHANGED, Severity.WARNING, "mem", 3)]
    cfg = hook_config(ce_hook, format="cloudevents", batch=True)
    assert (await make_sink(cfg).deliver(events)).delivered
    (req,) = ce_hook.requests
    assert req.accepted, req.violations
    assert req.headers["content-type"].startswith("application/cloudevents-batch+json")
    assert [ce.id for ce in req.cloudevents] == [e.id for e in events]
    assert [ce.type for ce in req.cloudevents] == [
        f"io.github.pod-resources-watcher.{e.kind}" for e in events
    ]
    assert all(NODE in ce.source for ce in req.cloudevents)
    assert [ce.data for ce in req.cloudevents] == [e.to_dict() for e in events]


async def test_webhook_cloudevents_binary(ce_hook: WebhookReceiver, make_sink: Any) -> None:
    event = removed(1)
    assert (await make_sink(hook_config(ce_hook, format="cloudevents-binary")).deliver([event])).delivered
    (req,) = ce_hook.requests
    assert req.accepted, req.violations
    assert req.headers["ce-specversion"] == "1.0" and req.headers["ce-id"] == event.id
    (ce,) = req.cloudevents
    assert ce.id == event.id and ce.type == "io.github.pod-resources-watcher.device.removed"
    assert NODE in ce.source and ce.subject == f"{GPU}/GPU-0"
    assert ce.data == event.to_dict()


async def test_webhook_cloudevents_binary_percent_encodes_header_values(
    ce_hook: WebhookReceiver, make_sink: Any
) -> None:
    """Binary-mode attributes are percent-encoded in headers (CloudEvents HTTP binding 3.1.3.2),
    so a receiver decoding them gets the value back unchanged."""
    device = "GPU%41-0"
    event = removed(1, device)
    assert (await make_sink(hook_config(ce_hook, format="cloudevents-binary")).deliver([event])).delivered
    (ce,) = ce_hook.requests[0].cloudevents
    assert ce.subject == f"{GPU}/{device}"


async def test_webhook_standard_webhooks_signature(
    signed_hook: WebhookReceiver, make_sink: Any, signing_env: None
) -> None:
    sink = make_sink(hook_config(signed_hook, signing_secret="${HOOK_SIGNING_SECRET}"))
    event = removed(1)
    assert (await sink.deliver([event])).delivered
    (req,) = signed_hook.requests
    assert req.accepted, req.violations  # verified by the standardwebhooks package
    assert req.headers["webhook-id"] == event.id
    assert abs(int(req.headers["webhook-timestamp"]) - req.wall) < 5
    assert all(sig.startswith("v1,") for sig in req.headers["webhook-signature"].split(" "))
    # Verified independently of the receiver, and a tampered body fails.
    assert Webhook(SIGNING_SECRET).verify(req.body, req.headers) == event.to_dict()
    with pytest.raises(WebhookVerificationError, match="signature"):
        Webhook(SIGNING_SECRET).verify(req.body.replace(b"GPU-0", b"GPU-1"), req.headers)


async def test_webhook_signed_batch_has_a_stable_message_id(
    signed_hook: WebhookReceiver, make_sink: Any, signing_env: None
) -> None:
    sink = make_sink(hook_config(signed_hook, batch=True, signing_secret="${HOOK_SIGNING_SECRET}"))
    events = [removed(1), added(2)]
    assert (await sink.deliver(events)).delivered
    assert (await sink.deliver(events)).delivered
    first, again = signed_hook.requests
    assert first.accepted and again.accepted, signed_hook.violations
    assert first.headers["webhook-id"] == again.headers["webhook-id"]
    assert first.headers["webhook-id"] not in {e.id for e in events}


async def test_webhook_custom_headers_and_bearer_token_arrive(
    hook: WebhookReceiver, make_sink: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TENANT_ID", "tenant-42-abcdef")
    token_file = tmp_path / "token"
    token_file.write_text("bearer-token-from-file-0123456789\n")
    cfg = hook_config(
        hook, headers={"X-Tenant": "${TENANT_ID}", "X-Static": "yes"}, bearer_token_file=str(token_file)
    )
    assert (await make_sink(cfg).deliver([removed(1)])).delivered
    (req,) = hook.requests
    assert req.headers["x-tenant"] == "tenant-42-abcdef" and req.headers["x-static"] == "yes"
    assert req.headers["authorization"] == "Bearer bearer-token-from-file-0123456789"
    # The file is re-read when it changes (rotation without a restart).
    token_file.write_text("rotated-bearer-token-9876543210-longer\n")
    assert (await make_sink(cfg).deliver([removed(2)])).delivered
    assert hook.requests[1].headers["authorization"] == "Bearer rotated-bearer-token-9876543210-longer"


@pytest.fixture
def tls_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), and its key."""
    return self_signed(tmp_path)


async def test_webhook_over_tls_verifies_the_server_with_ca_file(
    serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]],
    make_sink: Any,
    tls_cert: tuple[Path, Path],
) -> None:
    cert, key = tls_cert
    rx = WebhookReceiver()
    rx.ssl_context = server_context(cert, key)
    await serve(rx)
    assert rx.url().startswith("https://")
    assert (await make_sink(hook_config(rx, ca_file=str(cert))).deliver([removed(1)])).delivered
    # Not trusted without the CA: nothing is sent, and the error says why.
    untrusted = await make_sink(hook_config(rx)).deliver([removed(2)])
    assert not untrusted.delivered and "certificate" in untrusted.error.lower(), untrusted
    assert (await make_sink(hook_config(rx, tls_verify=False)).deliver([removed(3)])).delivered
    assert [r.parsed["seq"] for r in rx.requests] == [1, 3]


async def test_hostile_names_cannot_forge_lines_or_oversize_headers(
    ce_hook: WebhookReceiver, make_sink: Any, store: Store
) -> None:
    """A device id chosen by a plugin: ANSI escapes and newlines are escaped in the summary every
    person sees, and the binary-mode subject header stays small."""
    device = "GPU-\x1b[31mOK\nFAKE: all healthy\u202e" + "x" * 5000
    event = envelope(
        Change(
            Kind.DEVICE_ADDED, Severity.INFO, f"{GPU} {device} joined", {"resource": GPU, "device": device}
        ),
        seq=1,
        node=NODE,
        cycle="c",
        before=None,
        after=None,
    )
    assert "\n" not in event.summary and "\x1b" not in event.summary and "\u202e" not in event.summary
    assert "\\x1b[31mOK\\x0aFAKE" in event.summary
    assert event.details["device"] == device  # the machine-readable record keeps the bytes
    sink = make_sink(sink_config("ce", type="webhook", url=ce_hook.url("/"), format="cloudevents-binary"))
    assert (await sink.deliver([event])).delivered
    (req,) = ce_hook.requests
    assert len(req.headers["ce-subject"]) <= 3 * 600
