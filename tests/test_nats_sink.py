"""The nats sink against a real 3-node JetStream cluster (nats-server processes on loopback).

What must hold whatever the cluster does: every event the agent made is in the stream exactly once
(the server drops a re-publish by its Nats-Msg-Id), in seq order per node with the default
max_in_flight; a leader killed during a burst, an agent SIGKILLed between the stream's
acknowledgement and the outbox's, and the whole cluster down for a while lose nothing and store
nothing twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from testkit.agent import Running, make_settings, running_agent, write_agent_config
from testkit.fake_kubelets import StartKubelet
from testkit.nats_cluster import NatsCluster, running_cluster
from testkit.waiting import wait_until
from watcher.config import ConfigError
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.secrets import Secret
from watcher.settings import Settings
from watcher.settings_file import parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sim.send_test import synthetic_events
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.nats import NatsSink, NatsSinkSettings, Publisher, message_headers, node_token, subject_for

pytestmark = pytest.mark.timeout(120)

STREAM = "POD_RESOURCES"
GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parent.parent


def _sink(cluster: NatsCluster, **overrides: object) -> NatsSinkSettings:
    # Short timeouts and backoff: a failover here takes seconds, and so must the retries.
    defaults: dict[str, object] = {
        "name": "fleet",
        "servers": tuple(cluster.urls),
        "create_stream": True,
        "timeout": 2.0,
        "retry_max_delay": 0.5,
    }
    return NatsSinkSettings(**{**defaults, **overrides})


class Delivered:
    """What the agent's worker acknowledged to the outbox for one sink, as it happens."""

    def __init__(self, run: Running, sink: str = "fleet") -> None:
        self.ids: list[str] = []
        run.agent.subscribe_deliveries(self._observe)
        self.sink = sink

    def _observe(self, sink: str, result: str, events: Sequence[Event], _seconds: float) -> None:
        if sink == self.sink and result == "delivered":
            self.ids.extend(e.id for e in events)


def _agent(root: Path, sink: NatsSinkSettings, node: str = "node-a") -> Settings:
    return dataclasses.replace(
        make_settings(root),
        node=node,
        sinks=(FileSinkSettings(path=root / "state" / "events.jsonl", name="audit"), sink),
    )


def _stored(messages: Sequence[Msg]) -> list[tuple[str, int, str]]:
    """(node, seq, event id) of each message, in stream order."""
    assert messages and all(m.headers is not None for m in messages)
    return [
        (m.headers["Prw-Node"], int(m.headers["Prw-Seq"]), m.headers["Nats-Msg-Id"])  # type: ignore[index]
        for m in messages
    ]


def _assert_once_each(stored: Sequence[tuple[str, int, str]], made: Sequence[Event]) -> None:
    ids = Counter(i for _, _, i in stored)
    twice = [i for i, n in ids.items() if n > 1]
    assert not twice, f"stored twice: {twice}"
    missing = {e.id for e in made} - set(ids)
    assert not missing, f"lost: {sorted(e.seq for e in made if e.id in missing)}"


def _assert_in_seq_order(stored: Sequence[tuple[str, int, str]]) -> None:
    last: dict[str, int] = {}
    for node, seq, _ in stored:
        assert seq > last.get(node, 0), f"{node}: seq {seq} stored after {last[node]}"
        last[node] = seq


@asynccontextmanager
async def _delivering(
    cluster: NatsCluster, root: Path, **sink: object
) -> AsyncIterator[tuple[FakeKubelet, Running, Delivered]]:
    """An agent with the nats sink watching a fake kubelet, once what it saw at start is delivered."""
    async with (
        FakeKubelet(root / "kubelet") as fake,
        running_agent(_agent(root, _sink(cluster, **sink)), fake) as run,
    ):
        got = Delivered(run)
        await run.settled()
        await run.recorder.until(lambda: len(got.ids) == len(run.recorder.events), 30)
        yield fake, run, got


def _held_gpus(count: int) -> list[str]:
    node = default_node()
    held = [d for _, pod in sorted(node.pods.items()) for c in pod.containers for d in c.devices.get(GPU, [])]
    return held[:count]


# --- subjects and headers ---


def test_subjects_name_the_node_as_one_token_and_keep_the_kind() -> None:
    event = synthetic_events("gpu-7.eu-west.internal", paging=False)[0]
    assert node_token("gpu-7.eu-west.internal") == "gpu-7_eu-west_internal"
    # A DNS name never has '_', so no two nodes share a token; any other name gets a digest.
    assert node_token("a_b") != node_token("a.b") and node_token("a_b").startswith("a-b-")
    for hostile in ("a b", "x.*", "x.>", "ünï", "a\r\nb", ""):
        token = node_token(hostile)
        assert token and not set(token) & set(" .*>\r\n"), hostile
    # send-test's events never look like a real device.removed to a consumer of PREFIX.*.device.>
    assert subject_for("fleet", event) == "fleet.gpu-7_eu-west_internal.send-test"
    real = dataclasses.replace(event, details={**event.details, "test": False})
    assert subject_for("fleet", real) == "fleet.gpu-7_eu-west_internal.device.removed"


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ('servers = ["http://127.0.0.1:4222"]', "servers[0]: not a nats:// or tls:// URL"),
        ("servers = []", "servers: got an empty list"),
        ('subject_prefix = "fleet.*"', "subject_prefix: dot-separated tokens"),
        ('subject_prefix = "fleet..x"', "subject_prefix: dot-separated tokens"),
        ('stream = "POD.RESOURCES"', "stream: letters, digits"),
        ('token = "abcdefgh"\nuser = "u"\npassword = "pppppppp"', "one way to authenticate"),
        ('user = "u"', "user: user and password go together"),
        ('nkey_seed = "UABCDEFGHIJK"', "nkey_seed: not an NKey user seed"),
        (
            "create_stream = true\nduplicate_window = 3600.0",
            "duplicate_window: 3600 s is shorter than max_age",
        ),
        ('ca_file = "/nonexistent/ca.pem"', "ca_file: cannot read /nonexistent/ca.pem"),
        ('creds_file = "/nonexistent/x.creds"', "creds_file: cannot read /nonexistent/x.creds"),
    ],
)
def test_check_config_refuses_what_cannot_work(tmp_path: Path, table: str, complaint: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"sinks": {"fleet": {"type": "nats", **_toml(table)}}}, base_dir=tmp_path)
    assert f"sinks.fleet.{complaint}" in str(info.value) or (
        complaint.startswith("one way") and complaint in str(info.value)
    )
    assert "pppppppp" not in str(info.value) and "abcdefgh" not in str(info.value)


def _toml(text: str) -> dict[str, object]:
    import tomllib

    return tomllib.loads(text)


class FakeJetStream:
    """publish_async as nats-py's: a future per publish, which the test resolves (or not) in any
    order; and a check that no more than the bound are ever outstanding."""

    def __init__(self, bound: int, *, raise_at: int | None = None, stall_at: int | None = None) -> None:
        self.futures: list[asyncio.Future[object]] = []
        self.bound = bound
        self.raise_at = raise_at
        self.stall_at = stall_at  # that publish never returns (its slots all taken, say)
        self.on_publish: object = None

    async def publish_async(self, subject: str, payload: bytes, **_: object) -> asyncio.Future[object]:
        outstanding = sum(not f.done() for f in self.futures)
        assert outstanding < self.bound, f"{outstanding + 1} publishes outstanding, bound {self.bound}"
        if self.raise_at is not None and len(self.futures) == self.raise_at:
            raise OSError("the reconnect buffer is full")
        if self.stall_at is not None and len(self.futures) == self.stall_at:
            await asyncio.Event().wait()
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        if callable(self.on_publish):
            self.on_publish(len(self.futures) - 1, future)
        return future


def _ack(duplicate: bool = False) -> object:
    from nats.js.api import PubAck

    return PubAck(stream=STREAM, seq=1, duplicate=duplicate)


def _publisher(js: FakeJetStream, in_flight: int, timeout: float = 0.3) -> Publisher:
    return Publisher(
        js,  # type: ignore[arg-type]
        stream=STREAM,
        prefix="p",
        timeout=timeout,
        max_in_flight=in_flight,
        max_payload=1 << 20,
    )


def _events(count: int) -> list[Event]:
    first = synthetic_events("node-a", paging=False)[0]
    details = {**first.details, "test": False}
    return [dataclasses.replace(first, id=f"e{i}", seq=i, details=details) for i in range(1, count + 1)]


async def test_done_is_the_unbroken_run_of_acknowledgements_from_the_start() -> None:
    from nats.js.errors import APIError

    # Acks arriving out of order; the third publish refused: done is 2, whatever came after it.
    js = FakeJetStream(bound=4)
    loop = asyncio.get_running_loop()

    def answer(i: int, future: asyncio.Future[object]) -> None:
        if i == 2:
            loop.call_later(0.01, future.set_exception, APIError(code=503, description="no leader"))
        else:
            loop.call_later(0.05 - i * 0.005, future.set_result, _ack(duplicate=i == 0))

    js.on_publish = answer
    result = await _publisher(js, 4).publish(_events(6))
    assert (result.done, result.duplicates) == (2, 1) and "no leader" in result.error
    assert len(js.futures) <= 4  # nothing published once the failure was seen, beyond the window

    # One never acknowledged: it times out, is cancelled (its slot freed), and stops the run there.
    js = FakeJetStream(bound=2)
    js.on_publish = lambda i, f: None if i == 1 else loop.call_soon(f.set_result, _ack())
    result = await _publisher(js, 2).publish(_events(5))
    assert result.done == 1 and "no acknowledgement within 0.3 s" in result.error
    assert js.futures[1].cancelled()

    # The client raises mid-batch: the acks already on their way still count, and the context
    # is to be made afresh (nats-py keeps the slot of a publish that raised).
    js = FakeJetStream(bound=8, raise_at=3)
    js.on_publish = lambda i, f: loop.call_later(0.02, f.set_result, _ack())
    result = await _publisher(js, 8).publish(_events(6))
    assert (result.done, result.stale) == (3, True) and "reconnect buffer is full" in result.error

    # The client stalls in a publish: given up on within the timeout, the acks on their way
    # still count, and the context is to be made afresh.
    js = FakeJetStream(bound=4, stall_at=2)
    js.on_publish = lambda i, f: loop.call_soon(f.set_result, _ack())
    result = await _publisher(js, 4).publish(_events(5))
    assert (result.done, result.stale) == (2, True) and "could not publish within 0.3 s" in result.error

    # Cancelled while stalled (the agent stopping): it ends at once, publishing nothing more.
    js = FakeJetStream(bound=4, stall_at=1)
    js.on_publish = lambda i, f: loop.call_soon(f.set_result, _ack())
    publishing = asyncio.create_task(_publisher(js, 4, timeout=60).publish(_events(5)))
    for _ in range(100):  # until it is in the stalled publish, after the first
        if js.futures:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    publishing.cancel()
    done, _ = await asyncio.wait({publishing}, timeout=5)
    assert done == {publishing} and len(js.futures) == 1

    # With max_in_flight 1 the next is published only once the one before is acknowledged.
    js = FakeJetStream(bound=1)
    js.on_publish = lambda i, f: loop.call_later(0.01, f.set_result, _ack())
    assert (await _publisher(js, 1).publish(_events(5))).done == 5


def test_a_send_test_event_is_marked_in_every_header_a_consumer_may_route_on() -> None:
    test, real = synthetic_events("node-a", paging=False)[0], _events(1)[0]
    assert message_headers(test)["Prw-Kind"] == "send-test" and message_headers(test)["Prw-Test"] == "true"
    assert message_headers(real)["Prw-Kind"] == "device.removed" and "Prw-Test" not in message_headers(real)


# --- against the cluster ---


async def test_every_event_lands_once_in_seq_order_per_node(
    tmp_path: Path, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    gpu_a, gpu_b = _held_gpus(2)
    async with running_cluster(tmp_path / "nats") as cluster:
        sink = _sink(cluster)
        fake_a = await start_kubelet(root=short_tmp / "a" / "kubelet")
        fake_b = await start_kubelet(root=short_tmp / "b" / "kubelet")
        async with (
            running_agent(_agent(short_tmp / "a", sink, "gpu-1.eu.example"), fake_a) as a,
            running_agent(_agent(short_tmp / "b", sink, "gpu-2.eu.example"), fake_b) as b,
        ):
            got_a, got_b = Delivered(a), Delivered(b)
            await a.settled()
            await b.settled()
            for fake in (fake_a, fake_b):
                fake.make_unhealthy(GPU, gpu_a)
                fake.add_device(GPU, "GPU-new-1")
            await a.quiet_cycle()
            await b.quiet_cycle()
            fake_a.heal(GPU, gpu_a)
            fake_b.make_unhealthy(GPU, gpu_b)
            fake_b.remove_device(GPU, "GPU-new-1")
            await a.quiet_cycle()
            await b.quiet_cycle()
            for run, got in ((a, got_a), (b, got_b)):
                await run.recorder.until(
                    lambda run=run, got=got: len(got.ids) == len(run.recorder.events), 30
                )
            made = [*a.recorder.events, *b.recorder.events]
            kinds = {str(e.kind) for e in made}
            assert {"device.removed", "device.added"} <= kinds

        messages = await cluster.messages(STREAM)
        stored = _stored(messages)
        _assert_once_each(stored, made)
        assert len(stored) == len(made)
        _assert_in_seq_order(stored)
        by_id = {e.id: e for e in made}
        for message in messages:
            event = by_id[message.headers["Nats-Msg-Id"]]  # type: ignore[index]
            assert message.subject == f"pod-resources.{node_token(event.node)}.{event.kind}"
            assert json.loads(message.data) == event.to_dict()
            assert message.headers["Prw-Kind"] == str(event.kind)  # type: ignore[index]
            assert message.headers["Prw-Schema"] == "pod-resources-watcher.event/v1"  # type: ignore[index]


# max_in_flight 1 is the long one (a batch at a time through the election): `make chaos` runs it.
@pytest.mark.parametrize("in_flight", [pytest.param(1, marks=pytest.mark.chaos), 16])
async def test_the_stream_leader_killed_during_a_burst_loses_nothing_and_stores_nothing_twice(
    tmp_path: Path, short_tmp: Path, in_flight: int
) -> None:
    async with running_cluster(tmp_path / "nats") as cluster:
        async with _delivering(cluster, short_tmp, max_in_flight=in_flight, max_batch=20) as (fake, run, got):
            leader = await cluster.stream_leader(STREAM)
            killed_at: list[int] = []

            def kill_mid_burst(sink: str, result: str, events: Sequence[Event], _s: float) -> None:
                # Synchronously, from the worker's own acknowledgement: the next batch is in hand.
                if sink == "fleet" and not killed_at and len(got.ids) >= 40 + len(events):
                    cluster.kill(leader)
                    killed_at.append(len(got.ids))

            run.agent.subscribe_deliveries(kill_mid_burst)
            start = len(run.recorder.events)
            for i in range(150):
                fake.add_device(GPU, f"GPU-burst-{i:03d}")
                if i % 10 == 9:
                    await run.quiet_cycle()
            await run.quiet_cycle()
            assert killed_at, "the burst was delivered before the leader could be killed"
            assert len(run.recorder.events) - start >= 150
            assert len(got.ids) < len(run.recorder.events), "nothing was left to deliver after the kill"
            await cluster.restart(leader)
            await run.recorder.until(lambda: len(got.ids) == len(run.recorder.events), 60)
            made = list(run.recorder.events)
            assert run.agent.metrics.value("deliveries_total", sink="fleet", result="dead_letter") == 0

        stored = _stored(await cluster.messages(STREAM))
        _assert_once_each(stored, made)
        assert len(stored) == len(made)
        if in_flight == 1:
            _assert_in_seq_order(stored)


# 14 s of a three-server cluster stopped and started: `make chaos` runs it (CI runs both).
@pytest.mark.chaos
async def test_the_whole_cluster_down_events_wait_in_the_outbox_and_arrive(
    tmp_path: Path, short_tmp: Path
) -> None:
    gpu = _held_gpus(1)[0]
    async with running_cluster(tmp_path / "nats") as cluster:
        async with _delivering(cluster, short_tmp) as (fake, run, got):
            cluster.close()
            before = len(run.recorder.events)
            fake.make_unhealthy(GPU, gpu)
            await run.quiet_cycle()
            fake.heal(GPU, gpu)
            await run.quiet_cycle()
            assert len(run.recorder.events) >= before + 2
            # Held, not lost and not dead-lettered: the outbox keeps them for the sink.
            for _ in range(3):
                await run.quiet_cycle()
            assert (await run.agent.outbox.stats("fleet")).depth == len(run.recorder.events) - before
            assert len(got.ids) == before
            await cluster.start()
            await run.recorder.until(lambda: len(got.ids) == len(run.recorder.events), 60)
            made = list(run.recorder.events)

        stored = _stored(await cluster.messages(STREAM))
        _assert_once_each(stored, made)
        assert len(stored) == len(made)
        _assert_in_seq_order(stored)


async def test_a_missing_stream_holds_the_events_until_it_is_created(
    tmp_path: Path, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    async with running_cluster(tmp_path / "nats", size=1) as cluster:
        sink = _sink(cluster, create_stream=False)
        fake = await start_kubelet()
        async with running_agent(_agent(short_tmp, sink), fake) as run:
            got = Delivered(run)
            await run.settled()
            for _ in range(3):
                await run.quiet_cycle()
            assert got.ids == [] and (await run.agent.outbox.stats("fleet")).depth > 0
            await cluster.add_stream(STREAM, ["pod-resources.>"], replicas=1, duplicate_window=86400)
            await run.recorder.until(lambda: len(got.ids) == len(run.recorder.events), 30)
        assert len(_stored(await cluster.messages(STREAM))) == len(got.ids)


async def test_an_event_over_the_servers_max_payload_is_dead_lettered_alone(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "nats", size=1, extra="max_payload: 4096") as cluster:
        sink = NatsSink(_sink(cluster, stream_replicas=1), node="node-a")
        cycle = new_cycle_id()

        def event(seq: int, summary: str) -> Event:
            change = Change(Kind.DEVICE_ADDED, Severity.INFO, summary, {"resource": GPU, "device": f"d{seq}"})
            return envelope(change, seq=seq, node="node-a", cycle=cycle, before=None, after=None)

        # Its payload alone is under the limit: the headers, which the server counts too, are not.
        big = event(3, "")
        filler = 4096 - len(json.dumps(big.to_dict(), separators=(",", ":"))) - 40
        big = event(3, "x" * filler)
        assert len(json.dumps(big.to_dict(), separators=(",", ":"))) < 4096
        batch = [event(1, "small"), event(2, "small"), big, event(4, "small")]
        try:
            outcome = await sink.deliver(batch)
            assert not outcome.delivered and not outcome.retry
            assert outcome.done == 2 and "over the server's max_payload of 4096" in outcome.error
            # What the worker then does: the two before it are acknowledged, it alone is
            # dead-lettered, and the one after it goes on its own.
            assert (await sink.deliver(batch[3:])).delivered
        finally:
            await sink.close()
        assert [seq for _, seq, _ in _stored(await cluster.messages(STREAM))] == [1, 2, 4]


# --- an agent killed between the stream's acknowledgement and the outbox's ---


def _agent_process(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=out)


async def test_a_sigkill_between_publish_and_outbox_ack_is_deduplicated_by_the_server(
    tmp_path: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet()
    async with running_cluster(tmp_path / "nats") as cluster:
        servers = ", ".join(f'"{u}"' for u in cluster.urls)
        config = write_agent_config(
            tmp_path / "agent.toml",
            tmp_path,
            fake,
            f'[sinks.fleet]\ntype = "nats"\nservers = [{servers}]\ncreate_stream = true\n'
            "timeout = 2.0\nretry_max_delay = 0.5\n",
            log_level="info",
        )
        hold = tmp_path / "hold"
        hold.mkdir()
        log = tmp_path / "agent.log"
        held = _agent_process(
            ["-m", "testkit.nats_kill_point", str(hold), "1", "--", "run", "-c", str(config)], log
        )
        try:
            await wait_until(lambda: (hold / "published").exists(), 30, what="the first acknowledged publish")
            seqs = json.loads((hold / "published").read_text())
            # The stream has them; the outbox does not know: the process is stopped before its ack.
            assert sorted(s for _, s, _ in _stored(await cluster.messages(STREAM))) == sorted(seqs)
            held.send_signal(signal.SIGKILL)
        finally:
            held.kill()
            held.wait(10)

        again = _agent_process(["-m", "watcher", "run", "-c", str(config)], log)
        try:
            await wait_until(
                lambda: "the stream already had some of these events" in log.read_text(),
                30,
                what="the re-publish",
            )
            line = next(
                json.loads(x)
                for x in log.read_text().splitlines()
                if "the stream already had some of these events" in x
            )
            assert line["duplicates"] == len(seqs)
        finally:
            again.send_signal(signal.SIGTERM)
            again.wait(20)
        stored = _stored(await cluster.messages(STREAM))
        assert len({i for _, _, i in stored}) == len(stored), "a re-publish was stored twice"
        assert sorted(s for _, s, _ in stored)[: len(seqs)] == sorted(seqs)


AGENT_PERMISSIONS = """authorization {
  users: [
    { user: admin, password: admin-pass-0123 }
    { user: node-agent, password: agent-pass-0123, permissions: {
        publish: { allow: ["pod-resources.node-a.>", "$JS.API.STREAM.INFO.POD_RESOURCES"] }
        subscribe: { allow: ["_INBOX.>"] } } }
  ]
}"""


async def test_the_least_privilege_the_readme_grants_is_enough_and_no_more(tmp_path: Path) -> None:
    from nats.js.api import StreamConfig

    admin_auth = {"user": "admin", "password": "admin-pass-0123"}
    async with running_cluster(
        tmp_path / "nats", size=1, extra=AGENT_PERMISSIONS, auth=admin_auth
    ) as cluster:
        admin = await cluster.connect()
        try:
            js = admin.jetstream(timeout=5)
            await js.add_stream(
                StreamConfig(name=STREAM, subjects=["pod-resources.>"], duplicate_window=86400)
            )
            events = synthetic_events("node-a", paging=True)
            agent = _sink(
                cluster, create_stream=False, user="node-agent", password=Secret(value="agent-pass-0123")
            )
            sink = NatsSink(agent, node="node-a")
            try:
                assert (await sink.deliver(events)).delivered
            finally:
                await sink.close()
            # Creating the stream is not granted: a sink told to create a missing one is refused.
            creating = NatsSink(dataclasses.replace(agent, stream="OTHER", create_stream=True), node="node-a")
            try:
                refused = await creating.deliver(events)
            finally:
                await creating.close()
            assert refused.retry and not refused.delivered
            assert "permissions violation" in refused.error and "stream.info.other" in refused.error
            # Nor is publishing as another node, with a user per node.
            elsewhere = NatsSink(agent, node="node-b")
            try:
                refused = await elsewhere.deliver(synthetic_events("node-b", paging=False))
            finally:
                await elsewhere.close()
            assert refused.retry and "permissions violation" in refused.error
            assert "pod-resources.node-b.send-test" in refused.error
            info = await js.stream_info(STREAM)
            assert info.state.messages == len(events)
        finally:
            await admin.close()
