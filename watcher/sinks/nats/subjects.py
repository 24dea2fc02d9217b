"""Where an event goes in NATS and what travels with it: its subject, its headers, its size on the
wire. Pure."""

from __future__ import annotations

import hashlib
import re

from watcher.model.events import SCHEMA_VERSION, Event

__all__ = ["node_token", "subject_for", "message_headers", "wire_size"]

_DNS_TOKEN = re.compile(r"[a-z0-9-]+(?:\.[a-z0-9-]+)*")


def node_token(node: str) -> str:
    """The node as one subject token: a DNS name (every Kubernetes node's) with its dots as `_`,
    which no DNS name has, so two DNS names never share a token; any other name is cut to safe
    characters and told apart by a digest of it, after an `X`: no DNS name's token has an
    upper-case letter, so none can be taken for another name's (`gpu-1-<digest>` is a DNS name)."""
    if _DNS_TOKEN.fullmatch(node) and len(node) <= 253:
        return node.replace(".", "_")
    safe = re.sub(r"[^A-Za-z0-9-]", "-", node)[:64]
    digest = hashlib.sha256(node.encode(errors="surrogatepass")).hexdigest()[:12]
    return f"{safe}-X{digest}"


def subject_for(prefix: str, event: Event) -> str:
    last = "send-test" if _is_test(event) else str(event.kind)
    return f"{prefix}.{node_token(event.node)}.{last}"


_HEADER_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _is_test(event: Event) -> bool:
    return event.details.get("test") is True


def message_headers(event: Event) -> dict[str, str]:
    headers = {
        "Nats-Msg-Id": event.id,
        "Prw-Schema": SCHEMA_VERSION,
        "Prw-Seq": str(event.seq),
        # The node name is the operator's, but a header line must stay one line whatever it is.
        "Prw-Node": _HEADER_UNSAFE.sub("?", event.node),
        # A consumer routing on this header must not take send-test's device.removed for one.
        "Prw-Kind": "send-test" if _is_test(event) else str(event.kind),
    }
    if _is_test(event):
        headers["Prw-Test"] = "true"
    return headers


def wire_size(headers: dict[str, str], payload: bytes) -> int:
    """What the server counts against its max_payload: the header block as the client writes it
    (`NATS/1.0`, one `Key: value` line each, a blank line) and the payload."""
    block = len(b"NATS/1.0\r\n\r\n") + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return block + len(payload)
