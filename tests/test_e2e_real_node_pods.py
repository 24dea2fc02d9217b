"""Pods coming and going on a real node (upstream's kubelet, peers/cmd/kubelet), created and deleted
in the API server as users and controllers do: what the agent says for a pod deleted, force-deleted,
recreated under its name with a new uid, and refused at admission by the device manager itself
(UnexpectedAdmissionError), each exactly once; and `snapshot` showing what the API server shows."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.real_node import RealNode
from testkit.waiting import wait_until

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def _agent(short_tmp: Path, node: RealNode) -> AsyncIterator[AgentRun]:
    settings = make_settings(short_tmp, kubelet_root=node.root, node=node.name)
    async with agent_against(settings) as run:
        await run.pods_watching(timeout=30)
        await run.released()
        yield run


async def test_a_deleted_pod_is_one_allocation_removed(real_node: RealNode, short_tmp: Path) -> None:
    await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"del-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "done", {GPU: 1}))
    pod = await real_node.wait_pod(namespace, "done")
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await real_node.delete_pod(namespace, "done")
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), timeout=30)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.removed", "capacity.changed"]
        removed = run.recorder.events[mark]
        assert (removed.details["namespace"], removed.details["pod"]) == (namespace, "done")
        assert removed.details.get("pod_uid") in (None, pod["metadata"]["uid"])


async def test_a_force_deleted_pod_is_one_allocation_removed(real_node: RealNode, short_tmp: Path) -> None:
    """Gone from the API server at once; the kubelet learns it from its watch and stops the pod."""
    await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"force-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "stuck", {GPU: 1}))
    await real_node.wait_pod(namespace, "stuck")
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await real_node.delete_pod(namespace, "stuck", force=True)
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), timeout=30)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.removed", "capacity.changed"]


async def test_a_pod_name_reused_with_a_new_uid_is_one_removal_and_one_addition(
    real_node: RealNode, short_tmp: Path
) -> None:
    """A StatefulSet's way: deleted, then created again under its name at once; the new pod is
    named by its own uid and nothing it holds is called removed."""
    await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"reuse-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "db-0", {GPU: 1}))
    old = await real_node.wait_pod(namespace, "db-0")
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        await real_node.delete_pod(namespace, "db-0", force=True)
        await real_node.apply(real_node.pod(namespace, "db-0", {GPU: 1}))
        new = await real_node.wait_pod(namespace, "db-0")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        await run.recorder.until(
            lambda: {"allocation.added", "allocation.removed"} <= set(run.recorder.kinds(mark)), timeout=30
        )
        await run.quiet_cycle()
        events = run.recorder.events[mark:]
        kinds = sorted(str(e.kind) for e in events)
        assert kinds.count("allocation.added") == 1 and kinds.count("allocation.removed") == 1, kinds
        assert set(kinds) <= {"allocation.added", "allocation.removed", "capacity.changed"}, kinds
        (added,) = [e for e in events if e.kind == "allocation.added"]
        assert added.details["pod_uid"] == new["metadata"]["uid"]
        (removed,) = [e for e in events if e.kind == "allocation.removed"]
        assert removed.details.get("pod_uid") in (None, old["metadata"]["uid"])


async def test_a_pod_the_device_manager_refuses_at_admission_gets_no_allocation_event(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Both GPUs turn unhealthy at the plugin (a device gone between scheduling and admission); a
    pod asking for one is bound to the node. The kubelet's device-allocation admit handler runs
    before its resource check, so the device manager itself refuses it: phase Failed, reason
    UnexpectedAdmissionError. It never held a device: the agent says nothing of it (rejected
    pods as events are a later feature), and nothing false about the devices beyond their going."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"admit-{uuid.uuid4().hex[:6]}")
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        for device in GPUS:
            await plugin.set_healthy(device, False)
        await real_node.wait_allocatable(GPU, set())
        await real_node.apply(real_node.pod(namespace, "late", {GPU: 1}))
        pod = await real_node.wait_pod(namespace, "late", phase="Failed")
        assert pod["status"]["reason"] == "UnexpectedAdmissionError", pod["status"]
        assert "Allocate failed" in pod["status"]["message"] or GPU in pod["status"]["message"]
        await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        # The two GPUs leaving (free ones: warnings, no page), in one look or two; nothing of the pod.
        assert kinds.count("device.removed") == 2, kinds
        assert set(kinds) == {"device.removed", "capacity.changed"}, kinds
        assert all(
            e.severity.value == "warning" for e in run.recorder.events[mark:] if e.kind == "device.removed"
        )


def _snapshot(node: RealNode, output: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "watcher", "snapshot", "--socket", str(node.socket_path), "--output", output,
         "--node", node.name],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_snapshot_shows_the_pods_devices_and_health_the_api_server_shows(real_node: RealNode) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"snap-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "a", {GPU: 1}), real_node.pod(namespace, "b", {GPU: 1}))
    pods = {n: await real_node.wait_pod(namespace, n) for n in ("a", "b")}
    held = {
        n: p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["resourceID"]
        for n, p in pods.items()
    }
    await plugin.set_healthy(held["b"], False)

    async def status_says_unhealthy() -> bool:
        pod = await real_node.get("pod", "-n", namespace, "b")
        resources = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
        return bool(resources[0]["health"] == "Unhealthy")

    await wait_until(status_says_unhealthy, 15, interval=0.2, what="b's GPU Unhealthy in the API server")
    data = json.loads(await asyncio.to_thread(_snapshot, real_node, "json"))
    api_pods = {(namespace, n): p["metadata"]["uid"] for n, p in pods.items()}
    ours = {
        (p["namespace"], p["name"]): p["uid"] for p in data["pods_api"]["pods"] if p["namespace"] == namespace
    }
    assert ours == api_pods
    text = await asyncio.to_thread(_snapshot, real_node, "table")
    for name, device in held.items():
        assert f"{namespace}/{name}" in text and device in text
    unhealthy = [line for line in text.splitlines() if "Unhealthy" in line]
    assert len(unhealthy) == 1 and held["b"] in unhealthy[0] and f"{namespace}/b" in unhealthy[0], text
    html = await asyncio.to_thread(_snapshot, real_node, "html")
    assert html.lstrip().lower().startswith("<!doctype html") and held["b"] in html and "Unhealthy" in html
