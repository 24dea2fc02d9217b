"""The Slack sink against a receiver that enforces Slack's rules (testkit/receivers.py): one message
per re-query within Slack's limits and rate, mrkdwn escaped, invisible characters shown, the owner
first."""

from __future__ import annotations

import json
import re
from typing import Any

from testkit.dispatching import dispatching
from testkit.hostile_text import INVISIBLE, LOOK_ALIKE, OVERDRAWN, hidden_in
from testkit.http_sinks import (
    BARE_POD,
    GPU,
    NODE,
    OWNED,
    OWNER_TEXT,
    added,
    annotated,
    mixed_cycle,
    pd_config,
    removed,
    slack_config,
)
from testkit.receivers import PagerDutyReceiver, SlackReceiver
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.sinks.slack import slack_message
from watcher.store.store import Store


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


# --- what people read: escaped, and nothing hidden ---


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


# --- who is hit: the owner first ---


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
