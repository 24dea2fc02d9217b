"""Kubelet faults and absurd input: a clear log line or event, and recovery when the fault clears."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.agent_harness import make_settings, running_agent
from watcher.fake_kubelet import FakeKubelet
from watcher.inventory import build
from watcher.kubeletapi.v1 import api_pb2

GPU = "nvidia.com/gpu"


async def _logged(logs: list[dict[str, Any]], predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Until a captured log line matches; log lines have no event to await, so poll briefly."""
    async with asyncio.timeout(10):
        while not any(predicate(e) for e in logs):
            await asyncio.sleep(0.02)


async def test_garbage_answers_are_logged_and_the_agent_recovers(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    with capture_logs() as logs:
        async with fake, running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            fake.answer_garbage("List")
            failed = run.agent.stats.queries_failed
            run.agent.trigger.fire("test")
            await run.recorder.until(lambda: run.agent.stats.queries_failed > failed)
            fake.enable("List")
            mark = len(run.recorder.events)
            fake.add_device(GPU, "GPU-after-garbage", (0,))
            assert "device.added" in await run.recorder.kinds_after(mark, 2)
    assert any(e.get("error_kind") == "DecodeError" for e in logs)


async def test_socket_path_becomes_a_directory_or_a_dangling_symlink(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    with capture_logs() as logs:
        async with fake, running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            await fake.stop(remove_socket=True)
            fake.socket_path.mkdir()
            await _logged(logs, lambda e: "not a socket" in e["event"])
            fake.socket_path.rmdir()
            os.symlink(short_tmp / "nowhere.sock", fake.socket_path)
            failed = run.agent.stats.queries_failed
            run.agent.trigger.fire("test")
            await run.recorder.until(lambda: run.agent.stats.queries_failed > failed)
            fake.socket_path.unlink()
            mark = len(run.recorder.events)
            await fake.start()
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
    failures = [e for e in logs if e["event"] == "kubelet query failed; will retry"]
    assert failures
    assert all("Traceback" not in str(e) for e in failures)


async def test_socket_directory_deleted_and_recreated(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    with capture_logs() as logs:
        async with fake, running_agent(make_settings(short_tmp), fake) as run:
            await run.recorder.kinds_after(0, 1)
            await fake.stop(remove_socket=True)
            shutil.rmtree(fake.socket_dir)
            await _logged(logs, lambda e: e["event"].startswith("directory vanished"))
            mark = len(run.recorder.events)
            await fake.start()  # recreates the directory and the socket
            assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
            fake.add_device(GPU, "GPU-after-rmdir", (1,))
            assert "device.added" in await run.recorder.kinds_after(mark, 3)


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


def _fill(path: Path) -> None:
    """Write zeros until the filesystem refuses: a full disk, to the last block."""
    with open(path, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


@pytest.fixture
def tiny_filesystem(short_tmp: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a state directory that can really fill up (root only)."""
    path = short_tmp / "state"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def test_a_full_state_directory_is_loud_and_nothing_is_lost(
    short_tmp: Path, tiny_filesystem: Path
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    settings = make_settings(short_tmp)
    assert settings.state_dir == tiny_filesystem
    with capture_logs() as logs:
        async with fake, running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            filler = tiny_filesystem / "filler"
            _fill(filler)
            mark = len(run.recorder.events)
            fake.add_device(GPU, "GPU-while-full", (0,))
            await _logged(logs, lambda e: e["event"].startswith("could not commit"))
            assert run.recorder.kinds(mark) == []  # nothing emitted that is not stored
            assert not run.agent.stats.events > mark  # and the agent is still there
            filler.unlink()
            kinds = await run.recorder.kinds_after(mark, 2)
            await run.quiet_cycle()
    assert sorted(kinds) == ["capacity.changed", "device.added"]
    assert run.recorder.kinds(mark).count("device.added") == 1
    errors = [e for e in logs if e["event"].startswith("could not commit")]
    assert errors[0]["log_level"] == "error"
