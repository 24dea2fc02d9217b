"""The nats sink against what a stream, a server or a node name can throw at it: refusals read
from the acknowledgement (not waited out as a lost one), an acknowledgement from a stranger, a
server that hangs while the agent stops, a greeting no client could hold, names that would share a
subject. Real nats-server processes, or a loopback peer that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from testkit.nats_cluster import NatsCluster, running_cluster
from testkit.waiting import wait_until
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.sinks.nats import NatsSink, NatsSinkSettings

pytestmark = pytest.mark.timeout(60)

STREAM = "POD_RESOURCES"
GPU = "nvidia.com/gpu"


def _settings(cluster: NatsCluster | None = None, **overrides: object) -> NatsSinkSettings:
    defaults: dict[str, object] = {
        "name": "fleet",
        "servers": tuple(cluster.urls) if cluster is not None else ("nats://127.0.0.1:1",),
        "create_stream": False,
        "timeout": 2.0,
    }
    return NatsSinkSettings(**{**defaults, **overrides})


def _events(*summaries: str, node: str = "node-a") -> list[Event]:
    cycle = new_cycle_id()

    def event(seq: int, summary: str) -> Event:
        change = Change(Kind.DEVICE_ADDED, Severity.INFO, summary, {"resource": GPU, "device": f"d{seq}"})
        return envelope(change, seq=seq, node=node, cycle=cycle, before=None, after=None)

    return [event(i, s) for i, s in enumerate(summaries, start=1)]


@asynccontextmanager
async def _one_server(root: Path, **stream: object) -> AsyncIterator[NatsCluster]:
    """One JetStream server with the events' stream made as `stream` says."""
    async with running_cluster(root, size=1) as cluster:
        await cluster.add_stream(STREAM, ["pod-resources.>"], replicas=1, duplicate_window=86400, **stream)
        yield cluster


def _said(logs: list[dict[str, object]], text: str) -> bool:
    return any(text in str(line.get("event")) for line in logs)


async def test_an_event_over_the_streams_max_msg_size_is_dead_lettered_alone_fast(tmp_path: Path) -> None:
    # Under the server's max_payload (so not caught before publishing), over the stream's limit:
    # the acknowledgement says so, and that is read, not waited out as a lost one.
    async with _one_server(tmp_path / "nats", max_msg_size=2048) as cluster:
        sink = NatsSink(_settings(cluster), node="node-a")
        batch = _events("small", "small", "x" * 4000, "small")
        with capture_logs() as logs:
            try:
                started = time.monotonic()
                outcome = await sink.deliver(batch)
                assert time.monotonic() - started < 1.5, "the refusal was waited out as a timeout"
                assert not outcome.delivered and not outcome.retry and outcome.done == 2
                assert "code 10054" in outcome.error and "max_msg_size" in outcome.error
                assert (await sink.deliver(batch[3:])).delivered
                # The connection was never down: saying so would be false, and the next real
                # outage (one line per outage) would then go unlogged.
                assert not _said(logs, "NATS connection error")
                cluster.kill(cluster.servers[0])
                # One line for the outage, whichever the client reports first (the lost socket's
                # error, while its status still says connected, or the disconnect); never an error
                # "while the connection is up".
                await wait_until(
                    lambda: _said(logs, "disconnected from NATS") or _said(logs, "NATS connection error"),
                    5,
                    what="the outage logged",
                )
                assert not _said(logs, "the connection is up")
            finally:
                await sink.close()


async def test_a_full_stream_that_discards_new_is_a_clear_retry_that_clears(tmp_path: Path) -> None:
    from nats.js.api import DiscardPolicy

    async with _one_server(tmp_path / "nats", max_msgs=2, discard=DiscardPolicy.NEW) as cluster:
        sink = NatsSink(_settings(cluster), node="node-a")
        batch = _events("one", "two", "three")
        try:
            started = time.monotonic()
            outcome = await sink.deliver(batch)
            assert time.monotonic() - started < 1.5, "the refusal was waited out as a timeout"
            assert outcome.retry and outcome.done == 2
            assert "code 10077" in outcome.error and "discard=new is full" in outcome.error
            # Room made (a consumer's work, a raised limit): the retry goes through.
            nc = await cluster.connect()
            try:
                await nc.jetstream(timeout=5).purge_stream(STREAM)
            finally:
                await nc.close()
            assert (await sink.deliver(batch[2:])).delivered
        finally:
            await sink.close()


async def test_an_answer_from_anything_but_the_stream_is_never_taken_for_stored(tmp_path: Path) -> None:
    async with _one_server(tmp_path / "nats") as cluster:
        sink = NatsSink(_settings(cluster), node="node-a")
        nc = await cluster.connect()
        try:
            assert (await sink.deliver(_events("first"))).delivered
            # The stream gone, a plain subscriber answers on its subjects as if it were one.
            await nc.jetstream(timeout=5).delete_stream(STREAM)
            answers = [
                b'{"stream":"OTHER","seq":7}',
                b"hello",
                b'{"error":"x"}',
                b'{"stream":"POD_RESOURCES"}',
            ]
            answer = iter(answers)

            async def impostor(msg: object) -> None:
                await nc.publish(msg.reply, next(answer))  # type: ignore[attr-defined]

            await nc.subscribe("pod-resources.>", cb=impostor)
            await nc.flush()
            errors = []
            for _ in answers:
                outcome = await sink.deliver(_events("second"))
                assert not outcome.delivered and outcome.retry and outcome.done == 0
                errors.append(outcome.error)
            assert "an acknowledgement from stream 'OTHER', not POD_RESOURCES" in errors[0]
            assert "no JetStream acknowledgement: b'hello'" in errors[1]
            assert "the stream refused it: x" in errors[2]
            assert "an acknowledgement without stream and seq" in errors[3]
        finally:
            await nc.close()
            await sink.close()


@asynccontextmanager
async def _stopped(cluster: NatsCluster) -> AsyncIterator[None]:
    """The server hung (SIGSTOP): its sockets stay open, it reads and answers nothing."""
    server = cluster.servers[0]
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


async def test_closing_against_a_hung_server_ends_within_the_grace(tmp_path: Path) -> None:
    from watcher.app import SHUTDOWN_GRACE_S
    from watcher.sinks.nats.sink import CLOSE_GRACE_S

    # The tasks' grace, then every sink's close, then the outbox: inside the 15 s a stop gets.
    assert SHUTDOWN_GRACE_S + CLOSE_GRACE_S + 2 < 15
    async with _one_server(tmp_path / "nats") as cluster:
        sink = NatsSink(_settings(cluster, max_in_flight=8, timeout=1.0), node="node-a")
        try:
            assert (await sink.deliver(_events("first"))).delivered
            async with _stopped(cluster):
                # Megabytes the hung server never reads: they wait in the client's buffers.
                stuck = await sink.deliver(_events(*["x" * 900_000] * 8))
                assert stuck.retry and not stuck.delivered
                started = time.monotonic()
                await sink.close()
                took = time.monotonic() - started
        finally:
            await sink.close()
        assert took < 1.0 + 1.0, f"closing took {took:.1f} s"


def test_no_other_name_shares_a_subject_token_with_a_dns_name() -> None:
    from watcher.sinks.nats import node_token

    # "gpu 1" is cut to gpu-1 plus a digest: the digest itself must not spell a DNS name's token.
    hostile = ["gpu 1", "a_b", "GPU-1", "gpu\udcff", "gpu\\udcff", "", "x" * 300]
    for name in hostile:
        token = node_token(name)
        assert node_token(token) != token, f"{name!r} shares {token} with the DNS name {token}"
        assert node_token(token.lower().replace("_", ".")) != token
    assert len({node_token(n) for n in hostile}) == len(hostile)


def test_a_node_name_that_is_no_utf8_fails_the_config_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from watcher.config import ConfigError
    from watcher.settings_file import parse_settings

    monkeypatch.setenv("NODE_NAME", os.fsdecode(b"gpu\xff"))
    with pytest.raises(ConfigError, match=r"node: \$NODE_NAME is not valid UTF-8"):
        parse_settings({})
    assert parse_settings({"node": "gpu-1"}).node == "gpu-1"  # named in the file: that one is used


INFO = b'INFO {"server_id":"peer","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}\r\n'


class Peer:
    """A loopback peer on one port: a NATS server for its first `good` connections (INFO, then
    PONG to every PING), then one whose greeting is a 10 MB INFO line; it counts connections."""

    def __init__(self, good: int) -> None:
        self.good = good
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[object]] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"nats://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            if self.connections > self.good:
                writer.write(b'INFO {"junk":"' + b"x" * 10_000_000 + b'"}\r\n')
                await writer.drain()
                await reader.read()
                return
            writer.write(INFO)
            while line := await reader.readline():
                if line.startswith(b"PING"):
                    writer.write(b"PONG\r\n")
                    await asyncio.sleep(0.2)
                    return  # connected; then dropped: the client reconnects, to the hostile greeting
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()  # what it still holds (the 10 MB) need not reach anyone

    async def __aenter__(self) -> Peer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def test_a_10mb_greeting_is_a_clear_retry_not_a_traceback_nor_a_dead_reconnect() -> None:
    from watcher.sinks.nats import connect

    async with Peer(good=0) as peer:
        sink = NatsSink(_settings(servers=(peer.url,)), node="node-a")
        try:
            outcome = await sink.deliver(_events("one"))
        finally:
            await sink.close()
        assert outcome.retry and "cannot reach NATS" in outcome.error
        assert "greeting is not one a NATS server sends" in outcome.error

    # Once connected, the same greeting on a reconnect is one failed attempt: the client goes on.
    before = asyncio.all_tasks()
    async with Peer(good=1) as peer:
        nc = await connect(_settings(servers=(peer.url,)), name="test")
        try:
            # Without the fix the reconnect loop died after the first bad greeting: 2 connections,
            # then none. A third shows it went on (bounded generously: each attempt reads 10 MB).
            await wait_until(lambda: peer.connections >= 3, 30, what="reconnect attempts going on")
            assert not nc.is_closed
        finally:
            await nc.close()

            # nats-py's close waits for a reconnect attempt under way only so long, and on Python
            # 3.11 its wait_for can swallow the cancel of one reading the 10 MB greeting: cancel
            # what is left again until it is gone (this test is about the reconnects going on).
            def ended() -> bool:
                left = asyncio.all_tasks() - before
                for task in left:
                    if getattr(task.get_coro(), "__qualname__", "").startswith("Client."):
                        task.cancel()  # the client's own (the peer's tasks end with it)
                return not left

            await wait_until(ended, 20, what="the client's tasks ended")
