"""The async client against a real grpc.aio fake kubelet on a real unix socket."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from watcher import errors
from watcher.kubelet.client import PodResourcesClient
from watcher.model.build import build
from watcher.sim.fake_kubelet import FakeKubelet


async def test_all_three_rpcs(kubelet: FakeKubelet) -> None:
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        alloc = await client.allocatable()
        pods = await client.list()
        one = await client.get("ml", "trainer-0")
    # One entry per device per NUMA node: 8 GPUs + 6 NICs + 4 topology-less devices.
    assert len(alloc.devices) == 18
    assert all(len(d.device_ids) == 1 for d in alloc.devices)
    assert len(alloc.cpu_ids) == 92
    assert {p.name for p in pods.pod_resources} >= {"trainer-0", "inference-7f9c", "claimed-gpu"}
    assert one.pod_resources.name == "trainer-0"
    assert {c.name for c in one.pod_resources.containers} == {"log-shipper", "trainer"}
    assert kubelet.calls == {"GetAllocatableResources": 1, "List": 1, "Get": 1}


async def test_raw_bytes_parse_to_the_same_inventory(kubelet: FakeKubelet) -> None:
    from watcher.kubeletapi.v1 import api_pb2

    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        raw_alloc = await client.allocatable_raw()
        raw_list = await client.list_raw()
        parsed = build(await client.allocatable(), await client.list())
    from_raw = build(
        api_pb2.AllocatableResourcesResponse.FromString(raw_alloc),
        api_pb2.ListPodResourcesResponse.FromString(raw_list),
    )
    assert isinstance(raw_alloc, bytes) and isinstance(raw_list, bytes)
    assert from_raw == parsed


async def test_socket_missing(short_tmp: Path) -> None:
    path = short_tmp / "nope.sock"
    async with PodResourcesClient(str(path)) as client:
        with pytest.raises(errors.SocketMissingError, match=r"does not exist.*DIRECTORY"):
            await client.list()


async def test_path_is_not_a_socket(short_tmp: Path) -> None:
    path = short_tmp / "kubelet.sock"
    path.write_text("a file bind-mounted by mistake")
    async with PodResourcesClient(str(path)) as client:
        with pytest.raises(errors.NotASocketError, match="not a unix socket"):
            await client.allocatable()


async def test_stale_socket_is_unavailable(kubelet: FakeKubelet) -> None:
    await kubelet.stop()  # a killed kubelet leaves its socket behind
    assert kubelet.socket_path.is_socket()
    async with PodResourcesClient(str(kubelet.socket_path), timeout=5) as client:
        with pytest.raises(errors.KubeletUnavailableError, match="not answering"):
            await client.list()


async def test_permission_denied(kubelet: FakeKubelet, short_tmp: Path) -> None:
    """A non-root process may not reach the root-owned socket."""
    if os.geteuid() != 0:
        kubelet.socket_path.chmod(0)
        async with PodResourcesClient(str(kubelet.socket_path)) as client:
            with pytest.raises(errors.SocketPermissionError, match="permission denied"):
                await client.list()
        return
    # As root nothing is denied; ask an unprivileged child, as on a node where
    # the agent forgot to run privileged.
    short_tmp.chmod(0o700)
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from watcher import errors
        from watcher.kubelet.client import PodResourcesClient
        # Drop to nobody only now: the interpreter itself lives under /root.
        os.setgid(65534)
        os.setuid(65534)
        async def main():
            async with PodResourcesClient({str(kubelet.socket_path)!r}) as c:
                try:
                    await c.list()
                except errors.SocketPermissionError as err:
                    print("denied:", err)
        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env=env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert out.decode().startswith("denied: permission denied"), (out, err)


async def test_rate_limited(kubelet: FakeKubelet) -> None:
    # Burst 10: the eleventh call inside the same instant is over the bucket.
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        results = await asyncio.gather(*(client.list_raw() for _ in range(30)), return_exceptions=True)
    rejected = [r for r in results if isinstance(r, errors.RateLimitedError)]
    assert rejected, results
    assert all(isinstance(r, bytes | errors.RateLimitedError) for r in results)
    assert "100 requests/s" in str(rejected[0])
    assert kubelet.rejected == len(rejected)


@pytest.mark.parametrize("method", ["List", "GetAllocatableResources", "Get"])
async def test_method_disabled(kubelet: FakeKubelet, method: str) -> None:
    kubelet.faults.disable(method)
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        call = {"List": client.list, "GetAllocatableResources": client.allocatable}.get(
            method, lambda: client.get("ml", "trainer-0")
        )
        with pytest.raises(errors.MethodDisabledError, match=f"{method} is disabled") as info:
            await call()
    assert info.value.method == method


@pytest.mark.parametrize("method", ["GetAllocatableResources", "Get"])
async def test_method_not_implemented(kubelet: FakeKubelet, method: str) -> None:
    kubelet.faults.make_absent(method)
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        call = client.allocatable if method == "GetAllocatableResources" else (lambda: client.get("a", "b"))
        with pytest.raises(errors.MethodNotImplementedError, match="does not implement"):
            await call()


async def test_deadline_exceeded(kubelet: FakeKubelet) -> None:
    kubelet.faults.set_delay("List", 5)
    async with PodResourcesClient(str(kubelet.socket_path), timeout=0.3) as client:
        with pytest.raises(errors.DeadlineExceededError, match=r"within 0.3 s"):
            await client.list()


async def test_response_larger_than_limit(kubelet: FakeKubelet) -> None:
    async with PodResourcesClient(str(kubelet.socket_path), max_receive_bytes=256) as client:
        with pytest.raises(errors.ResponseTooLargeError, match="256-byte receive limit"):
            await client.list()
        # The default limit takes the same response without complaint.
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        assert (await client.list()).pod_resources


async def test_get_unknown_pod(kubelet: FakeKubelet) -> None:
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        with pytest.raises(errors.PodNotFoundError, match="pod ghost in namespace default not found"):
            await client.get("default", "ghost")


async def test_reconnect_after_kubelet_restart(kubelet: FakeKubelet) -> None:
    async with PodResourcesClient(str(kubelet.socket_path), timeout=5) as client:
        await client.list()
        await kubelet.restart()
        await client.reconnect()
        assert (await client.list()).pod_resources


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="timeout"):
        PodResourcesClient("/x", timeout=0)
    with pytest.raises(ValueError, match="max_receive_bytes"):
        PodResourcesClient("/x", max_receive_bytes=0)


def test_unix_socket_helper_sanity(short_tmp: Path) -> None:
    # Guards the permission test's premise: a bound AF_UNIX path is a socket file.
    path = short_tmp / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert path.is_socket()
