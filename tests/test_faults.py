"""Kubelet faults and absurd input: a clear log line or event, and recovery when the fault clears."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
