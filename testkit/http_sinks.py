"""What the HTTP sinks' tests share (tests/test_sink_slack.py, test_sink_pagerduty.py,
test_sink_webhook.py, test_sink_alertmanager.py, test_sink_http.py): events as the agent makes them,
each sink's settings pointed at its receiver (testkit.receivers), a DRA device's story, and a pod
with an owner for the texts people read. The fixtures that start the receivers and build the sinks
(`serve`, `make_sink`, `slack`, `pagerduty`, `hook`, ...) are tests/conftest.py's."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from testkit.inventories import DRIVER, claim_inventory, verdict_pod
from testkit.receivers import PagerDutyReceiver, SlackReceiver, WebhookReceiver
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.affected import annotate
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, UNKNOWN, Owner, PodIndex, PodMeta
from watcher.model.devicehealth.verdicts import DeviceHealth
from watcher.model.events import Event, envelope
from watcher.settings_file import parse_settings
from watcher.sinks.base import BaseSinkSettings as SinkSettings

__all__ = [
    "AT_ONCE",
    "BARE_POD",
    "GPU",
    "NODE",
    "OWNED",
    "OWNER_TEXT",
    "PD_KEY",
    "POD",
    "SIGNING_SECRET",
    "added",
    "annotated",
    "dra_story",
    "hook_config",
    "lifecycle_event",
    "logged",
    "make_event",
    "mixed_cycle",
    "pd_config",
    "pd_table",
    "removed",
    "sink_config",
    "slack_config",
]

NODE = "node-a"
GPU = "nvidia.com/gpu"
POD = "default/trainer-0/main"
PD_KEY = "0123456789abcdef0123456789abcdef"
SIGNING_SECRET = "whsec_" + base64.b64encode(b"signing-key-for-tests-0123456789").decode()


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


# --- who is hit: a pod the Pods API knows, with an owner or without ---

OWNED = PodMeta(
    "uid-t0", "default", "trainer-0", owner=Owner("Job", "trainer", "uid-job"), labels=(("team", "research"),)
)
BARE_POD = PodMeta("uid-t0", "default", "trainer-0")  # known to the Pods API, owned by nothing
OWNER_TEXT = "Job default/trainer (team research)"


def annotated(event: Event, pod: PodMeta) -> Event:
    """`event` as the agent sends it when the Pods API knows its pod."""
    (change,) = annotate([Change(event.kind, event.severity, event.summary, event.details)], PodIndex([pod]))
    return dataclasses.replace(event, details=change.details)


# --- each sink's settings, pointed at its receiver ---


def sink_config(name: str, **table: Any) -> SinkSettings:
    (cfg,) = parse_settings({"sinks": {name: table}}).sinks
    return cfg


# These tests look at each service's rules, so ends go out at once; the hold-down before them
# (resolve_hold_down) has its own tests (tests/test_flap_pages.py).
AT_ONCE = {"resolve_hold_down": 0}


def slack_config(rx: SlackReceiver, **extra: Any) -> SinkSettings:
    table = {**AT_ONCE, **extra}
    return sink_config("slack", type="slack", url=rx.url("/services/T000/B000/XXXXXXXX"), **table)


def pd_config(rx: PagerDutyReceiver, **extra: Any) -> SinkSettings:
    """The routing key from ${PD_ROUTING_KEY}: the `pd_env` fixture sets it to PD_KEY."""
    table = {**AT_ONCE, **extra}
    return sink_config(
        "pager", type="pagerduty", routing_key="${PD_ROUTING_KEY}", endpoint=rx.url("/v2/enqueue"), **table
    )


def pd_table(rx: PagerDutyReceiver, **extra: Any) -> dict[str, Any]:
    """The `[sinks.pager]` table paging `rx` with PD_KEY itself (no environment to set), for a
    whole config (testkit.agent.with_config); ends at once unless `extra` says otherwise."""
    return {"type": "pagerduty", "routing_key": PD_KEY, "endpoint": rx.url("/v2/enqueue"), **AT_ONCE, **extra}


def hook_config(rx: WebhookReceiver, **extra: Any) -> SinkSettings:
    return sink_config("hook", type="webhook", url=rx.url("/hook"), **extra)


def logged(entries: Iterable[Mapping[str, Any]], event: str) -> list[Mapping[str, Any]]:
    """The captured log entries whose event starts with `event`."""
    return [e for e in entries if e.get("event", "").startswith(event)]
