"""`make real-node` and `make real-node-stop` (testkit/real_node_up.py) as a person runs them:
`start` in the background comes up and says so, the Node is Ready in `kubectl get nodes`, the
agent's /readyz answers; `stop` ends it and nothing is left: no process of its process group, no
mount naming its directory, no directory. And `start --play` plays its story to the end."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.peers import peer
from testkit.real_node_up import READY_FILE, READY_LINE
from testkit.tools import tool

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
# Measured ~10 s to ready and ~20 s for a whole --play on the project's 2-core machine; the slack
# is for a machine busy with other builds.
UP_TIMEOUT_S = 150.0


def _needs() -> None:
    """Root (the kubelet's mount namespace), the peers and kubectl: a skip, as the other e2e tests."""
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (the kubelet's private mount namespace)")
    for name in (
        "kube-testcluster",
        "kube-controllers",
        "kubelet",
        "fake-cri",
        "device-plugin",
        "dra-test-driver",
    ):
        peer(name)
    tool("kubectl")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "testkit.real_node_up", *args]


@asynccontextmanager
async def _started(directory: Path, *flags: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`start` as its own process group (as a shell job is), its output piped here."""
    proc = await asyncio.create_subprocess_exec(
        *_command("start", "--dir", str(directory), "--http", "127.0.0.1:0", *flags),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:  # a failed test: never leave it running
            proc.kill()
            await proc.wait()
            await asyncio.to_thread(subprocess.run, _command("stop", "--dir", str(directory)), cwd=ROOT)


async def _until_line(proc: asyncio.subprocess.Process, wanted: str, seen: list[str]) -> None:
    assert proc.stdout is not None
    async with asyncio.timeout(UP_TIMEOUT_S):
        while line := (await proc.stdout.readline()).decode():
            seen.append(line.rstrip("\n"))
            if seen[-1] == wanted:
                return
    raise AssertionError("start ended before '" + wanted + "':\n" + "\n".join(seen[-30:]))


def _nodes(kubeconfig: str) -> list[str]:
    """`kubectl get nodes` as a person types it, as the admin, split into words."""
    command = [tool("kubectl"), "--kubeconfig", kubeconfig, "get", "nodes", "--no-headers"]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout.split()


def _get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, json.loads(answer.read())


def _group(pgid: int) -> list[int]:
    """Live processes (not zombies) whose process group is `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, NotADirectoryError):
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(300)
async def test_start_comes_up_with_a_ready_node_and_agent_and_stop_leaves_nothing() -> None:
    _needs()
    directory = Path(f"/tmp/prw-rn-{uuid.uuid4().hex[:6]}")
    seen: list[str] = []
    async with _started(directory) as proc:
        await _until_line(proc, READY_LINE, seen)
        ready = json.loads((directory / READY_FILE).read_text())
        assert ready["pid"] == proc.pid
        assert f"  export KUBECONFIG={ready['kubeconfig']}" in "\n".join(seen)

        nodes = await asyncio.to_thread(_nodes, ready["kubeconfig"])
        assert nodes[:2] == [ready["node"], "Ready"], nodes
        status, readyz = await asyncio.to_thread(_get, f"{ready['agent']}/readyz")
        assert status == 200
        assert readyz["pods_api"]["state"] == "watching"
        assert _group(proc.pid), "the peers run in start's process group"

        stop = await asyncio.to_thread(
            subprocess.run,
            _command("stop", "--dir", str(directory)),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        # stop returns once start has exited; start's own output ends with its teardown.
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.stdout is not None
        tail = (await proc.stdout.read()).decode()
        assert f"stopped; nothing left running, {directory} removed" in tail, tail
    assert _group(proc.pid) == []
    assert not directory.exists()
    assert str(directory) not in Path("/proc/self/mountinfo").read_text()


@pytest.mark.timeout(300)
async def test_play_tells_the_story_to_its_end_and_stops() -> None:
    _needs()
    directory = Path(f"/tmp/prw-rn-{uuid.uuid4().hex[:6]}")
    seen: list[str] = []
    async with _started(directory, "--play") as proc:
        await _until_line(proc, "== The story is over", seen)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert proc.stdout is not None
        seen += (await proc.stdout.read()).decode().splitlines()
    text = "\n".join(seen)
    for kind in ("allocation.added", "device.removed", "device.added", "device.unhealthy", "device.healthy"):
        assert f" {kind} " in text, kind
    assert "ExampleGpuDevicesUnavailable=True" in text and "ExampleGpuDevicesUnavailable=False" in text
    assert "GPU has fallen off the bus" in text
    assert _group(proc.pid) == []
    assert not directory.exists()


def test_start_without_root_says_it_needs_root_and_touches_nothing() -> None:
    """Not root: one line saying why root and how, exit 1, no directory made."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to run it as another user")
    directory = Path(f"/tmp/prw-rn-{uuid.uuid4().hex[:6]}")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    result = subprocess.run(
        [*as_nobody, *_command("start", "--dir", str(directory))], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.startswith("real-node: needs root: the kubelet runs in a private mount namespace")
    assert "sudo make real-node" in result.stderr
    assert not directory.exists()
