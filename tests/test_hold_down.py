"""The hold-down before a condition's end (watcher/model/hold_down.py), and what the sinks make of
it against receivers that enforce their service's rules: a held end survives a restart of the sink
on the same outbox, one from another boot waits a whole hold-down again, and Slack never withholds
the failure of another device (or of the same one after its recovery was said)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from testkit.dispatching import open_outbox
from testkit.receivers import PagerDutyReceiver, SlackReceiver
from testkit.waiting import wait_until
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.model.hold_down import HeldEnds, Step, decide
from watcher.settings_file import parse_settings
from watcher.sinks.base import Sink
from watcher.sinks.hold_down import HeldStore
from watcher.sinks.registry import build_sink
from watcher.store.store import Store

GPU = "nvidia.com/gpu"
PD_KEY = "0123456789abcdef0123456789abcdef"


def _event(kind: Kind, seq: int, device: str = "GPU-0") -> Event:
    severity = Severity.CRITICAL if kind is Kind.DEVICE_REMOVED else Severity.INFO
    change = Change(kind, severity, f"{GPU} {device} {kind}", {"resource": GPU, "device": device})
    return envelope(change, seq=seq, node="node-a", cycle=f"c{seq}", before=None, after=None)


def test_a_start_opens_an_end_is_held_and_a_start_again_is_the_same_incident() -> None:
    assert decide(True, is_open=False, hold_down=60) is Step.OPEN
    assert decide(True, is_open=True, hold_down=60) is Step.UPDATE
    assert decide(False, is_open=True, hold_down=60) is Step.HOLD
    assert decide(False, is_open=True, hold_down=0) is Step.END
    assert decide(False, is_open=False, hold_down=60) is Step.PASS


def test_a_held_end_keeps_its_due_time_is_due_once_and_survives_json() -> None:
    held = HeldEnds().hold("k", now=100.0, boot="b1", hold_down=60, payload={"seq": 3})
    # Delivered again (a crash before the ack): the resolve is not pushed further away.
    assert held.hold("k", now=130.0, boot="b1", hold_down=60, payload={}) == held
    assert held.due(159.9) == [] and held.next_due() == 160.0
    ((key, end),) = held.due(160.0)
    assert key == "k" and end.payload == {"seq": 3}
    assert HeldEnds.from_json(json.loads(json.dumps(held.to_json()))) == held
    assert held.cancel("k").due(1e9) == [] and held.cancel("k").next_due() is None


def test_an_end_held_in_another_boot_waits_one_hold_down_from_now() -> None:
    held = HeldEnds().hold("k", now=5000.0, boot="old", hold_down=60, payload={})
    # After a reboot the boot clock reads 12 s: the old reading (5060) would wait over an hour.
    again = held.rebased(now=12.0, boot="new", hold_down=60)
    assert again.next_due() == 72.0 and again.due(71.9) == [] and [k for k, _ in again.due(72.0)] == ["k"]
    assert again.rebased(now=50.0, boot="new", hold_down=60) == again  # this boot's: unchanged


async def _nothing_held(held: HeldStore) -> bool:
    return not (await held.load()).held


@asynccontextmanager
async def _sink(store: Store, table: dict[str, Any]) -> AsyncIterator[Sink]:
    (cfg,) = parse_settings({"sinks": {"s": table}}).sinks
    sink = build_sink(cfg, node="node-a", state_dir=Path("/nonexistent"), store=store)
    background = sink.background()
    assert background is not None
    timer = asyncio.ensure_future(background())
    try:
        yield sink
    finally:
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        await sink.close()


async def test_pagerduty_held_resolve_is_sent_once_by_the_next_sink_on_the_same_outbox(
    tmp_path: Path,
) -> None:
    async with PagerDutyReceiver() as pd, open_outbox(tmp_path / "outbox.db") as store:
        table = {"type": "pagerduty", "routing_key": PD_KEY, "endpoint": pd.url("/v2/enqueue"), "rate": 100.0}
        async with _sink(store, {**table, "resolve_hold_down": 0.5}) as sink:
            assert (await sink.deliver([_event(Kind.DEVICE_REMOVED, 1)])).delivered
            assert (await sink.deliver([_event(Kind.DEVICE_ADDED, 2)])).delivered
            assert [e["event_action"] for e in pd.events] == ["trigger"]  # the resolve is held
        async with _sink(store, {**table, "resolve_hold_down": 0.5}) as sink:  # restarted before it was due
            await pd.wait_for(2, timeout=5)
            held = sink.held  # type: ignore[attr-defined]
            # Told, so dropped: no later start of the sink sends it again.
            await wait_until(lambda: _nothing_held(held), timeout=5)
        assert [e["event_action"] for e in pd.events] == ["trigger", "resolve"] and pd.violations == []


async def test_slack_withholds_a_recovery_and_a_flip_back_but_never_another_failure(tmp_path: Path) -> None:
    async with SlackReceiver(rate=1000.0) as slack, open_outbox(tmp_path / "outbox.db") as store:
        table = {
            "type": "slack",
            "url": slack.url("/services/T0/B0/X"),
            "rate": 100.0,
            "resolve_hold_down": 30,
        }
        async with _sink(store, table) as sink:
            said = lambda: [json.dumps(m) for m in slack.messages]  # noqa: E731
            for event in (_event(Kind.DEVICE_REMOVED, 1), _event(Kind.DEVICE_ADDED, 2)):
                assert (await sink.deliver([event])).delivered
            assert len(said()) == 1 and "GPU-0" in said()[0]  # the recovery waits
            assert (await sink.deliver([_event(Kind.DEVICE_REMOVED, 3, "GPU-1")])).delivered
            assert len(said()) == 2 and "GPU-1" in said()[1]  # another device: at once
            assert (await sink.deliver([_event(Kind.DEVICE_REMOVED, 4)])).delivered
            assert len(said()) == 2  # GPU-0 failing again within its hold-down: nothing new
        zero = {**table, "resolve_hold_down": 0}
        async with _sink(store, zero) as sink:
            assert (await sink.deliver([_event(Kind.DEVICE_ADDED, 5)])).delivered  # said at once now
            assert (await sink.deliver([_event(Kind.DEVICE_REMOVED, 6)])).delivered  # a new failure
            assert len(said()) == 4 and "GPU-0" in said()[3] and slack.violations == []


async def test_send_test_resolves_its_test_page_at_once_whatever_the_hold_down(tmp_path: Path) -> None:
    from watcher.cli import main

    async with PagerDutyReceiver() as pd:
        config = tmp_path / "config.toml"
        config.write_text(
            f'node = "node-a"\nstate_dir = "{tmp_path / "state"}"\n'
            f'[sinks.pager]\ntype = "pagerduty"\nrouting_key = "{PD_KEY}"\n'
            f'endpoint = "{pd.url("/v2/enqueue")}"\nresolve_hold_down = 600\n'
        )
        # The command runs its own event loop: in a thread, while this one serves the receiver.
        assert await asyncio.to_thread(main, ["send-test", "pager", "--config", str(config)]) == 0
        assert [e["event_action"] for e in pd.events] == ["trigger", "resolve"] and not pd.open
