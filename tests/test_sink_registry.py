"""The sink registry: one `register` call makes a sink type loadable, checked, built and routed."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from watcher.cli import main
from watcher.config import ConfigError, field_meta
from watcher.delivery.dispatcher import Dispatcher
from watcher.model.events import Event
from watcher.secrets import Secret
from watcher.settings_file import load_settings, parse_settings
from watcher.sim.send_test import MemoryStore, synthetic_events
from watcher.sinks import registry
from watcher.sinks.base import BaseSinkSettings, Capabilities, Outcome, SinkContext
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.registry import SINK_SETTINGS, SinkType
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.store.store import Store

BUILT_IN = ["stdout", "file", "slack", "pagerduty", "webhook", "alertmanager", "kubernetes", "nats"]


@dataclass(frozen=True)
class ToySinkSettings(BaseSinkSettings):
    token: Secret | None = field(default=None, metadata=field_meta("The toy's token (secret).", secret=True))
    loud: bool = field(default=False, metadata=field_meta("Shout."))
    volume: int = field(default=1, metadata=field_meta("How loud.", min=0, max=11))
    type: Literal["toy"] = "toy"


class ToySink:
    """Keeps what it is given, and what it was built with."""

    def __init__(self, settings: ToySinkSettings, context: SinkContext) -> None:
        self.name = settings.name
        self.settings = settings
        self.context = context
        self.received: list[Event] = []

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        self.received.extend(events)
        return Outcome.ok()

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        return None


def _check_toy(path: str, settings: ToySinkSettings) -> None:
    if settings.loud and settings.volume < 5:
        raise ConfigError(f"{path}.volume: a loud toy needs a volume of at least 5")


def _toy_type(*, pages: bool = False, name: str = "toy") -> SinkType[ToySinkSettings]:
    return SinkType(
        name=name,
        settings=ToySinkSettings,
        factory=ToySink,
        required_secrets=("token",),
        validate=_check_toy,
        capabilities=Capabilities(pages=pages),
    )


@pytest.fixture(params=[False, True], ids=["plain", "paging"])
def toy(request: pytest.FixtureRequest) -> Iterator[SinkType[ToySinkSettings]]:
    sink_type = registry.register(_toy_type(pages=request.param))
    try:
        yield sink_type
    finally:
        registry.unregister("toy")


def test_the_built_in_types_are_found_without_a_list(toy: SinkType[ToySinkSettings]) -> None:
    # In the order the unknown-type error has always listed them; a new type comes after.
    assert [t.name for t in registry.sink_types()] == [*BUILT_IN, "toy"]
    assert list(SINK_SETTINGS) == [*BUILT_IN, "toy"]
    assert SINK_SETTINGS["file"] is FileSinkSettings
    assert registry.sink_type_of(StdoutSinkSettings()).name == "stdout"
    paging = {t.name for t in registry.sink_types() if t.capabilities.pages}
    toy_pages = {"toy"} if toy.capabilities.pages else set()
    assert paging == {"pagerduty", "alertmanager", "kubernetes"} | toy_pages


def test_a_toy_type_is_gone_after_its_test() -> None:
    assert [t.name for t in registry.sink_types()] == BUILT_IN
    assert registry.find("toy") is None
    with pytest.raises(
        ConfigError, match=r"^sinks\.t\.type: not a known sink type; expected one of 'stdout',"
    ):
        parse_settings({"sinks": {"t": {"type": "toy"}}})


def test_a_second_registration_is_refused(toy: SinkType[ToySinkSettings]) -> None:
    with pytest.raises(
        ValueError, match=r"^cannot register sink type 'toy': a sink type of that name is already registered$"
    ):
        registry.register(_toy_type())
    with pytest.raises(
        ValueError,
        match=r"^cannot register sink type 'file': a sink type of that name is already registered$",
    ):
        registry.register(
            SinkType(
                name="file", settings=FileSinkSettings, factory=lambda s, c: ToySink(ToySinkSettings(), c)
            )
        )
    assert registry.find("toy") is toy


def test_a_type_whose_settings_do_not_name_it_is_refused() -> None:
    # The settings' `type` names the sink type, so no settings class can serve two types.
    with pytest.raises(ValueError, match="needs a field `type` defaulting to 'other'"):
        registry.register(_toy_type(name="other"))
    with pytest.raises(ValueError, match="required secret 'volume' is not a secret field"):
        registry.register(
            SinkType(name="toy", settings=ToySinkSettings, factory=ToySink, required_secrets=("volume",))
        )
    assert registry.find("toy") is None and registry.find("other") is None


def test_the_toy_loads_from_toml_and_is_checked(
    toy: SinkType[ToySinkSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_TOKEN", "toy-token-0123456789")
    config = tmp_path / "w.toml"
    config.write_text(
        '[sinks.t]\ntype = "toy"\ntoken = "${TOY_TOKEN}"\n'
        'min_severity = "warning"\nloud = true\nvolume = 11\n'
    )
    (sink,) = load_settings(config).sinks
    assert isinstance(sink, ToySinkSettings)
    assert (sink.name, sink.min_severity, sink.loud, sink.volume) == ("t", "warning", True, 11)
    assert sink.token is not None and sink.token.get() == "toy-token-0123456789"

    def error(table: dict[str, object]) -> str:
        with pytest.raises(ConfigError) as info:
            parse_settings({"sinks": {"t": {"type": "toy", **table}}})
        return str(info.value)

    assert error({}) == "sinks.t.token: required for a toy sink (or token_file)"
    assert error({"token": "x", "loud": True}) == "sinks.t.volume: a loud toy needs a volume of at least 5"
    assert error({"token": "x", "volume": 12}) == "sinks.t.volume: out of range; expected between 0 and 11"
    assert error({"token": "x", "volum": 3}).startswith("sinks.t.volum: unknown key (did you mean 'volume'?)")
    assert (
        error({"token": "x", "token_file": "y"})
        == "sinks.t.token_file: set either token or token_file, not both"
    )
    with pytest.raises(ConfigError) as info:
        parse_settings({"sinks": {"t": {"type": "pigeon"}}})
    assert str(info.value).endswith("expected one of " + ", ".join(repr(n) for n in [*BUILT_IN, "toy"]))
    # The toy is no HTTP sink: the HTTP checks leave it alone.
    assert parse_settings({"sinks": {"t": {"type": "toy", "token": "x"}}}).sinks[0].type == "toy"


async def test_the_toy_is_built_and_routed(toy: SinkType[ToySinkSettings], short_tmp: Path) -> None:
    table = {"type": "toy", "token": "x", "min_severity": "warning"}
    (cfg,) = parse_settings({"sinks": {"t": table}}).sinks
    outbox = Store(short_tmp / "outbox.sqlite")
    await outbox.open()
    (sink,) = registry.build_sinks([cfg], node="node-a", state_dir=short_tmp, store=outbox)
    assert isinstance(sink, ToySink)
    assert (sink.context.node, sink.context.state_dir, sink.context.store) == ("node-a", short_tmp, outbox)

    # A warning that starts a condition, and the info that ends it.
    events = synthetic_events("node-a", paging=True)
    stop = asyncio.Event()
    dispatcher = Dispatcher(outbox, [sink], stop=stop, rng=random.Random(1))
    queues = dispatcher.queues(events)
    # Below its minimum severity, the end of a condition reaches only a sink that pages.
    assert queues == {"t": [1, 2] if toy.capabilities.pages else [1]}
    await outbox.commit(events, queues, None)
    task = asyncio.create_task(dispatcher.run())
    try:
        async with asyncio.timeout(10):
            while len(sink.received) < len(queues["t"]):
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await task
        await dispatcher.close()
        await outbox.close()
    assert [e.seq for e in sink.received] == queues["t"]


def test_send_test_resolves_what_a_paging_toy_started(
    toy: SinkType[ToySinkSettings], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "w.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n[sinks.t]\ntype = "toy"\ntoken = "x"\n')
    assert main(["send-test", "t", "--config", str(config)]) == 0
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("t: ")]
    expected = ["t: device.removed -> delivered (no HTTP status)"]
    if toy.capabilities.pages:
        expected.append("t: device.added -> delivered (no HTTP status)")
    assert lines == expected


def test_build_sink_refuses_settings_of_no_registered_type() -> None:
    with pytest.raises(LookupError, match="ToySinkSettings belongs to no registered sink type"):
        registry.build_sink(ToySinkSettings(name="t"), node="n", state_dir=Path("/"), store=MemoryStore())


@dataclass(frozen=True)
class InOrderSinkSettings(ToySinkSettings):
    type: Literal["inorder"] = "inorder"  # type: ignore[assignment]


class InOrderSink(ToySink):
    """Delivers a batch's events one after another and stops at the first it cannot: a seq in
    `refuse` for good, a seq in `fail_once` once (transient); says how far it got (`done`)."""

    def __init__(self, settings: ToySinkSettings, context: SinkContext) -> None:
        super().__init__(settings, context)
        self.refuse = {3}
        self.fail_once = {5}
        self.batches: list[list[int]] = []

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        self.batches.append([e.seq for e in events])
        for i, event in enumerate(events):
            if event.seq in self.refuse:
                return Outcome(error="too big for the receiver", done=i)
            if event.seq in self.fail_once:
                self.fail_once.discard(event.seq)
                return Outcome(retry=True, error="no acknowledgement", done=i)
            self.received.append(event)
        return Outcome.ok()


async def test_a_sink_that_says_how_far_it_got_loses_nothing_and_dead_letters_only_the_refused(
    short_tmp: Path,
) -> None:
    sink_type = registry.register(
        SinkType(
            name="inorder",
            settings=InOrderSinkSettings,
            factory=InOrderSink,
            capabilities=Capabilities(batches=True),
        )
    )
    outbox = Store(short_tmp / "outbox.sqlite")
    try:
        await outbox.open()
        cfg = InOrderSinkSettings(name="t", retry_max_delay=0.01)
        (sink,) = registry.build_sinks([cfg], node="node-a", state_dir=short_tmp, store=outbox)
        assert isinstance(sink, InOrderSink)
        cycle = synthetic_events("node-a", paging=False)[0]
        events = [dataclasses.replace(cycle, id=f"e{i}", seq=i) for i in range(1, 8)]
        stop = asyncio.Event()
        dispatcher = Dispatcher(outbox, [sink], stop=stop, rng=random.Random(1))
        await outbox.commit(events, {"t": [e.seq for e in events]}, None)
        task = asyncio.create_task(dispatcher.run())
        try:
            async with asyncio.timeout(10):
                while (await outbox.stats("t")).depth:
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            await task
            await dispatcher.close()
        # 1 and 2 acknowledged with the refusal of 3; 3 alone dead-lettered; 4 acknowledged with
        # 5's transient failure; the retry starts at 5, never re-sending what went through.
        assert [e.seq for e in sink.received] == [1, 2, 4, 5, 6, 7]
        assert sink.batches == [[1, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7], [5, 6, 7]]
        assert [d.seq for d in await outbox.dead_letters("t")] == [3]
        stats = await outbox.stats("t")
        assert (stats.delivered, stats.dead) == (6, 1)
    finally:
        registry.unregister(sink_type.name)
        await outbox.close()
