"""Pods coming and going on a real node (upstream's kubelet, peers/cmd/kubelet), created and deleted
in the API server as users and controllers do: what the agent says for a pod deleted, force-deleted,
recreated under its name with a new uid, and refused at admission by the device manager itself
(UnexpectedAdmissionError: one pod.rejected; twelve, one page and the Node condition), each exactly
once; and `snapshot` showing what the API server shows."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from testkit.agent import AgentRun
from testkit.http_sinks import pd_table
from testkit.kube_testcluster import KubeTestCluster
from testkit.node_agent import agent_on_node, until_node_condition
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until
from watcher.sim.fake_node import FakeDevice, FakeNode
from watcher.sim.fake_pod_objects import admission_rejection

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
ROOT = Path(__file__).resolve().parent.parent


def _agent(short_tmp: Path, node: RealNode) -> AbstractAsyncContextManager[AgentRun]:
    return agent_on_node(short_tmp, node, {})


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


async def _no_healthy_gpu(node: RealNode) -> None:
    """Both GPUs unhealthy at the plugin before the agent's first look (a device gone between
    scheduling and admission): the agent's baseline has none, so no device event pages here."""
    plugin = await node.add_plugin(GPU, GPUS)
    for device in GPUS:
        await plugin.set_healthy(device, False)
    await node.wait_allocatable(GPU, set())


def _rejecting_agent(
    short_tmp: Path,
    node: RealNode,
    pager: PagerDutyReceiver,
    *,
    window: float = 300.0,
    kubernetes: bool = False,
) -> AbstractAsyncContextManager[AgentRun]:
    """The agent paging `pager`, rejections counted over `window` s, and (with `kubernetes`) its
    Node conditions written as its own service account, bound to its Pod on this node."""
    config = {"sinks": {"pager": pd_table(pager)}, "pods": {"rejections_window": window}}
    return agent_on_node(short_tmp, node, config, kubernetes=kubernetes)


async def _job(node: RealNode, namespace: str, name: str) -> dict[str, str]:
    """A suspended Job (no pods of its own) as the controller of the pods the test makes."""
    await node.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "registry.test/job:1"}],
                    }
                },
            },
        }
    )
    job = await node.get("job", "-n", namespace, name)
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"]}


async def test_a_pod_the_device_manager_refuses_at_admission_is_one_pod_rejected_naming_pod_and_job(
    real_node: RealNode, short_tmp: Path
) -> None:
    """A pod asking for a GPU is bound to a node whose GPUs are all unhealthy. The kubelet's
    device-allocation admit handler runs before its resource check, so the device manager itself
    refuses it: phase Failed, reason UnexpectedAdmissionError, its words, the very ones the fake
    kubelet gives (watcher.sim.fake_pod_objects.admission_rejection). One pod.rejected naming the
    pod and its Job, no page, no allocation event, and nothing again after a restart."""
    await _no_healthy_gpu(real_node)
    namespace = await real_node.namespace(f"admit-{uuid.uuid4().hex[:6]}")
    owner = await _job(real_node, namespace, "llm-pretrain")
    async with PagerDutyReceiver() as pager:
        async with _rejecting_agent(short_tmp, real_node, pager) as run:
            mark = len(run.recorder.events)
            await real_node.apply(real_node.pod(namespace, "late", {GPU: 1}, owner=owner))
            pod = await real_node.wait_pod(namespace, "late", phase="Failed")
            assert pod["status"]["reason"] == "UnexpectedAdmissionError", pod["status"]
            fake = FakeNode()
            for device in GPUS:
                fake.add_device(FakeDevice(GPU, device, healthy=False))
            assert (pod["status"]["reason"], pod["status"]["message"]) == admission_rejection(fake, GPU, 1)
            await run.recorder.until(lambda: "pod.rejected" in run.recorder.kinds(mark), timeout=30)
            await run.quiet_cycle()
            assert run.recorder.kinds(mark) == ["pod.rejected"]
            d = run.recorder.events[mark].details
            assert (d["namespace"], d["pod"], d["pod_uid"]) == (namespace, "late", pod["metadata"]["uid"])
            assert (d["owner"]["kind"], d["owner"]["name"], d["owner"]["uid"]) == (
                "Job",
                "llm-pretrain",
                owner["uid"],
            )
            assert (d["resource"], d["reason"]) == (GPU, "UnexpectedAdmissionError")
            assert d["message"] == pod["status"]["message"].removeprefix("Pod was rejected: ")
        # The agent restarts on its saved state: the pod is no news again.
        async with _rejecting_agent(short_tmp, real_node, pager) as run:
            await run.quiet_cycle()
            assert "pod.rejected" not in run.recorder.kinds()
        assert pager.events == []  # one rejection pages nobody


REJECTED = 12
WINDOW = 15.0  # seconds: the condition's False is awaited, so short


async def test_twelve_pods_refused_at_admission_are_one_page_and_a_node_condition_true_then_false(
    real_node: RealNode, reporting: KubeTestCluster, short_tmp: Path
) -> None:
    """Twelve pods of one Job bound to the node at once, each refused by the device manager:
    twelve pod.rejected, one node.rejecting_pods that pages once, ExampleGpuPodsRejected True on
    the Node (through the shipped RBAC and admission policy), and after WINDOW s with no new
    rejection one node.rejecting_pods_ended that resolves the page and sets the condition False."""
    await _no_healthy_gpu(real_node)
    namespace = await real_node.namespace(f"reject-{uuid.uuid4().hex[:6]}")
    owner = await _job(real_node, namespace, "llm-pretrain")
    async with (
        PagerDutyReceiver() as pager,
        _rejecting_agent(short_tmp, real_node, pager, window=WINDOW, kubernetes=True) as run,
    ):
        mark = len(run.recorder.events)
        pods = [real_node.pod(namespace, f"worker-{i}", {GPU: 1}, owner=owner) for i in range(REJECTED)]
        await real_node.apply(*pods)
        await run.recorder.until(
            lambda: run.recorder.kinds(mark).count("pod.rejected") == REJECTED, timeout=60
        )
        await pager.wait_for(1, timeout=15)
        trigger = pager.events[0]
        assert trigger["event_action"] == "trigger"
        assert trigger["payload"]["summary"].startswith("Job " + namespace + "/llm-pretrain")
        assert f"node keeps rejecting {GPU} pods" in trigger["payload"]["summary"]
        condition = await until_node_condition(real_node, "ExampleGpuPodsRejected", "True")
        assert condition["reason"] == "PodsRejected" and condition["message"].startswith(
            "pod-resources-watcher: "
        )
        await run.recorder.until(
            lambda: "node.rejecting_pods_ended" in run.recorder.kinds(mark), timeout=WINDOW + 45
        )
        await until_node_condition(real_node, "ExampleGpuPodsRejected", "False")
        await pager.wait_for(2, timeout=15)
        await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds.count("pod.rejected") == REJECTED and kinds.count("node.rejecting_pods") == 1, kinds
        assert kinds.count("node.rejecting_pods_ended") == 1, kinds
        assert set(kinds) == {"pod.rejected", "node.rejecting_pods", "node.rejecting_pods_ended"}, kinds
        assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
        assert pager.events[1]["dedup_key"] == trigger["dedup_key"]


async def test_pods_refused_before_a_kubelet_restart_are_not_told_again_after_it(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Four pods refused (one page); the kubelet restarts and reads its failed pods back from the
    API server after its Pods API is live again: none is told again, nothing pages again."""
    await _no_healthy_gpu(real_node)
    namespace = await real_node.namespace(f"again-{uuid.uuid4().hex[:6]}")
    owner = await _job(real_node, namespace, "llm-pretrain")
    async with PagerDutyReceiver() as pager, _rejecting_agent(short_tmp, real_node, pager) as run:
        mark = len(run.recorder.events)
        await real_node.apply(*[real_node.pod(namespace, f"w-{i}", {GPU: 1}, owner=owner) for i in range(4)])
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("pod.rejected") == 4, timeout=60)
        await pager.wait_for(1, timeout=15)
        uids = {e.details["pod_uid"] for e in run.recorder.events[mark:] if e.kind == "pod.rejected"}
        after = len(run.recorder.events)
        await real_node.restart()
        watch = run.agent.pods_watch
        assert watch is not None

        def back() -> bool:
            return watch.state == "watching" and uids <= watch.index.uids()

        await run.recorder.until(back, timeout=60)
        await run.quiet_cycle()
        kinds = run.recorder.kinds(after)
        assert not {"pod.rejected", "node.rejecting_pods"} & set(kinds), kinds
        assert [e["event_action"] for e in pager.events] == ["trigger"]


async def test_a_first_agent_started_in_a_kubelet_warm_up_tells_no_old_rejection(
    real_node: RealNode, short_tmp: Path
) -> None:
    """Four pods refused while no agent ran; the kubelet restarts and an agent that never ran
    before (no saved state) starts with it, so its first look is the kubelet's first answers. Old
    news all the same: never told, never counted, no page. (The kubelet answers "initializing"
    until its pod sources are ready, and here its first Pods API snapshot has always held the
    failed pods already; this guards the agent's side should a kubelet ever list them later.)"""
    await _no_healthy_gpu(real_node)
    namespace = await real_node.namespace(f"first-{uuid.uuid4().hex[:6]}")
    owner = await _job(real_node, namespace, "llm-pretrain")
    await real_node.apply(*[real_node.pod(namespace, f"w-{i}", {GPU: 1}, owner=owner) for i in range(4)])
    uids = {
        (await real_node.wait_pod(namespace, f"w-{i}", phase="Failed"))["metadata"]["uid"] for i in range(4)
    }
    # The kubelet stops; the agent starts as it starts again.
    await real_node.stop()
    starting = asyncio.create_task(real_node.start())
    try:
        async with PagerDutyReceiver() as pager, _rejecting_agent(short_tmp, real_node, pager) as run:
            await starting
            watch = run.agent.pods_watch
            assert watch is not None
            await run.recorder.until(lambda: uids <= watch.index.uids(), timeout=60)
            await run.quiet_cycle()
            kinds = run.recorder.kinds()
            assert not {"pod.rejected", "node.rejecting_pods"} & set(kinds), kinds
        assert pager.events == []
    finally:
        await starting  # never left running half-started, whatever failed first


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
