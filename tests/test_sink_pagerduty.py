"""The PagerDuty sink against a receiver that enforces the Events API v2's rules (testkit/receivers.py):
a failure triggers and its end resolves with the same key, within PagerDuty's limits; DRA devices;
paging that is prompt and finite; the owner first."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from testkit.dispatching import dispatching
from testkit.http_sinks import (
    BARE_POD,
    GPU,
    NODE,
    OWNED,
    OWNER_TEXT,
    PD_KEY,
    POD,
    added,
    annotated,
    dra_story,
    lifecycle_event,
    make_event,
    pd_config,
    removed,
)
from testkit.inventories import DRIVER
from testkit.receivers import PagerDutyReceiver
from watcher.model.changes import Kind, Severity
from watcher.model.lifecycle import reachable, unreachable
from watcher.sinks.pagerduty import pagerduty_event
from watcher.store.store import Store


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


# --- who is hit: the owner first ---


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
