"""The Alertmanager sink against a recording receiver (Alertmanager's POST /api/v2/alerts): a DRA
device fired and resolved, a resolve refused for good not re-sent forever, endsAt never before
startsAt. A real Alertmanager: tests/test_delivery.py."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from testkit.http_sinks import AT_ONCE, added, dra_story, removed, sink_config, slack_config
from testkit.inventories import DRIVER
from testkit.receivers import SlackReceiver, WebhookReceiver
from watcher.store.store import Store


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
