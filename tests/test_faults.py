"""Kubelet faults and absurd input: a clear log line or event, and recovery when the fault clears."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from testkit.agent import Running, make_settings, running_agent
from testkit.disks import FailingDisk, fill
from testkit.fake_kubelets import StartKubelet
from testkit.waiting import wait_until
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.store.store import Store

GPU = "nvidia.com/gpu"


async def _get(run: Running, path: str) -> tuple[int, str]:
    assert run.agent.http is not None and run.agent.http.bound_port is not None
    url = f"http://127.0.0.1:{run.agent.http.bound_port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def _logged(logs: list[dict[str, Any]], predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Until a captured log line matches; log lines have no event to await, so poll briefly."""
    await wait_until(lambda: any(predicate(e) for e in logs), timeout=10, interval=0.02)


async def test_garbage_answers_are_logged_and_the_agent_recovers(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            fake.faults.answer_garbage("List")
            failed = run.agent.metrics.value("requeries_total", result="failed")
            run.agent.wake("test")
            await run.recorder.until(
                lambda: run.agent.metrics.value("requeries_total", result="failed") > failed
            )
            fake.faults.enable("List")
            mark = len(run.recorder.events)
            fake.add_device(GPU, "GPU-after-garbage", (0,))
            assert "device.added" in await run.recorder.kinds_after(mark, 2)
    assert any(e.get("error_kind") == "DecodeError" for e in logs)


async def test_socket_path_becomes_a_directory_or_a_dangling_symlink(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            await fake.stop(remove_socket=True)
            fake.socket_path.mkdir()
            await _logged(logs, lambda e: "not a socket" in e["event"])
            fake.socket_path.rmdir()
            os.symlink(short_tmp / "nowhere.sock", fake.socket_path)
            failed = run.agent.metrics.value("requeries_total", result="failed")
            run.agent.wake("test")
            await run.recorder.until(
                lambda: run.agent.metrics.value("requeries_total", result="failed") > failed
            )
            fake.socket_path.unlink()
            mark = len(run.recorder.events)
            await fake.start()
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
    failures = [e for e in logs if e["event"] == "kubelet query failed; will retry"]
    assert failures
    assert all("Traceback" not in str(e) for e in failures)


async def test_socket_directory_deleted_and_recreated(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    fake = await start_kubelet(seed=1)
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            await fake.stop(remove_socket=True)
            shutil.rmtree(fake.socket_dir)
            await _logged(logs, lambda e: e["event"].startswith("directory vanished"))
            mark = len(run.recorder.events)
            await fake.start()  # recreates the directory and the socket
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
            fake.add_device(GPU, "GPU-after-rmdir", (1,))
            assert "device.added" in await run.recorder.kinds_after(mark, 3)


@pytest.mark.slow  # 100000 devices built: seconds
def test_absurd_but_valid_responses_build_without_blowing_up() -> None:
    devices = [
        api_pb2.ContainerDevices(resource_name="r", device_ids=[f"d{i}", f"d{i}"])  # duplicate ids
        for i in range(100_000)
    ]
    devices.append(api_pb2.ContainerDevices(resource_name="", device_ids=[""]))  # empty names
    alloc = api_pb2.AllocatableResourcesResponse(
        devices=devices,
        cpu_ids=[-5, 2**62, 0, 0],  # negative, huge, duplicate
        memory=[api_pb2.ContainerMemory(memory_type="", size=2**64 - 1)],
    )
    pods = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(name="", namespace="", containers=[api_pb2.ContainerResources(name="")])
        ]
    )
    started = time.monotonic()
    inv = build(alloc, pods)
    _ = inv.content_hash
    _ = inv.capacity
    took = time.monotonic() - started
    assert len(inv.devices) == 100_001
    assert inv.cpu_ids == (-5, 0, 2**62)
    assert took < 10  # linear work; a quadratic blow-up would take minutes


async def test_a_full_state_directory_is_loud_and_nothing_is_lost(
    short_tmp: Path, tiny_filesystem: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp)
    assert settings.state_dir == tiny_filesystem
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            filler = tiny_filesystem / "filler"
            fill(filler)
            mark = len(run.recorder.events)
            fake.add_device(GPU, "GPU-while-full", (0,))
            await _logged(logs, lambda e: e["event"].startswith("could not commit"))
            assert run.recorder.kinds(mark) == []  # nothing emitted that is not stored
            assert not run.agent.metrics.value("events_total") > mark  # and the agent is still there
            # ...and says so where an operator looks.
            status, body = await _get(run, "/readyz")
            assert status == 503
            assert f"cannot store events and state in {tiny_filesystem}" in json.loads(body)["reason"]
            _, metrics = await _get(run, "/metrics")
            assert "pod_resources_watcher_state_writable 0.0" in metrics
            failures = re.search(r"^pod_resources_watcher_state_commit_failures_total (\S+)$", metrics, re.M)
            assert failures is not None and float(failures.group(1)) >= 1
            filler.unlink()
            kinds = await run.recorder.kinds_after(mark, 2)
            await run.quiet_cycle()
            status, _ = await _get(run, "/readyz")
            assert status == 200
            _, metrics = await _get(run, "/metrics")
            assert "pod_resources_watcher_state_writable 1.0" in metrics
    assert sorted(kinds) == ["capacity.changed", "device.added"]
    assert run.recorder.kinds(mark).count("device.added") == 1
    errors = [e for e in logs if e["event"].startswith("could not commit")]
    assert errors[0]["log_level"] == "error"


# --- sink faults: a trickling receiver, a certificate for another host ---


async def test_a_receiver_that_trickles_its_status_line_times_out_and_is_retried() -> None:
    from watcher.sinks.http import HttpClient

    handlers: set[asyncio.Task[Any]] = set()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                writer.write(bytes([byte]))  # a byte every 0.25 s: about 10 s for the status line
                await writer.drain()
                await asyncio.sleep(0.25)
        finally:
            writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient(timeout=1.0)
    try:
        started = time.monotonic()
        outcome = await client.post(f"http://127.0.0.1:{port}/", b"{}", {"Content-Type": "application/json"})
        took = time.monotonic() - started
    finally:
        await client.close()
        server.close()
        for task in handlers:  # the server does not stop its handlers itself
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()
        gc.collect()  # finalize the dropped connection on this loop, not the next test's
    assert outcome.retry
    assert not outcome.delivered
    assert "no answer within 1 s" in outcome.error
    assert took < 5  # the total timeout decides, not the trickle


async def test_a_2xx_with_a_trickling_or_huge_body_is_delivered_at_once() -> None:
    from aiohttp import web

    from testkit.http_server import serve_post
    from watcher.sinks.http import HttpClient

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(40):  # 10 s of body, a byte at a time, then megabytes
                await response.write(b".")
                await asyncio.sleep(0.25)
            await response.write(b"x" * (8 << 20))
        return response

    server = await serve_post(trickle)
    client = HttpClient(timeout=30.0)
    try:
        started = time.monotonic()
        outcome = await client.post(server.url(), b"{}", {"Content-Type": "application/json"})
        took = time.monotonic() - started
    finally:
        await client.close()
        await server.close()
        gc.collect()  # finalize the dropped connection on this loop, not the next test's
    assert outcome.delivered
    assert took < 5  # the answer is the status; the body is not waited for


async def test_a_certificate_for_another_host_is_refused_unless_verification_is_off(short_tmp: Path) -> None:
    from aiohttp import web

    from testkit.certificates import self_signed, server_context
    from testkit.http_server import serve_post
    from watcher.sinks.http import HttpClient

    cert, key = self_signed(short_tmp, host="wrong.invalid")

    async def ok(_: web.Request) -> web.Response:
        return web.Response(status=204)

    server = await serve_post(ok, ssl_context=server_context(cert, key))
    url = server.url()
    strict = HttpClient(timeout=5, ca_file=cert)
    lax = HttpClient(timeout=5, ca_file=cert, tls_verify=False)
    try:
        refused = await strict.post(url, b"{}", {})
        accepted = await lax.post(url, b"{}", {})
    finally:
        await strict.close()
        await lax.close()
        await server.close()
    # The CA is trusted, but the certificate names another host: refused, and retried later.
    assert refused.retry
    assert "certificate" in refused.error.lower() or "hostname" in refused.error.lower()
    assert accepted.delivered


async def _refused_then_recovered(run: Running, logs: list[dict[str, Any]], fix: Callable[[], None]) -> None:
    """While the state directory refuses: loud, watching, nothing emitted, not ready; then `fix`."""
    await _logged(logs, lambda e: e["event"].startswith(("cannot open the outbox", "could not commit")))
    cycles = run.recorder.cycles
    await run.quiet_cycle()  # still watching
    assert run.recorder.cycles > cycles
    assert run.recorder.events == []  # nothing emitted that is not stored
    status, body = await _get(run, "/readyz")
    assert status == 503 and "cannot store events and state" in json.loads(body)["reason"]
    fix()


async def test_a_full_state_directory_at_start_keeps_its_outbox_and_catches_up(
    short_tmp: Path, tiny_filesystem: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp)
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
    fill(tiny_filesystem / "filler")
    fake.add_device(GPU, "GPU-while-away", (0,))
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await _refused_then_recovered(run, logs, (tiny_filesystem / "filler").unlink)
            await run.recorder.kinds_after(0, 3, timeout=30)
            await run.quiet_cycle()
    # A full disk is not a corrupt database: the outbox and its saved baseline were kept,
    # so the change made meanwhile is reported, once, against it.
    assert not list(tiny_filesystem.glob("*.corrupt-*"))
    assert not any("corrupt" in e["event"] for e in logs)
    assert run.recorder.kinds() == ["watcher.started", "device.added", "capacity.changed"]
    assert run.recorder.events[0].details["baseline"] == "saved"


async def test_a_read_only_state_directory_at_start_is_loud_and_the_agent_keeps_watching(
    short_tmp: Path, read_only_state: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)

    def writable() -> None:
        subprocess.run(["mount", "-o", "remount,rw", str(read_only_state)], check=True)

    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await _refused_then_recovered(run, logs, writable)
            await run.recorder.kinds_after(0, 1, timeout=30)
            fake.add_device(GPU, "GPU-after", (1,))
            await run.recorder.kinds_after(1, 2)
            status, _ = await _get(run, "/readyz")
            assert status == 200
    opened = [e for e in logs if e["event"].startswith("cannot open the outbox")]
    assert opened and opened[0]["log_level"] == "error"
    assert any(e["event"].startswith("outbox open: events flow again") for e in logs)
    assert run.recorder.kinds() == ["watcher.started", "device.added", "capacity.changed"]


async def test_a_state_disk_that_goes_read_only_under_the_agent_is_loud_and_nothing_is_lost(
    short_tmp: Path, failing_disk: FailingDisk, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp)
    assert settings.state_dir == failing_disk.path
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            failing_disk.fail()  # the kernel remounts it read-only, as after an I/O error
            fake.add_device(GPU, "GPU-while-read-only", (0,))
            await _logged(logs, lambda e: e["event"].startswith("could not commit"))
            mark = len(run.recorder.events)
            assert run.recorder.kinds() == ["watcher.started"]
            status, body = await _get(run, "/readyz")
            assert status == 503 and "cannot store events and state" in json.loads(body)["reason"]
            status, metrics = await _get(run, "/metrics")
            assert status == 200 and "pod_resources_watcher_state_writable 0.0" in metrics
            cycles = run.recorder.cycles
            await run.quiet_cycle()
            assert run.recorder.cycles > cycles  # still watching
            failing_disk.repair()  # checked and mounted again: a new filesystem under the agent
            try:
                kinds = await run.recorder.kinds_after(mark, 2, timeout=30)
            except TimeoutError:
                for e in logs[-15:]:
                    print("LOG", {k: str(v)[:200] for k, v in e.items()})
                raise
            await run.quiet_cycle()
            status, _ = await _get(run, "/readyz")
            assert status == 200
    assert sorted(kinds) == ["capacity.changed", "device.added"]
    assert run.recorder.kinds().count("device.added") == 1
    errors = [e for e in logs if e["event"].startswith("could not commit")]
    assert errors and errors[0]["log_level"] == "error"


class _Refusals:
    """Make one of the outbox's methods fail as a bad disk would, `arm()` times: before doing its
    work, or (`after`) once the work is done, as when a commit reached the disk but its fsync failed."""

    def __init__(self, outbox: Store, method: str, error: OSError, *, after: bool = False) -> None:
        self.left = 0
        self.count = 0
        real = getattr(outbox, method)

        async def refusing(*args: Any) -> None:
            if not after:
                self._maybe_refuse(error)
            await real(*args)
            if after:
                self._maybe_refuse(error)

        setattr(outbox, method, refusing)

    def _maybe_refuse(self, error: OSError) -> None:
        if self.left:
            self.left -= 1
            self.count += 1
            raise error

    def arm(self, times: int = 1) -> None:
        self.left += times


async def test_a_failed_commit_is_retried_from_the_same_bytes_and_recovers_with_nothing_new(
    short_tmp: Path,
    start_kubelet: StartKubelet,
) -> None:
    # No root needed: the outbox refuses one commit (as a bad disk would), in process.
    fake = await start_kubelet(shuffle=False)  # the retry sees the same bytes
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            refusals = _Refusals(run.agent.outbox, "commit", OSError(28, "No space left on device"))
            refusals.arm()
            fast = run.agent.decoder.stats.same_bytes
            fake.add_device(GPU, "GPU-refused-once", (0,))
            await _logged(logs, lambda e: e["event"].startswith("could not commit"))
            kinds = await run.recorder.kinds_after(1, 2)
            assert run.agent.decoder.stats.same_bytes > fast  # decided from byte-identical answers
            await run.quiet_cycle()
            assert sorted(kinds) == ["capacity.changed", "device.added"]
            assert run.recorder.kinds().count("device.added") == 1

            # A refused commit whose change is undone before the retry: nothing to emit, but
            # the agent must still find out the disk is back.
            refusals.arm()
            fake.remove_device(GPU, "GPU-refused-once")
            await _logged(logs, lambda e: e["event"].startswith("could not commit") and refusals.count == 2)
            fake.add_device(GPU, "GPU-refused-once", (0,))
            mark = len(run.recorder.events)
            status, _ = await _get(run, "/readyz")
            assert status == 503
            await run.quiet_cycle()
            await run.quiet_cycle()
            status, _ = await _get(run, "/readyz")
            assert status == 200
            assert run.recorder.kinds(mark) == []


def _audit_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines() if line.strip()]


async def test_a_commit_reported_failed_but_stored_is_continued_from_not_numbered_again(
    short_tmp: Path,
    start_kubelet: StartKubelet,
) -> None:
    # An fsync error or a remount can fail a commit that still reached the disk. The next
    # cycle must continue from what the outbox holds: numbering its own events again would
    # collide with the stored ones and lose them (INSERT OR IGNORE keeps the first).
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp)
    audit = settings.state_dir / "events.jsonl"
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            _Refusals(run.agent.outbox, "commit", OSError(5, "Input/output error"), after=True).arm()
            fake.add_device(GPU, "GPU-ghost", (0,))
            await _logged(logs, lambda e: e["event"].startswith("could not commit"))
            # The node moves on before the retry: the ghost's device goes, another comes.
            fake.remove_device(GPU, "GPU-ghost")
            fake.add_device(GPU, "GPU-next", (1,))

            def seen() -> set[tuple[str, str]]:
                return {(str(e["kind"]), str(e["details"].get("device"))) for e in _audit_log(audit)}

            want = {
                ("device.added", "GPU-ghost"),
                ("device.removed", "GPU-ghost"),
                ("device.added", "GPU-next"),
            }
            async with asyncio.timeout(20):
                while not want <= seen():
                    await run.quiet_cycle()
    events = _audit_log(audit)
    seqs = [int(e["seq"]) for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    devices = [(e["kind"], e["details"]["device"]) for e in events if str(e["kind"]).startswith("device.")]
    assert devices == [
        ("device.added", "GPU-ghost"),
        ("device.removed", "GPU-ghost"),
        ("device.added", "GPU-next"),
    ]
    assert any(
        e["event"].startswith("the outbox holds events from a commit reported as failed") for e in logs
    )


async def test_an_outbox_failure_met_only_by_a_sink_is_reported_and_repaired_on_a_quiet_node(
    short_tmp: Path,
    start_kubelet: StartKubelet,
) -> None:
    fake = await start_kubelet(seed=1)
    with capture_logs() as logs:
        async with running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            refusals = _Refusals(run.agent.outbox, "ack", OSError(5, "Input/output error"))
            refusals.arm()
            fake.add_device(GPU, "GPU-acked-late", (0,))
            await _logged(logs, lambda e: e["event"].startswith("the outbox failed under a sink"))
            # No change is pending, yet the agent reopens the outbox and says it is fine again.
            await _logged(logs, lambda e: e["event"].startswith("events and state stored again"))
            status, _ = await _get(run, "/readyz")
            assert status == 200
            # The refused ack may be watcher.started's (still in flight when the refusal was armed)
            # rather than the device's: either way the device's event arrives, and only once.
            await run.recorder.until(lambda: "device.added" in run.recorder.kinds(), timeout=10)
            await run.quiet_cycle()
    assert refusals.count == 1
    assert run.recorder.kinds().count("device.added") == 1


async def test_an_answer_over_the_receive_limit_is_a_warning_not_an_outage(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """A device plugin that lists absurd NUMA topologies can push the kubelet's answer over the
    limit. The kubelet answered: `api.answer_too_large` once, never the critical
    `kubelet.unreachable` the plugin would then choose; the changes flow again once it fits."""
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp, unreachable_grace=0.3)
    settings = dataclasses.replace(
        settings, kubelet=dataclasses.replace(settings.kubelet, max_receive_bytes=64 * 1024)
    )
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        fake.add_device(GPU, "GPU-wide", range(30_000))  # ~120 kB of NUMA ids
        await run.recorder.until(lambda: "api.answer_too_large" in run.recorder.kinds(mark))
        await asyncio.sleep(0.5)  # past the grace
        for _ in range(3):
            await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds == ["api.answer_too_large"], kinds
        (event,) = run.recorder.events[mark:]
        assert event.severity == "warning" and event.details["method"] == "GetAllocatableResources"
        assert run.agent.metrics.value("requeries_total", result="too_large") >= 3
        fake.remove_device(GPU, "GPU-wide")
        fake.add_device(GPU, "GPU-after", (1,))
        await run.recorder.until(lambda: "device.added" in run.recorder.kinds(mark))
        assert "kubelet.unreachable" not in run.recorder.kinds(mark)
        assert run.agent.kubelet_health.failing_since is None
