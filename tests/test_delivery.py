"""Delivery end to end: the audit log, a real Alertmanager, and nothing lost across a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from testkit.agent import make_settings, running_agent, write_agent_config
from testkit.fake_kubelets import StartKubelet
from testkit.http_server import HttpServer, serve_post
from testkit.planted_secret import PLANTED_SECRET
from testkit.ports import free_port
from testkit.tools import tool
from testkit.waiting import wait_until
from watcher.cli import main
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import envelope
from watcher.sinks.alertmanager import AlertmanagerSinkSettings
from watcher.sinks.audit import verify_files
from watcher.sinks.file import FileSinkSettings

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parent.parent


# --- the audit log ---


async def test_audit_log_rotates_keeps_its_chain_and_verify_names_the_broken_record(
    short_tmp: Path, capfd: pytest.CaptureFixture[str], start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=5)
    audit = short_tmp / "audit" / "audit.jsonl"
    settings = dataclasses.replace(
        make_settings(short_tmp),
        sinks=(FileSinkSettings(name="audit", path=audit, max_bytes=4096, keep=50),),
    )
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.add_devices(GPU, [(f"GPU-churn-{i}", (i % 2,)) for i in range(12)])
        await run.quiet_cycle()
        seqs = [e.seq for e in run.recorder.events]
    files = sorted(audit.parent.glob("audit.jsonl*"))
    assert len(files) >= 3, "expected the log to rotate"
    result = verify_files(files)
    assert result.ok, result.problem
    assert result.records == len(seqs)
    # A restart continues the chain: the first record of the newest file chains to the last of .1.
    assert main(["audit", "verify", *map(str, files)]) == 0
    assert "OK: " in capfd.readouterr().out

    # Change one byte of an earlier record: that record is named.
    victim = audit.with_name("audit.jsonl.2")
    lines = victim.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    altered = lines[1].replace(b'"severity":"info"', b'"severity":"infO"', 1)
    assert altered != lines[1]
    victim.write_bytes(b"".join([lines[0], altered, *lines[2:]]))
    assert main(["audit", "verify", *map(str, files)]) == 1
    out = capfd.readouterr().out
    assert f"BROKEN: record {record['n']} at {victim}:2 was altered" in out
    victim.write_bytes(b"".join(lines))

    # Delete a line: the missing record is named.
    gone = json.loads(lines[2])
    victim.write_bytes(b"".join([lines[0], lines[1], *lines[3:]]))
    assert main(["audit", "verify", *map(str, files)]) == 1
    assert f"BROKEN: record {gone['n']} missing before {victim}:3" in capfd.readouterr().out


# --- a real Alertmanager ---


@pytest.fixture
def alertmanager(short_tmp: Path) -> Iterator[str]:
    binary = tool("alertmanager")
    config = short_tmp / "am.yml"
    config.write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={short_tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _am_alerts(session: aiohttp.ClientSession, url: str) -> list[dict[str, object]]:
    async with session.get(f"{url}/api/v2/alerts") as response:
        data: list[dict[str, object]] = await response.json()
        return data


async def _until_ready(session: aiohttp.ClientSession, url: str) -> None:
    async def ready() -> bool:
        try:
            async with session.get(f"{url}/-/ready") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, timeout=20, interval=0.1)  # a separate process: nothing to await but its port


async def test_alertmanager_fires_while_the_condition_lasts_and_resolves(
    alertmanager: str, fake_store: _DictStore
) -> None:
    from watcher.sinks.alertmanager import AlertmanagerSink

    sink = AlertmanagerSink(
        # Resolved at once: the hold-down before it is tests/test_flap_pages.py's (held, the alert
        # would still vanish here, but only when its endsAt passed).
        AlertmanagerSinkSettings(name="am", url=alertmanager, resend_interval=1.0, resolve_hold_down=0),
        node="node-a",
        store=fake_store,
    )
    removed = envelope(
        Change(
            Kind.DEVICE_REMOVED,
            Severity.CRITICAL,
            "nvidia.com/gpu GPU-1 left allocatable while allocated to ml/a/b",
            {
                "resource": GPU,
                "device": "GPU-1",
                "numa": [0],
                "allocated_to": ["ml/a/b"],
                "namespaces": ["ml"],
            },
        ),
        seq=1,
        node="node-a",
        cycle="c1",
        before=None,
        after=None,
    )
    back = envelope(
        Change(
            Kind.DEVICE_ADDED,
            Severity.INFO,
            "nvidia.com/gpu GPU-1 joined",
            {"resource": GPU, "device": "GPU-1"},
        ),
        seq=2,
        node="node-a",
        cycle="c2",
        before=None,
        after=None,
    )
    async with aiohttp.ClientSession() as session:
        await _until_ready(session, alertmanager)
        assert (await sink.deliver([removed])).delivered
        alerts = await _am_alerts(session, alertmanager)
        assert len(alerts) == 1
        labels = alerts[0]["labels"]
        assert labels == {
            "alertname": "PodResourcesDeviceUnavailable",
            "node": "node-a",
            "resource": GPU,
            "device": "GPU-1",
            "severity": "critical",
        }
        first_update = alerts[0]["updatedAt"]

        async def resent() -> bool:
            return (await _am_alerts(session, alertmanager))[0]["updatedAt"] != first_update

        # While it lasts it is re-sent (here every second).
        resend = asyncio.ensure_future(sink.background()())  # type: ignore[misc]
        try:
            await wait_until(resent, timeout=10, interval=0.2)  # another process's state
        finally:
            resend.cancel()
            await asyncio.gather(resend, return_exceptions=True)
        assert (await sink.deliver([back])).delivered

        async def resolved() -> bool:
            return not await _am_alerts(session, alertmanager)

        await wait_until(resolved, timeout=10, interval=0.1)
    await sink.close()


class _DictStore:
    def __init__(self) -> None:
        self.data: dict[str, object] = {}

    async def kv_get(self, key: str) -> object:
        return self.data.get(key)

    async def kv_set(self, key: str, value: object) -> None:
        self.data[key] = value


@pytest.fixture
def fake_store() -> _DictStore:
    return _DictStore()


# --- nothing lost: receiver down, agent SIGKILLed, receiver back ---


class _Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.ids: list[str] = []
        self.mismatched: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.headers.get("webhook-id") != body["id"]:
            self.mismatched.append(body["id"])
        self.bodies.append(body)
        self.ids.append(str(body["id"]))
        return web.Response(status=204)


@pytest.fixture
def receiver_port() -> int:
    return free_port()


def _audit_events(path: Path) -> list[dict[str, object]]:
    out = []
    for p in sorted(path.parent.glob(path.name + "*")):
        for line in p.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line)["event"])
    return sorted(out, key=lambda e: int(e["seq"]))  # type: ignore[call-overload]


@pytest.mark.chaos  # long: `make chaos` runs it (CI runs both), `make test` leaves it out
@pytest.mark.slow
async def test_nothing_is_lost_when_the_receiver_is_down_and_the_agent_is_killed(
    short_tmp: Path, receiver_port: int, start_kubelet: StartKubelet
) -> None:
    kubelet_root = short_tmp / "kubelet"
    fake = await start_kubelet(root=kubelet_root, seed=11)
    audit = short_tmp / "state" / "audit.jsonl"
    secret = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTAx"
    config = write_agent_config(
        short_tmp / "watcher.toml",
        short_tmp,
        fake,
        f"""[sinks.inventory]
type = "webhook"
url = "http://127.0.0.1:{receiver_port}/events?token={PLANTED_SECRET}"
signing_secret = "{secret}"
rate = 500
retry_max_delay = 0.5
""",
        http="127.0.0.1:0",
    )

    logs = short_tmp / "agent.log"

    def start_agent() -> subprocess.Popen[bytes]:
        with open(logs, "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", "watcher", "run", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    async def churn(start: int, count: int) -> None:
        for i in range(start, start + count):
            fake.add_device(GPU, f"GPU-c{i}", (i % 2,))
            want = len(_audit_events(audit)) + 1
            await wait_until(lambda want=want: len(_audit_events(audit)) >= want, 20)

    agent = start_agent()
    try:
        await wait_until(lambda: len(_audit_events(audit)) >= 1, 30)
        await churn(0, 100)
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        agent = start_agent()
        await churn(100, 100)
        expected = _audit_events(audit)
        assert len(expected) >= 200

        recorder = _Recorder()
        async with HttpServer(recorder.handle, path="/events", port=receiver_port):
            want = {str(e["id"]) for e in expected}
            await wait_until(lambda: want <= set(recorder.ids), 60)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)

    # The receiver was down for a while: failures were logged, never with the secret in the URL.
    logged = logs.read_text()
    assert "delivery failed" in logged
    assert PLANTED_SECRET not in logged
    # Every event arrived; first arrivals are in seq order; a duplicate is the same event.
    assert recorder.mismatched == []
    first_seen: dict[str, int] = {}
    for body in recorder.bodies:
        first_seen.setdefault(str(body["id"]), int(body["seq"]))  # type: ignore[call-overload]
    seqs_in_arrival_order = list(first_seen.values())
    assert seqs_in_arrival_order == sorted(seqs_in_arrival_order)
    by_id = {str(e["id"]): e for e in expected}
    for body in recorder.bodies:
        if str(body["id"]) in by_id:
            assert body == by_id[str(body["id"])]
    assert [int(e["seq"]) for e in expected] == list(range(1, len(expected) + 1))  # type: ignore[call-overload]


# --- bounded queues, and a hung sink that holds up nobody else ---


async def test_a_sink_queue_over_its_cap_drops_the_oldest_and_says_so(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    from structlog.testing import capture_logs

    from watcher.secrets import Secret
    from watcher.sinks.webhook import WebhookSinkSettings

    # Nobody listens on this port: everything queues.
    dead = WebhookSinkSettings(
        name="dead", url=Secret(value=f"http://127.0.0.1:{free_port()}/"), max_queue=3, retry_max_delay=0.05
    )
    fake = await start_kubelet(seed=2)
    settings = dataclasses.replace(make_settings(short_tmp), sinks=(dead,))
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            await run.add_devices(GPU, [(f"GPU-cap-{i}", (0,)) for i in range(3)])
            # While an attempt is in flight the caps wait for it (its batch is the oldest) and the
            # worker applies them when it ends: nothing to await but the outcome.
            async with asyncio.timeout(5):
                while (stats := await run.agent.outbox.stats("dead")).depth > 3:
                    await asyncio.sleep(0.01)
            queued = await run.agent.outbox.pending("dead", 100)
    total = len(run.recorder.events)
    assert stats.depth == 3
    assert stats.dropped == total - 3
    # The newest stay, the oldest went.
    assert [e.seq for e in queued] == [e.seq for e in run.recorder.events[-3:]]
    drops = [e for e in logs if e["event"].startswith("sink queue over its cap")]
    assert sum(e["dropped"] for e in drops) == total - 3
    # Each drop is logged with its seq range: together, exactly the events that went.
    dropped = sorted(s for e in drops for s in range(e["first_seq"], e["last_seq"] + 1))
    assert dropped == [e.seq for e in run.recorder.events[:-3]]
    assert {e["reason"] for e in drops} == {"max_queue"}


async def test_a_hung_sink_delays_neither_other_sinks_nor_the_watch_loop(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    from watcher.secrets import Secret
    from watcher.sinks.webhook import WebhookSinkSettings

    # A receiver that accepts the connection and never answers.
    hang = asyncio.Event()

    async def never(_: web.Request) -> web.Response:
        await hang.wait()
        return web.Response(status=204)

    server = await serve_post(never)
    slow = WebhookSinkSettings(name="slow", url=Secret(value=server.url()), timeout=60)
    audit = FileSinkSettings(name="audit", path=short_tmp / "audit.jsonl")
    fake = await start_kubelet(seed=2)
    settings = dataclasses.replace(make_settings(short_tmp), sinks=(slow, audit))
    try:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            await run.add_devices(GPU, [(f"GPU-h{i}", (1,)) for i in range(5)], timeout=5)
            total = len(run.recorder.events)
            audit_worker = run.agent.dispatcher.workers["audit"]
            await run.recorder.until(lambda: audit_worker.counts["delivered"] == total, timeout=5)
            assert run.agent.dispatcher.workers["slow"].counts["delivered"] == 0
            hang.set()
    finally:
        hang.set()
        await server.close()
