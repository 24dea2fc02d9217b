"""What the HTTP sinks share (watcher/sinks/http.py), against real receivers that enforce each
service's rules (testkit/receivers.py): what an answer means, the one retry policy end to end
through the Dispatcher and a real Outbox, and secrets that never leak. Each sink's own tests:
tests/test_sink_slack.py, test_sink_pagerduty.py, test_sink_webhook.py, test_sink_alertmanager.py."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from testkit.dispatching import dispatching
from testkit.http_sinks import (
    NODE,
    PD_KEY,
    SIGNING_SECRET,
    added,
    hook_config,
    logged,
    pd_config,
    removed,
    sink_config,
)
from testkit.ports import free_port
from testkit.receiver import Receiver
from testkit.receivers import PagerDutyReceiver, PathEchoReceiver, SlackReceiver, WebhookReceiver
from watcher.cli import main
from watcher.config import ConfigError
from watcher.secrets import redact
from watcher.settings_file import parse_settings
from watcher.sinks.base import BaseSinkSettings as SinkSettings
from watcher.sinks.base import Outcome
from watcher.sinks.http import outcome_of, parse_retry_after
from watcher.sinks.registry import build_sink
from watcher.store.store import Store

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
    dead = free_port()  # nobody listens there
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


# --- the receivers enforce their rules (so that the tests in tests/test_sink_*.py mean something) ---


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
