"""The HTTP sinks against real receivers that enforce each service's rules (testkit/receivers.py):
Slack, PagerDuty, webhooks (JSON, CloudEvents, Standard Webhooks), the one retry policy end to
end through the Dispatcher and a real Outbox, and secrets that never leak."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import math
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import jsonschema
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from testkit.certificates import self_signed, server_context
from testkit.dispatching import dispatching, open_outbox
from testkit.hostile_text import INVISIBLE, LOOK_ALIKE, OVERDRAWN, hidden_in
from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from testkit.receiver import Receiver
from testkit.receivers import PagerDutyReceiver, PathEchoReceiver, SlackReceiver, WebhookReceiver
from watcher.cli import main
from watcher.config import ConfigError
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.affected import annotate
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, UNKNOWN, Owner, PodIndex, PodMeta
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.events import Event, envelope, event_schema
from watcher.model.lifecycle import reachable, unreachable
from watcher.secrets import redact
from watcher.settings_file import parse_settings
from watcher.sinks.base import BaseSinkSettings as SinkSettings
from watcher.sinks.base import Outcome, Sink
from watcher.sinks.http import outcome_of, parse_retry_after
from watcher.sinks.pagerduty import pagerduty_event
from watcher.sinks.registry import build_sink
from watcher.sinks.slack import slack_message
from watcher.store.store import Store

NODE = "node-a"
GPU = "nvidia.com/gpu"
POD = "default/trainer-0/main"
PD_KEY = "0123456789abcdef0123456789abcdef"
SIGNING_SECRET = "whsec_" + base64.b64encode(b"signing-key-for-tests-0123456789").decode()
R = TypeVar("R", bound=Receiver)


# --- events ---


def make_event(
    kind: Kind, severity: Severity, summary: str, seq: int, *, cycle: str = "cycle-1", **details: Any
) -> Event:
    change = Change(kind, severity, summary, details)
    return envelope(change, seq=seq, node=NODE, cycle=cycle, before=None, after=None)


def removed(seq: int, device: str = "GPU-0", *, resource: str = GPU, cycle: str = "cycle-1") -> Event:
    summary = f"{resource} {device} left allocatable while allocated to {POD} (unhealthy or unplugged)"
    return make_event(
        Kind.DEVICE_REMOVED,
        Severity.CRITICAL,
        summary,
        seq,
        cycle=cycle,
        resource=resource,
        device=device,
        allocated_to=[POD],
        namespaces=["default"],
    )


def added(seq: int, device: str = "GPU-0", *, resource: str = GPU, cycle: str = "cycle-1") -> Event:
    summary = f"{resource} {device} joined allocatable on NUMA 0 (hot-plugged or healed)"
    return make_event(
        Kind.DEVICE_ADDED, Severity.INFO, summary, seq, cycle=cycle, resource=resource, device=device
    )


def lifecycle_event(change: Change, seq: int) -> Event:
    return envelope(change, seq=seq, node=NODE, cycle=f"cycle-{seq}", before=None, after=None)


MIXED = [
    (Kind.DEVICE_ADDED, Severity.INFO),
    (Kind.DEVICE_REMOVED, Severity.CRITICAL),
    (Kind.ALLOCATION_ADDED, Severity.INFO),
    (Kind.ALLOCATION_REMOVED, Severity.INFO),
    (Kind.ALLOCATION_CHANGED, Severity.WARNING),
    (Kind.CPU_ADDED, Severity.INFO),
    (Kind.MEMORY_CHANGED, Severity.WARNING),
    (Kind.CAPACITY_CHANGED, Severity.WARNING),
]


def mixed_cycle(n: int, *, start: int = 1, cycle: str = "cycle-big") -> list[Event]:
    events = []
    for i in range(n):
        kind, severity = MIXED[i % len(MIXED)]
        summary = f"{kind} #{i:03d}: {GPU} GPU-{i:04d} on default/pod-{i:04d}/main"
        events.append(
            make_event(kind, severity, summary, start + i, cycle=cycle, resource=GPU, device=f"GPU-{i:04d}")
        )
    return events


def sink_config(name: str, **table: Any) -> SinkSettings:
    (cfg,) = parse_settings({"sinks": {name: table}}).sinks
    return cfg


# --- fixtures: receivers, sinks, the outbox ---


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[R], Awaitable[R]]]:
    """Start receivers on 127.0.0.1; they are closed after the test."""
    started: list[Receiver] = []

    async def start(receiver: R) -> R:
        started.append(await receiver.start())
        return receiver

    yield start
    for receiver in reversed(started):
        await receiver.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A real outbox: the dispatcher's queues, and the KeyValue the PagerDuty sink keeps."""
    async with open_outbox(tmp_path / "outbox.db") as outbox:
        yield outbox


@pytest.fixture
async def make_sink(
    serve: Callable[[Receiver], Awaitable[Receiver]], store: Store, tmp_path: Path
) -> AsyncIterator[Callable[[SinkSettings], Sink]]:
    """Build sinks with `build_sink`; closed (before the receivers) after the test."""
    made: list[Sink] = []

    def make(cfg: SinkSettings) -> Sink:
        sink = build_sink(cfg, node=NODE, state_dir=tmp_path, store=store)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        await sink.close()


@pytest.fixture
async def slack(serve: Callable[[SlackReceiver], Awaitable[SlackReceiver]]) -> SlackReceiver:
    return await serve(SlackReceiver(rate=1.0))


@pytest.fixture
async def pagerduty(serve: Callable[[PagerDutyReceiver], Awaitable[PagerDutyReceiver]]) -> PagerDutyReceiver:
    return await serve(PagerDutyReceiver())


@pytest.fixture
async def hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver())


@pytest.fixture
async def signed_hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver(secret=SIGNING_SECRET))


@pytest.fixture
async def ce_hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver(cloudevents=True))


@pytest.fixture
def pd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PD_ROUTING_KEY", PD_KEY)


@pytest.fixture
def signing_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SIGNING_SECRET", SIGNING_SECRET)


# These tests look at each service's rules, so ends go out at once; the hold-down before them
# (resolve_hold_down) has its own tests (tests/test_flap_pages.py).
AT_ONCE = {"resolve_hold_down": 0}


def slack_config(rx: SlackReceiver, **extra: Any) -> SinkSettings:
    table = {**AT_ONCE, **extra}
    return sink_config("slack", type="slack", url=rx.url("/services/T000/B000/XXXXXXXX"), **table)


def pd_config(rx: PagerDutyReceiver, **extra: Any) -> SinkSettings:
    table = {**AT_ONCE, **extra}
    return sink_config(
        "pager", type="pagerduty", routing_key="${PD_ROUTING_KEY}", endpoint=rx.url("/v2/enqueue"), **table
    )


def hook_config(rx: WebhookReceiver, **extra: Any) -> SinkSettings:
    return sink_config("hook", type="webhook", url=rx.url("/hook"), **extra)


def logged(entries: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("event", "").startswith(event)]


# --- Slack ---


def texts_of(msg: dict[str, Any], *types: str) -> list[str]:
    """The text of every block of the given types (context: each mrkdwn element)."""
    out = []
    for block in msg["blocks"]:
        if block["type"] not in types:
            continue
        if block["type"] == "context":
            out.extend(el["text"] for el in block["elements"] if el.get("type") == "mrkdwn")
        else:
            out.append(block["text"]["text"])
    return out


def slack_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


SECTION_TITLE = re.compile(r"^\S+ \*(?P<kind>[a-z_]+\.[a-z_]+)\* \((?P<count>\d+)\)$")
MORE = re.compile(r"^… and (?P<n>\d+) more$")
OMITTED = re.compile(r"^… and (?P<n>\d+) more changes$")


def account_for(msg: dict[str, Any]) -> tuple[dict[str, tuple[int, list[str], int]], int]:
    """kind -> (count in the title, listed lines, "and N more"), and the changes left out entirely."""
    kinds: dict[str, tuple[int, list[str], int]] = {}
    omitted = 0
    for text in texts_of(msg, "section"):
        if m := OMITTED.match(text):
            omitted += int(m["n"])
            continue
        title, *lines = text.split("\n")
        head = SECTION_TITLE.match(title)
        assert head is not None, f"unexpected section title {title!r}"
        more = 0
        if lines and (m := MORE.match(lines[-1])):
            more = int(m["n"])
            lines = lines[:-1]
        assert all(line.startswith("• ") for line in lines), lines
        kinds[head["kind"]] = (int(head["count"]), [line[2:] for line in lines], more)
    return kinds, omitted


async def test_slack_one_event_is_one_accepted_message(slack: SlackReceiver, make_sink: Any) -> None:
    sink = make_sink(slack_config(slack))
    event = removed(1)
    outcome = await sink.deliver([event])
    assert outcome.delivered and outcome.status == 200
    assert len(slack.requests) == 1 and not slack.violations, slack.violations
    msg = slack.messages[0]
    (header,) = texts_of(msg, "header")
    assert header.startswith(f"{NODE}: 1 change") and len(header) <= 150
    assert any(event.summary in text for text in texts_of(msg, "section"))
    assert msg["text"].startswith(f"{NODE}: 1 change") and event.summary in msg["text"]
    (context,) = texts_of(msg, "context")
    assert "seq 1" in context and "critical" in context


async def test_slack_500_changes_become_one_message_within_the_limits(
    slack: SlackReceiver, make_sink: Any
) -> None:
    sink = make_sink(slack_config(slack))
    events = mixed_cycle(500)
    outcome = await sink.deliver(events)
    assert outcome.delivered, outcome
    assert len(slack.requests) == 1 and not slack.violations, slack.violations
    msg = slack.messages[0]
    assert texts_of(msg, "header")[0].startswith(f"{NODE}: 500 changes")
    assert msg["text"].startswith(f"{NODE}: 500 change(s); {events[0].summary}")
    kinds, omitted = account_for(msg)
    by_kind: dict[str, list[Event]] = {}
    for e in events:
        by_kind.setdefault(str(e.kind), []).append(e)
    for kind, (count, lines, more) in kinds.items():
        group = by_kind[kind]
        assert count == len(group)
        # The first changes of each kind, in order, then "... and N more" for the rest.
        assert lines == [slack_escaped(e.summary) for e in group[: len(lines)]]
        assert len(lines) + more == count
    assert any(more for _, _, more in kinds.values()), "nothing was cut short: the test is too small"
    assert sum(count for count, _, _ in kinds.values()) + omitted == 500


async def test_slack_a_cycle_of_500_changes_is_one_message_through_the_dispatcher(
    slack: SlackReceiver, make_sink: Any, store: Store
) -> None:
    """Slack's defaults (group = "cycle") must turn one re-query's 500 changes into ONE message,
    as watcher/sinks/slack.py promises, not ten messages of 50 at one a second."""
    sink = make_sink(slack_config(slack))
    async with dispatching(store, [sink]) as run:
        await run.enqueue(mixed_cycle(500))
        (first,) = await slack.wait_accepted(1)
        slack.force(503, times=100)  # so that stopping does not drain more batches at 1/s
    header = texts_of(first.parsed, "header")[0]
    assert header.startswith(f"{NODE}: 500 changes"), header


async def test_slack_groups_by_cycle_and_keeps_to_one_message_a_second(
    slack: SlackReceiver, make_sink: Any, store: Store
) -> None:
    sink = make_sink(slack_config(slack, max_batch=1000))
    big, small = mixed_cycle(120, cycle="A"), mixed_cycle(3, start=121, cycle="B")
    async with dispatching(store, [sink]) as run:
        await run.enqueue(big + small)
        await run.deliveries.wait_for(lambda d: d.seqs("delivered") == list(range(1, 124)))
    assert [r.status for r in slack.requests] == [200, 200], [r.reason for r in slack.requests]
    assert not slack.violations
    headers = [texts_of(m, "header")[0] for m in slack.messages]
    assert headers[0].startswith(f"{NODE}: 120 changes") and headers[1].startswith(f"{NODE}: 3 changes")
    assert slack.requests[1].at - slack.requests[0].at >= 0.9


async def test_slack_429_from_the_rate_limit_is_retried_after_retry_after(
    slack: SlackReceiver, make_sink: Any, store: Store
) -> None:
    # A rate above Slack's: the receiver answers the second message 429 with Retry-After: 1.
    sink = make_sink(slack_config(slack, rate=50.0, retry_max_delay=0.05))
    async with dispatching(store, [sink]) as run:
        await run.enqueue([removed(1, cycle="A"), added(2, cycle="B")])
        await slack.wait_accepted(2)
    statuses = [r.status for r in slack.requests]
    assert statuses == [200, 429, 200], statuses
    assert slack.requests[1].reason == "rate_limited"
    assert slack.requests[2].at - slack.requests[1].at >= 0.95
    assert slack.requests[2].body == slack.requests[1].body


NASTY = 'GPU-<0> & "x" <!channel> <https://evil.example|click>'


async def test_slack_escapes_mrkdwn_control_characters_in_blocks(
    slack: SlackReceiver, make_sink: Any
) -> None:
    sink = make_sink(slack_config(slack))
    events = [added(1, NASTY), removed(2, NASTY)]
    assert (await sink.deliver(events)).delivered
    (msg,) = slack.messages
    texts = texts_of(msg, "section", "context")
    for text in texts:
        assert "<" not in text and ">" not in text, text
        assert "&" not in re.sub(r"&(amp|lt|gt);", "", text), text
    joined = "\n".join(texts)
    assert "&lt;!channel&gt;" in joined and "&amp;" in joined


async def test_slack_escapes_mrkdwn_control_characters_in_the_fallback_text(
    slack: SlackReceiver, make_sink: Any
) -> None:
    """The top-level `text` is mrkdwn too and is what notifications show: a device name with
    `<!channel>` must not ping the channel, nor `<url|label>` become a link."""
    sink = make_sink(slack_config(slack))
    assert (await sink.deliver([added(1, NASTY), removed(2, NASTY)])).delivered
    (msg,) = slack.messages
    assert "<!channel>" not in msg["text"] and "<https://evil.example|click>" not in msg["text"], msg["text"]
    assert "&lt;!channel&gt;" in msg["text"]


async def test_invisible_and_combining_characters_reach_people_escaped(
    slack: SlackReceiver, pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    """Zero-width, bidi and tag characters and combining marks in a device id are shown escaped in
    every text a person reads (Slack's blocks, header and notification, PagerDuty's summary): a
    look-alike of GPU-1 reads as something else, a stack of marks cannot draw over the message. The
    machine-readable details keep the exact id."""
    device = LOOK_ALIKE + "".join(INVISIBLE.values()) + OVERDRAWN
    event = removed(1, device)
    assert "GPU-1\\u200b" in event.summary and "\\U000e0061" in event.summary
    assert (await make_sink(slack_config(slack)).deliver([event])).delivered  # one: the header has it
    (msg,) = slack.messages
    for text in [msg["text"], *texts_of(msg, "header", "section", "context")]:
        assert hidden_in(text, allowed="\n") == [], text
    assert (await make_sink(pd_config(pagerduty)).deliver([event])).delivered
    (trigger,) = pagerduty.events
    assert hidden_in(trigger["payload"]["summary"]) == []
    assert trigger["payload"]["custom_details"]["details"]["device"] == device


# --- PagerDuty ---


async def test_pagerduty_device_removed_triggers_and_device_added_resolves_with_the_same_key(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    event = removed(1, "GPU-3")
    assert (await make_sink(pd_config(pagerduty)).deliver([event])).delivered
    (trigger,) = pagerduty.events
    key = trigger["dedup_key"]
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == PD_KEY
    assert NODE in key and GPU in key and "GPU-3" in key
    payload = trigger["payload"]
    assert payload["severity"] == "critical" and payload["source"] == NODE
    assert payload["summary"] == event.summary
    details = payload["custom_details"]["details"]
    assert details["resource"] == GPU and details["device"] == "GPU-3" and details["allocated_to"] == [POD]
    # Stable: another removal of the same device (another event id) has the same key; sent while
    # the incident is open, it adds nothing (no second trigger).
    again = pagerduty_event(removed(2, "GPU-3"), PD_KEY, active_keys=set())
    assert again is not None and again["dedup_key"] == key
    assert (await make_sink(pd_config(pagerduty)).deliver([removed(2, "GPU-3")])).delivered
    assert len(pagerduty.events) == 1
    # A new sink on the same store (an agent restart) still resolves what was triggered.
    assert (await make_sink(pd_config(pagerduty)).deliver([added(3, "GPU-3")])).delivered
    resolve = pagerduty.events[1]
    assert resolve == {"routing_key": PD_KEY, "event_action": "resolve", "dedup_key": key}
    assert not pagerduty.violations and not pagerduty.open


async def test_pagerduty_device_added_never_triggered_sends_nothing(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    outcome = await make_sink(pd_config(pagerduty)).deliver([added(1, "GPU-9")])
    assert outcome.delivered
    assert pagerduty.requests == []


async def test_pagerduty_kubelet_unreachable_triggers_and_reachable_resolves(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    sink = make_sink(pd_config(pagerduty))
    sock = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    down = lifecycle_event(
        unreachable(sock, down_for=31.0, error="connection refused", kind="unavailable"), 1
    )
    up = lifecycle_event(reachable(sock, down_for=42.0), 2)
    assert (await sink.deliver([down])).delivered
    assert (await sink.deliver([up])).delivered
    trigger, resolve = pagerduty.events
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"]
    assert NODE in trigger["dedup_key"] and "kubelet" in trigger["dedup_key"]
    assert trigger["payload"]["severity"] == "critical" and trigger["payload"]["component"] == "kubelet"
    assert not pagerduty.violations and not pagerduty.open


async def test_pagerduty_summary_is_cut_to_1024_characters(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    long = "x" * 5000
    event = make_event(Kind.DEVICE_REMOVED, Severity.CRITICAL, long, 1, resource=GPU, device="GPU-0")
    assert (await make_sink(pd_config(pagerduty)).deliver([event])).delivered
    assert not pagerduty.violations
    assert pagerduty.events[0]["payload"]["summary"] == long[:1024]


async def test_pagerduty_event_stays_under_512_kb_and_long_keys_under_255(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    sink = make_sink(pd_config(pagerduty))
    device = "D" * 400
    big = make_event(
        Kind.DEVICE_REMOVED, Severity.CRITICAL, "huge", 1, resource=GPU, device=device, blob="b" * 600_000
    )
    assert (await sink.deliver([big])).delivered
    assert (await sink.deliver([added(2, device)])).delivered
    trigger, resolve = pagerduty.events
    assert len(pagerduty.requests[0].body) <= 512 * 1024
    assert "truncated" in trigger["payload"]["custom_details"]["details"]
    assert len(trigger["dedup_key"]) <= 255 and resolve["dedup_key"] == trigger["dedup_key"]
    assert not pagerduty.violations and not pagerduty.open


async def test_pagerduty_through_the_dispatcher_resolutions_pass_below_min_severity(
    pagerduty: PagerDutyReceiver, make_sink: Any, store: Store, pd_env: None
) -> None:
    sink = make_sink(pd_config(pagerduty, rate=100.0))
    allocation = make_event(Kind.ALLOCATION_ADDED, Severity.INFO, "pod got a GPU", 2, resource=GPU)
    async with dispatching(store, [sink]) as run:
        await run.enqueue([removed(1), allocation, added(3)])
        await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1, 3])
    assert [e["event_action"] for e in pagerduty.events] == ["trigger", "resolve"]
    assert not pagerduty.violations and not pagerduty.open
    assert await store.kv_get("pagerduty:pager:open") == []


def dra_story() -> list[Event]:
    """A DRA device failing and healing in its pod's status, and another whose driver went quiet."""
    node = claim_inventory(
        {"ml/llm-0": ("trainer", "gpu-claim", [("node-1", "gpu-3", None), ("node-1", "gpu-4", None)])}
    )
    health, out = DeviceHealth(), []
    for now, three, four in (
        (-1.0, HEALTHY, HEALTHY),  # both drivers report health
        (0.0, UNHEALTHY, UNKNOWN),
        (400.0, UNHEALTHY, UNKNOWN),
        (500.0, HEALTHY, UNKNOWN),
    ):
        verdicts = [(f"{DRIVER}/node-1/gpu-3", three, "XID 79"), (f"{DRIVER}/node-1/gpu-4", four, "")]
        health, changes = health.observe(
            now, node, [verdict_pod("ml/llm-0", "trainer", verdicts)], unknown_grace=300
        )
        out += changes
    assert [c.kind for c in out] == [Kind.DEVICE_UNHEALTHY, Kind.DEVICE_HEALTH_UNKNOWN, Kind.DEVICE_HEALTHY]
    return [
        envelope(c, seq=i, node=NODE, cycle=f"c{i}", before=None, after=None) for i, c in enumerate(out, 1)
    ]


async def test_pagerduty_pages_a_dra_device_unhealthy_resolves_it_healthy_and_never_pages_unknown(
    pagerduty: PagerDutyReceiver, make_sink: Any, store: Store, pd_env: None
) -> None:
    sink = make_sink(pd_config(pagerduty, rate=100.0))
    async with dispatching(store, [sink]) as run:
        await run.enqueue(dra_story())
        await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1, 2, 3])
    trigger, resolve = pagerduty.events
    assert trigger["event_action"] == "trigger" and trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["component"] == DRIVER and "XID 79" in trigger["payload"]["summary"]
    assert trigger["dedup_key"].endswith(f"/device/{DRIVER}/node-1/gpu-3")
    assert resolve == {"routing_key": PD_KEY, "event_action": "resolve", "dedup_key": trigger["dedup_key"]}
    assert not pagerduty.violations and not pagerduty.open


async def test_alertmanager_fires_and_resolves_a_dra_device_and_slack_shows_all_three(
    hook: WebhookReceiver, slack: SlackReceiver, make_sink: Any
) -> None:
    unhealthy, unknown, healthy = dra_story()
    am = make_sink(sink_config("am", type="alertmanager", url=hook.url(""), **AT_ONCE))
    for event in (unhealthy, unknown, healthy):
        assert (await am.deliver([event])).delivered
    fired, ended = [a for req in hook.requests for a in json.loads(req.body)]  # the Unknown: none
    assert fired["labels"]["resource"] == DRIVER and fired["labels"]["device"] == "node-1/gpu-3"
    assert ended["labels"] == fired["labels"] and ended["endsAt"] >= ended["startsAt"]
    assert (await make_sink(slack_config(slack)).deliver([unhealthy, unknown, healthy])).delivered
    (message,) = slack.messages  # a person reads all three (Slack's rate: one message a second)
    shown = json.dumps(message)
    assert all(e.summary in shown for e in (unhealthy, unknown, healthy)), shown


# --- webhooks: JSON, CloudEvents, Standard Webhooks ---


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


# --- what an answer means (HttpClient.post / outcome_of) ---


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, "delivered"),
        (202, "delivered"),
        (204, "delivered"),
        (301, "permanent"),
        (400, "permanent"),
        (401, "permanent"),
        (404, "permanent"),
        (408, "retry"),
        (410, "gone"),
        (429, "retry"),
        (500, "retry"),
        (502, "retry"),
        (503, "retry"),
        (504, "retry"),
    ],
)
def test_outcome_of_status(status: int, expected: str) -> None:
    outcome = outcome_of(status, {"Retry-After": "7"}, "body")
    got = (
        "delivered"
        if outcome.delivered
        else "gone"
        if outcome.gone
        else "retry"
        if outcome.retry
        else "permanent"
    )
    assert got == expected
    assert outcome.retry_after == (7.0 if status in (429, 503) else None)


def test_parse_retry_after() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after("Thu, 02 Jan 2025 03:04:35 GMT", now) == 30.0
    assert parse_retry_after("Thu, 02 Jan 2025 03:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


@pytest.mark.parametrize(
    "value",
    [
        "²",  # str.isdigit() says yes, float() says no: this raised once, and dead-lettered the event
        "٣",  # an Arabic-Indic digit: not delta-seconds either
        "1e20",
        "-5",
        "+5",
        "1.5",
        "5 s",
        "garbage",
        "",
        "Fri, 31 Dec 99999 23:59:59 GMT",  # past datetime's range: ValueError inside the parser
        "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",  # OverflowError inside the parser
    ],
)
def test_retry_after_that_is_not_delta_seconds_or_a_date_is_ignored(value: str) -> None:
    assert parse_retry_after(value) is None
    outcome = outcome_of(429, {"Retry-After": value}, "slow down")
    assert outcome.retry and outcome.retry_after is None


def test_retry_after_huge_values_come_back_whole_for_the_worker_to_cap() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_retry_after("99999999999999999999999", now) == 1e23
    assert parse_retry_after("9" * 5000, now) == math.inf
    far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now)
    assert far is not None and far > 2.5e11


@given(st.text(max_size=80))
def test_parse_retry_after_never_raises(value: str) -> None:
    seconds = parse_retry_after(value)
    assert seconds is None or seconds >= 0


@given(st.text(st.characters(categories=["Nd", "No"], exclude_characters="0123456789"), min_size=1))
def test_only_ascii_digits_are_delta_seconds(value: str) -> None:
    assert parse_retry_after(value) is None


async def test_redirects_are_not_followed_and_are_permanent(hook: WebhookReceiver, make_sink: Any) -> None:
    hook.force(307, {"Location": hook.url("/elsewhere")})
    outcome = await make_sink(hook_config(hook)).deliver([removed(1)])
    assert not outcome.delivered and not outcome.retry and not outcome.gone and outcome.status == 307
    assert "redirect" in outcome.error
    assert [r.path for r in hook.requests] == ["/hook"]


async def test_a_receiver_that_never_answers_times_out_as_transient(
    hook: WebhookReceiver, make_sink: Any
) -> None:
    hook.force(200, hang=True)
    started = time.monotonic()
    outcome = await make_sink(hook_config(hook, timeout=0.3)).deliver([removed(1)])
    assert outcome.retry and not outcome.delivered and "0.3" in outcome.error, outcome
    assert time.monotonic() - started < 5


# --- the retry policy, end to end through the Dispatcher and the Outbox ---


def retrying_config(rx: WebhookReceiver) -> SinkSettings:
    return hook_config(rx, rate=1000.0, retry_max_delay=0.05, signing_secret="${HOOK_SIGNING_SECRET}")


async def test_retry_after_seconds_is_honoured(
    signed_hook: WebhookReceiver, make_sink: Any, store: Store, signing_env: None
) -> None:
    signed_hook.force(429, {"Retry-After": "2"}, "slow down")
    event = removed(1)
    with structlog.testing.capture_logs() as logs:
        async with dispatching(store, [make_sink(retrying_config(signed_hook))]) as run:
            await run.enqueue([event])
            await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1])
    first, retry = signed_hook.requests
    assert first.status == 429 and retry.accepted, retry.violations
    assert retry.at - first.at >= 1.9
    assert retry.headers["webhook-id"] == first.headers["webhook-id"] == event.id
    (warning,) = logged(logs, "delivery failed; will retry")
    assert warning["retry_after"] == 2.0 and warning["status"] == 429 and warning["delay_s"] >= 2.0


async def test_retry_after_http_date_is_honoured(
    signed_hook: WebhookReceiver, make_sink: Any, store: Store, signing_env: None
) -> None:
    not_before = math.floor(time.time()) + 3
    date = format_datetime(datetime.fromtimestamp(not_before, UTC), usegmt=True)
    signed_hook.force(429, {"Retry-After": date})
    async with dispatching(store, [make_sink(retrying_config(signed_hook))]) as run:
        await run.enqueue([removed(1)])
        await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1])
    first, retry = signed_hook.requests
    assert first.status == 429 and retry.accepted
    assert retry.wall >= not_before - 0.1, (retry.wall, not_before)
    assert retry.at - first.at >= 1.9


CAPPED_S = 0.5  # retry_after_max in the tests below; the normal backoff is at most 0.05 s


@pytest.mark.parametrize(
    ("retry_after", "capped"),
    [
        ("99999999999999999999999", True),
        ("9" * 5000, True),  # inf once parsed
        ("Fri, 31 Dec 9999 23:59:59 GMT", True),
        ("1e20", False),  # not delta-seconds (ASCII digits only): the normal backoff
        ("²", False),
        ("-5", False),
        ("Fri, 31 Dec 99999 23:59:59 GMT", False),
    ],
)
async def test_retry_after_is_capped_or_ignored_never_permanent(
    hook: WebhookReceiver, make_sink: Any, store: Store, retry_after: str, capped: bool
) -> None:
    # Through the real worker, outbox and HTTP client: the receiver answers 429 with the header
    # once, then 200. The event is retried, never dead-lettered, and never waits past the cap.
    hook.force(429, {"Retry-After": retry_after}, "slow down")
    cfg = hook_config(hook, rate=1000.0, retry_max_delay=0.05, retry_after_max=CAPPED_S)
    with structlog.testing.capture_logs() as logs:
        async with dispatching(store, [make_sink(cfg)]) as run:
            await run.enqueue([removed(1)])
            await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1])
    first, retry = hook.requests
    assert first.status == 429 and retry.accepted
    assert run.deliveries.seqs("dead_letter") == [] and await store.dead_letters() == []
    (warning,) = logged(logs, "delivery failed; will retry")
    gap = retry.at - first.at
    cut = logged(logs, "receiver asked to wait longer than retry_after_max")
    if capped:
        assert warning["retry_after"] == CAPPED_S and warning["delay_s"] == CAPPED_S
        assert CAPPED_S - 0.05 <= gap < CAPPED_S + 2.0
        (note,) = cut
        assert note["retry_after_max"] == CAPPED_S and note["log_level"] == "warning"
        assert float(note["retry_after_asked"]) > 1e10
    else:
        assert warning["retry_after"] is None and warning["delay_s"] <= 0.05
        assert gap < CAPPED_S - 0.1
        assert cut == []


def test_retry_after_max_defaults_to_the_backoff_cap_and_is_bounded() -> None:
    cfg = hook_config(WebhookReceiver())
    assert cfg.retry_after_max == cfg.retry_max_delay == 300.0
    with pytest.raises(
        ConfigError, match=r"sinks.hook.retry_after_max: out of range; expected between 0 and 86400"
    ):
        hook_config(WebhookReceiver(), retry_after_max=86401)


async def test_server_error_is_retried_in_seq_order_with_the_same_ids(
    signed_hook: WebhookReceiver, make_sink: Any, store: Store, signing_env: None
) -> None:
    signed_hook.force(500, body="rollup_error")
    events = [removed(1), added(2), removed(3, "GPU-1"), added(4, "GPU-1"), removed(5, "GPU-2")]
    with structlog.testing.capture_logs() as logs:
        async with dispatching(store, [make_sink(retrying_config(signed_hook))]) as run:
            await run.enqueue(events)
            await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [1, 2, 3, 4, 5])
    reqs = signed_hook.requests
    assert [r.status for r in reqs] == [500, 200, 200, 200, 200, 200]
    assert [r.parsed["seq"] for r in reqs] == [1, 1, 2, 3, 4, 5]
    assert not signed_hook.violations
    # The duplicate is the same event: same id in the body and the same webhook-id.
    assert reqs[0].parsed["id"] == reqs[1].parsed["id"] == events[0].id
    assert reqs[0].headers["webhook-id"] == reqs[1].headers["webhook-id"] == events[0].id
    assert [r.headers["webhook-id"] for r in reqs[1:]] == [e.id for e in events]
    (retried,) = logged(logs, "delivered after retrying")
    assert retried["attempts"] == 2
    assert (await store.stats("hook")).depth == 0


async def test_permanent_failure_is_dead_lettered_and_later_events_flow(
    signed_hook: WebhookReceiver, make_sink: Any, store: Store, signing_env: None
) -> None:
    signed_hook.force(400, body="invalid event")
    events = [removed(1), added(2), removed(3, "GPU-1")]
    with structlog.testing.capture_logs() as logs:
        async with dispatching(store, [make_sink(retrying_config(signed_hook))]) as run:
            await run.enqueue(events)
            await run.deliveries.wait_for(lambda d: d.seqs("delivered") == [2, 3])
    assert run.deliveries.seqs("dead_letter") == [1]
    assert [r.status for r in signed_hook.requests] == [400, 200, 200]
    (dead,) = await store.dead_letters()
    assert (dead.sink, dead.seq, dead.status) == ("hook", 1, 400)
    assert dead.event.id == events[0].id and "HTTP 400" in dead.error and "invalid event" in dead.error
    stats = await store.stats("hook")
    assert (stats.depth, stats.dead, stats.delivered) == (0, 1, 2)
    (error,) = logged(logs, "permanent failure")
    assert error["log_level"] == "error" and error["seqs"] == [1]


async def test_gone_disables_the_sink_loudly_and_nothing_more_is_sent(
    signed_hook: WebhookReceiver, make_sink: Any, store: Store, signing_env: None
) -> None:
    signed_hook.force(410, body="channel_is_archived")
    with structlog.testing.capture_logs() as logs:
        async with dispatching(store, [make_sink(retrying_config(signed_hook))]) as run:
            await run.enqueue([removed(1)])
            await run.deliveries.wait_for(lambda d: d.seqs("gone") == [1])
            assert run.worker("hook").disabled is not None and "410" in run.worker("hook").disabled
            # Later events are queued but, the sink being disabled, never sent (not even on stop).
            await run.enqueue([added(2), removed(3, "GPU-1")])
    assert len(signed_hook.requests) == 1
    stats = await store.stats("hook")
    assert stats.depth == 3 and stats.disabled is not None and "410" in stats.disabled
    (error,) = logged(logs, "receiver answered 410 Gone")
    assert error["log_level"] == "error" and error["sink"] == "hook" and error["status"] == 410
    assert "channel_is_archived" in error["error"]


# --- secrets ---


def no_piece_of(secret: str, text: str, size: int = 8) -> bool:
    return not any(secret[i : i + size] in text for i in range(len(secret) - size + 1))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_secrets_never_reach_repr_errors_or_logs(
    serve: Callable[[Receiver], Awaitable[Receiver]],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slack_token = "T0SECRET/B0SECRET/slacktokenvalue0123"
    hook_token = "hook-path-token-0123456789abcdef"
    pd_key = "fedcba9876543210fedcba9876543210"
    bearer = "bearer-secret-value-from-file-42"
    monkeypatch.setenv("SLACK_TOKEN", slack_token)
    monkeypatch.setenv("HOOK_TOKEN", hook_token)
    monkeypatch.setenv("HOOK_SIGNING_SECRET", SIGNING_SECRET)
    (tmp_path / "pd_key").write_text(pd_key + "\n")
    (tmp_path / "bearer").write_text(bearer + "\n")
    secrets = [slack_token, hook_token, pd_key, bearer, SIGNING_SECRET]

    slack_rx = await serve(SlackReceiver(rate=1000.0))
    pd_rx = await serve(PagerDutyReceiver())
    # Both echo what they were sent back in their error answers.
    slack_rx.force(500, body=f"rollup_error for /services/{slack_token}", times=1000)
    pd_rx.force(500, body=f"internal error for routing_key {pd_key}", times=1000)
    dead = closed_port()
    settings = parse_settings(
        {
            "sinks": {
                "slack": {
                    "type": "slack",
                    "url": slack_rx.url("/services/${SLACK_TOKEN}"),
                    "rate": 1000.0,
                    "retry_max_delay": 0.05,
                },
                "pager": {
                    "type": "pagerduty",
                    "routing_key_file": str(tmp_path / "pd_key"),
                    "endpoint": pd_rx.url("/v2/enqueue"),
                    "rate": 1000.0,
                    "retry_max_delay": 0.05,
                },
                "hook": {
                    "type": "webhook",
                    "url": f"http://127.0.0.1:{dead}/hooks/${{HOOK_TOKEN}}",
                    "bearer_token_file": str(tmp_path / "bearer"),
                    "signing_secret": "${HOOK_SIGNING_SECRET}",
                    "rate": 1000.0,
                    "retry_max_delay": 0.05,
                },
            }
        }
    )
    for secret in secrets:
        assert secret not in repr(settings)
        assert secret not in str(settings.sinks)

    sinks = [build_sink(cfg, node=NODE, state_dir=tmp_path, store=store) for cfg in settings.sinks]
    try:
        outcomes: list[Outcome] = [await sink.deliver([removed(1)]) for sink in sinks]
    finally:
        for sink in sinks:
            await sink.close()
    assert all(o.retry and not o.delivered for o in outcomes), outcomes
    slack_outcome, pd_outcome, hook_outcome = outcomes
    assert "HTTP 500" in slack_outcome.error and "***" in slack_outcome.error
    assert "HTTP 500" in pd_outcome.error and "***" in pd_outcome.error
    assert "Connect" in hook_outcome.error, hook_outcome.error
    for outcome in outcomes:
        for secret in secrets:
            assert secret not in outcome.error, outcome.error

    with structlog.testing.capture_logs() as logs:
        sinks = [build_sink(cfg, node=NODE, state_dir=tmp_path, store=store) for cfg in settings.sinks]
        async with dispatching(store, sinks) as run:
            await run.enqueue([removed(2)])
            await slack_rx.wait_for(3)
            await pd_rx.wait_for(3)
    failures = logged(logs, "delivery failed")
    assert {e["sink"] for e in failures} == {"slack", "pager", "hook"}, failures
    text = repr(logs)
    for secret in secrets:
        assert secret not in text
    assert "***" in text


async def test_an_error_body_cut_mid_secret_leaks_no_part_of_it(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    """The error text keeps 200 characters of the answer: cutting it must not leave a piece
    of an echoed secret that redaction no longer recognises."""
    pagerduty.force(500, body="x" * 180 + PD_KEY)  # the first 200 characters end mid-key
    outcome = await make_sink(pd_config(pagerduty)).deliver([removed(1)])
    assert outcome.retry
    assert no_piece_of(PD_KEY, outcome.error), outcome.error


def test_credentials_nobody_registered_are_scrubbed_from_any_text() -> None:
    """A library's error may quote a URL or a header we never registered: credentials in it
    are scrubbed by their shape. And a plain URL setting's password alone is a known secret."""
    text = (
        "redirected to https://bob:Hunter2-unknown@127.0.0.1:8443/cb?code=OneTimeCode-xyz#top; "
        'sent {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="}; Authorization: Token UnknownTok-123; '
        "got Bearer UnknownBearer-0987 back"
    )
    scrubbed = redact(text)
    for secret in (
        "Hunter2-unknown",
        "OneTimeCode-xyz",
        "dXNlcjpwYXNzd29yZA",
        "UnknownTok-123",
        "UnknownBearer",
    ):
        assert secret not in scrubbed, scrubbed
    assert "https://***@127.0.0.1:8443/cb?***#top" in scrubbed
    assert "bearer tokens and basic checks" in redact("bearer tokens and basic checks")  # words stay

    sink_config("am", type="alertmanager", url="http://am:AmOnlyPassword-42@127.0.0.1:9093")
    assert (
        redact("the receiver said: bad password AmOnlyPassword-42") == "the receiver said: bad password ***"
    )

    # A credential header's value written in the file is a secret; other headers' values are not
    # (a node named after the cluster must stay readable in the logs).
    headers = {"X-Api-Key": "LiteralApiKey-5a5b5c", "X-Cluster": "prod-eu-cluster-9"}
    sink_config("hook", type="webhook", url="http://127.0.0.1:9/", headers=headers)
    assert redact("key LiteralApiKey-5a5b5c refused") == "key *** refused"
    assert redact("node gpu-prod-eu-cluster-9-17") == "node gpu-prod-eu-cluster-9-17"

    # The same for a plain URL's query: a credential parameter's value is a secret, others not.
    sink_config(
        "am2", type="alertmanager", url="http://127.0.0.1:9093/?tenant=production-eu&token=QueryTok-77aa"
    )
    assert redact("token QueryTok-77aa refused") == "token *** refused"
    assert redact("node gpu-production-eu-7") == "node gpu-production-eu-7"

    # A secret URL's token may be quoted without the rest of its path, or without the slash.
    sink_config("slack", type="slack", url="https://127.0.0.1:9/services/T0/B0/PathTokenOnly-0123456789")
    assert redact("no route for services/T0/B0/PathTokenOnly-0123456789") == "no route for ***"
    assert redact("token PathTokenOnly-0123456789 revoked") == "token *** revoked"
    assert redact("the services are up") == "the services are up"


@pytest.mark.parametrize("query", [False, True], ids=["path", "path-and-query"])
async def test_a_receiver_echoing_only_the_request_path_gets_no_token_into_errors_or_logs(
    serve: Callable[[Receiver], Awaitable[Receiver]],
    store: Store,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    query: bool,
) -> None:
    """The whole URL is a known secret, but a receiver that echoes only the path it was called
    on (or path and query) sends back a piece of it: that piece must be redacted too."""
    path_token = "PathToken-3f9a1c7e5b2d4680"
    query_token = "QueryToken-8e6c4a2f0d1b3957"
    rx = await serve(PathEchoReceiver(query=query))
    url = rx.url(f"/hooks/{path_token}?key={query_token}")  # inline: no ${ENV} registers the parts
    hook = sink_config("hook", type="webhook", url=url, rate=1000.0)
    sink = build_sink(hook, node=NODE, state_dir=tmp_path, store=store)
    try:
        outcome = await sink.deliver([removed(1)])
        assert rx.requests[-1].path == f"/hooks/{path_token}?key={query_token}"  # it was called there
        expected = "HTTP 404: no route for POST ***" + ("?***" if query else "")
        assert outcome.status == 404 and outcome.error == expected
        with structlog.testing.capture_logs() as logs:
            async with dispatching(store, [sink]) as run:
                await run.enqueue([removed(2)])
                await run.deliveries.wait_for(lambda d: d.seqs("dead_letter") == [2])
    finally:
        await sink.close()
    (failure,) = logged(logs, "permanent failure")
    assert failure["error"] == expected
    (dead,) = await store.dead_letters("hook")
    assert dead.error == expected
    assert main(["outbox", "list", "--state-dir", str(tmp_path)]) == 0
    listed = capfd.readouterr().out
    assert expected.removeprefix("HTTP 404: ") in listed
    for token in (path_token, query_token):
        for text in (outcome.error, repr(logs), dead.error, listed):
            assert no_piece_of(token, text), text


# --- the receivers enforce their rules (so that the tests above mean something) ---


async def test_receivers_refuse_what_the_services_refuse(
    serve: Callable[[Receiver], Awaitable[Receiver]],
) -> None:
    slack_rx = await serve(SlackReceiver(rate=1.0))
    pd_rx = await serve(PagerDutyReceiver())
    hook_rx = await serve(WebhookReceiver(secret=SIGNING_SECRET, cloudevents=True))
    header = {"type": "header", "text": {"type": "plain_text", "text": "h"}}
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "s"}}
    trigger = {
        "routing_key": PD_KEY,
        "event_action": "trigger",
        "dedup_key": "k1",
        "payload": {"summary": "s", "source": NODE, "severity": "critical"},
    }
    async with aiohttp.ClientSession() as http:

        async def post(rx: Receiver, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers = headers or {"Content-Type": "application/json"}
            async with http.post(rx.url("/"), data=data, headers=headers) as resp:
                return resp.status, await resp.text()

        assert await post(slack_rx, {"blocks": [section]}) == (400, "invalid_payload")
        assert await post(slack_rx, {"text": "t", "blocks": [section] * 51}) == (400, "invalid_blocks")
        long_header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}
        assert await post(slack_rx, {"text": "t", "blocks": [long_header]}) == (400, "invalid_blocks")
        long_section = {"type": "section", "text": {"type": "mrkdwn", "text": "s" * 3001}}
        assert await post(slack_rx, {"text": "t", "blocks": [long_section]}) == (400, "invalid_blocks")
        many = {"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}
        assert await post(slack_rx, {"text": "t", "blocks": [many]}) == (400, "invalid_blocks")
        too_much = [{"type": "section", "text": {"type": "mrkdwn", "text": "s" * 2900}}] * 5
        assert await post(slack_rx, {"text": "t", "blocks": too_much}) == (400, "invalid_blocks")
        assert await post(slack_rx, {"text": "t", "blocks": [header, section]}) == (200, "ok")
        assert (await post(slack_rx, {"text": "t", "blocks": [header, section]}))[0] == 429
        assert slack_rx.requests[-1].reason == "rate_limited"

        assert (await post(pd_rx, {**trigger, "routing_key": "short"}))[0] == 400
        assert (await post(pd_rx, {**trigger, "payload": {"summary": "s", "severity": "critical"}}))[0] == 400
        assert (await post(pd_rx, {**trigger, "payload": {**trigger["payload"], "summary": "s" * 1025}}))[
            0
        ] == 400
        assert (await post(pd_rx, {**trigger, "payload": {**trigger["payload"], "severity": "high"}}))[
            0
        ] == 400
        assert (await post(pd_rx, {**trigger, "dedup_key": "k" * 256}))[0] == 400
        assert (await post(pd_rx, trigger))[0] == 202
        resolve = {"routing_key": PD_KEY, "event_action": "resolve", "dedup_key": "never-triggered"}
        assert (await post(pd_rx, resolve))[0] == 202
        assert pd_rx.requests[-1].violations and not pd_rx.requests[-1].accepted
        assert (await post(pd_rx, {**resolve, "dedup_key": "k1"}))[0] == 202
        assert pd_rx.requests[-1].accepted and not pd_rx.open

        ce = {"specversion": "1.0", "id": "1", "source": "/s", "type": "t"}
        ce_headers = {"Content-Type": "application/cloudevents+json"}
        assert (await post(hook_rx, json.dumps(ce).encode(), ce_headers))[0] == 401
        body = json.dumps({**ce, "id": ""}).encode()
        ts = int(time.time())
        signature = Webhook(SIGNING_SECRET).sign("m1", datetime.fromtimestamp(ts, UTC), body.decode())
        signed = {
            **ce_headers,
            "webhook-id": "m1",
            "webhook-timestamp": str(ts),
            "webhook-signature": signature,
        }
        assert (await post(hook_rx, body, signed))[0] == 400
        assert (await post(hook_rx, body, {**signed, "webhook-id": "m2"}))[0] == 401


def test_slack_fallback_is_cut_before_it_is_escaped() -> None:
    """A long text of `&`s: cut after escaping, it would end in half an entity ("&am")."""
    event = envelope(
        Change(Kind.DEVICE_ADDED, Severity.INFO, "&" * 2000, {"resource": GPU, "device": "d", "numa": []}),
        seq=1,
        node=NODE,
        cycle="c",
        before=None,
        after=None,
    )
    msg = slack_message([event, event, event], NODE)
    text = msg["text"]
    assert len(text) <= 3000
    assert text.endswith("…") and re.sub(r"&amp;", "", text).count("&") == 0


# --- paging that is prompt and finite ---


async def test_a_page_is_not_delayed_by_events_the_paging_sink_does_not_send(
    pagerduty: PagerDutyReceiver, make_sink: Any, store: Store, pd_env: None
) -> None:
    """40 devices hot-plugged (ends of conditions PagerDuty never opened: nothing to send) must
    not spend its 2/s rate: the GPU failure right after them is paged at once."""
    sink = make_sink(pd_config(pagerduty, rate=2.0))
    plugged = [added(seq, f"GPU-new-{seq}") for seq in range(1, 41)]
    async with dispatching(store, [sink]) as run:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await run.enqueue([*plugged, removed(41, "GPU-3")])
        await run.deliveries.wait_for(lambda d: 41 in d.seqs("delivered"))
        assert loop.time() - started < 1.5
    assert [e["event_action"] for e in pagerduty.events] == ["trigger"]


async def test_a_resolve_refused_for_good_ends_the_condition_locally(
    pagerduty: PagerDutyReceiver, make_sink: Any, store: Store, pd_env: None
) -> None:
    sink = make_sink(pd_config(pagerduty))
    assert (await sink.deliver([removed(1, "GPU-3")])).delivered
    assert await store.kv_get("pagerduty:pager:open")
    pagerduty.force(400, body="invalid")
    outcome = await sink.deliver([added(2, "GPU-3")])
    assert not outcome.delivered and not outcome.retry
    assert await store.kv_get("pagerduty:pager:open") == []  # never re-fired, never left open


async def test_alertmanager_resolve_refused_for_good_is_not_resent_forever(
    hook: WebhookReceiver, make_sink: Any, store: Store
) -> None:
    sink = make_sink(sink_config("am", type="alertmanager", url=hook.url(""), **AT_ONCE))
    assert (await sink.deliver([removed(1, "GPU-3")])).delivered
    assert len(await store.kv_get("alertmanager:am:active")) == 1
    hook.force(400, body="start time must be before end time")
    outcome = await sink.deliver([added(2, "GPU-3")])
    assert not outcome.delivered and not outcome.retry
    assert await store.kv_get("alertmanager:am:active") == {}  # the resender has nothing to re-send


async def test_alertmanager_ends_at_is_never_before_starts_at(
    hook: WebhookReceiver, make_sink: Any, store: Store
) -> None:
    """After a clock step back, the wall clock reads earlier than an alert's start."""
    sink = make_sink(sink_config("am", type="alertmanager", url=hook.url(""), **AT_ONCE))
    future = "2099-01-01T00:00:00.000Z"
    assert (await sink.deliver([dataclasses.replace(removed(1, "GPU-3"), time=future)])).delivered
    assert (await sink.deliver([added(2, "GPU-3")])).delivered
    alerts = [a for req in hook.requests for a in json.loads(req.body)]
    assert len(alerts) == 2
    for alert in alerts:
        assert alert["startsAt"] == future and alert["endsAt"] >= alert["startsAt"]


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


# --- who is hit: the owner first ---

OWNED = PodMeta(
    "uid-t0", "default", "trainer-0", owner=Owner("Job", "trainer", "uid-job"), labels=(("team", "research"),)
)
BARE_POD = PodMeta("uid-t0", "default", "trainer-0")  # known to the Pods API, owned by nothing
OWNER_TEXT = "Job default/trainer (team research)"


def annotated(event: Event, pod: PodMeta) -> Event:
    """`event` as the agent sends it when the Pods API knows its pod."""
    (change,) = annotate([Change(event.kind, event.severity, event.summary, event.details)], PodIndex([pod]))
    return dataclasses.replace(event, details=change.details)


async def test_slack_names_the_owner_first(slack: SlackReceiver, make_sink: Any) -> None:
    event = annotated(removed(1), OWNED)
    assert (await make_sink(slack_config(slack)).deliver([event])).delivered
    assert not slack.violations, slack.violations
    (msg,) = slack.messages
    (section,) = texts_of(msg, "section")
    assert section.splitlines()[1] == f"• {OWNER_TEXT}: {slack_escaped(event.summary)}"
    (header,) = texts_of(msg, "header")
    assert header.startswith(f"{NODE}: 1 change — {OWNER_TEXT}: ")
    assert msg["text"] == slack_escaped(f"{NODE}: 1 change(s); {OWNER_TEXT}: {event.summary}")


def test_slack_without_an_owner_is_byte_identical() -> None:
    plain = [removed(1), added(2), *mixed_cycle(30, start=3)]
    bare = [annotated(plain[0], BARE_POD), *plain[1:]]
    assert "pods" in bare[0].details  # annotated, but nothing owns the pod
    assert json.dumps(slack_message(bare, NODE)) == json.dumps(slack_message(plain, NODE))


async def test_pagerduty_names_the_owner_first(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    event = annotated(removed(1), OWNED)
    assert (await make_sink(pd_config(pagerduty)).deliver([event])).delivered
    assert not pagerduty.violations, pagerduty.violations
    (trigger,) = pagerduty.events
    assert trigger["payload"]["summary"] == f"{OWNER_TEXT}: {event.summary}"
    custom = trigger["payload"]["custom_details"]
    assert custom["owner"] == OWNER_TEXT
    assert custom["details"]["pods"][0]["uid"] == "uid-t0"


async def test_pagerduty_owner_first_keeps_the_1024_character_cap(
    pagerduty: PagerDutyReceiver, make_sink: Any, pd_env: None
) -> None:
    long = "x" * 5000
    plain = make_event(
        Kind.DEVICE_REMOVED, Severity.CRITICAL, long, 1, resource=GPU, device="GPU-0", allocated_to=[POD]
    )
    assert (await make_sink(pd_config(pagerduty)).deliver([annotated(plain, OWNED)])).delivered
    assert not pagerduty.violations, pagerduty.violations
    summary = pagerduty.events[0]["payload"]["summary"]
    assert len(summary) == 1024 and summary == f"{OWNER_TEXT}: {long}"[:1024]


def test_pagerduty_without_an_owner_says_what_it_said() -> None:
    plain = removed(1)
    bare = annotated(plain, BARE_POD)
    before = pagerduty_event(plain, PD_KEY, active_keys=set())
    after = pagerduty_event(bare, PD_KEY, active_keys=set())
    assert before is not None and after is not None
    assert before["payload"]["summary"] == after["payload"]["summary"] == plain.summary
    assert "owner" not in before["payload"]["custom_details"]
    # Only the structured details grew (the pod's uid); every text is as it was.
    after["payload"]["custom_details"]["details"].pop("pods")
    assert json.dumps(after) == json.dumps(before)
