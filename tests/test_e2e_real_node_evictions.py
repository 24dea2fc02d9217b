"""A pod evicted for a device taint, through upstream code end to end: upstream's DRA test driver
on upstream's kubelet, a Job's pod whose claim the real scheduler allocated, the driver tainting
the device NoExecute in its ResourceSlice, and upstream's device taint eviction controller
(kube-controller-manager's, in peers/cmd/kube-controllers) evicting the pod: its DisruptionTarget
condition, its DeviceTaintManagerEviction Event, its deletion. The agent reads the condition from
the kubelet's Pods API and says it once: `pod.evicted` naming the pod, its Job, the device and the
taint; the only page is the device's own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun
from testkit.http_sinks import pd_table
from testkit.kube_controllers import KubeControllers, start_kube_controllers
from testkit.kube_testcluster import KubeTestCluster
from testkit.node_agent import agent_on_node
from testkit.real_dra import (
    add_dra_driver,
    allocated_device,
    claim_job,
    claim_of,
    job_pod,
)
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until
from watcher.model.devicehealth.affected import owner_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TAINT_KEY = "gpu.test.example.com/xid"
# The pod tolerates the taint this long (its claim's request says so), so the agent reads the
# slice's taint (every second here) while the pod still holds the device: the device's own page
# comes first, deterministically, and the eviction after it.
TOLERATION_S = 8
TOLERATION = {
    "key": TAINT_KEY,
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": TOLERATION_S,
}


@pytest.fixture
def eviction_controller(kube_cluster: KubeTestCluster, tmp_path: Path) -> Iterator[KubeControllers]:
    """Upstream's device taint eviction controller alone (no second scheduler), for this test only:
    the other tests taint devices NoExecute and count on their pods staying."""
    with start_kube_controllers(
        kube_cluster, tmp_path / "eviction", ["device-taint-eviction-controller"], scheduler=False
    ) as running:
        yield running


def _agent(
    short_tmp: Path, node: RealNode, pager: PagerDutyReceiver
) -> AbstractAsyncContextManager[AgentRun]:
    # The kubernetes sink gives the agent the API server: the ResourceSlices' taints are read.
    config = {"sinks": {"pager": pd_table(pager)}, "resource_slices": {"interval": 1.0}}
    return agent_on_node(short_tmp, node, config, kubernetes=True)


async def test_an_evicted_jobs_pod_is_one_pod_evicted_naming_job_device_and_taint_and_no_extra_page(
    reporting: KubeTestCluster,
    scheduled_node: RealNode,
    eviction_controller: KubeControllers,
    short_tmp: Path,
) -> None:
    node = scheduled_node
    dra = await add_dra_driver(node, f"t{uuid.uuid4().hex[:6]}")
    namespace = await node.namespace(f"evict-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "evicted", tolerations=[TOLERATION])
    pod = await job_pod(node, namespace, "evicted")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    claim = await claim_of(node, pod)
    device = allocated_device(claim)
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        await dra.driver.taint(device, TAINT_KEY, "79", "NoExecute")
        await pager.wait_for(1, timeout=20)  # the device's own page, while the pod tolerates
        assert run.recorder.kinds(mark) == ["device.unhealthy"]

        await run.recorder.until(lambda: "pod.evicted" in run.recorder.kinds(mark), TOLERATION_S + 40)

        async def deleted() -> bool:
            pods = await node.get("pods", "-n", namespace)
            return not any(p["metadata"]["uid"] == uid for p in pods["items"])

        await wait_until(deleted, 30, interval=0.2, what=f"{namespace}/{name} deleted by the controller")
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), 30)
        await run.quiet_cycle()
        assert sorted(run.recorder.kinds(mark)) == ["allocation.removed", "device.unhealthy", "pod.evicted"]

        (event,) = [e for e in run.recorder.events[mark:] if e.kind == "pod.evicted"]
        assert event.severity.value == "warning"
        d = event.details
        assert (d["namespace"], d["pod"], d["pod_uid"]) == (namespace, name, uid)
        assert (d["owner"]["kind"], d["owner"]["name"]) == ("Job", "evicted")
        assert (d["driver"], d["pool"], d["device_name"], d["claim"]) == (
            dra.name, dra.pool, device, claim["metadata"]["name"],
        )  # fmt: skip
        assert [(t["key"], t["value"], t["effect"]) for t in d["taints"]] == [(TAINT_KEY, "79", "NoExecute")]
        assert d["reason"] == "DeletionByDeviceTaintManager"
        assert event.summary.startswith(f"pod {namespace}/{name} evicted: its device")
        # What Slack and the Kubernetes Events put first.
        assert owner_text(event.details) == f"Job {namespace}/evicted (team research)"
        assert f"{TAINT_KEY}=79 (NoExecute)" in event.summary and device in event.summary

        # It was the real controller: its Pod Event, as kube-controller-manager's says it.
        events = await node.get(
            "events", "-n", namespace, "--field-selector", "reason=DeviceTaintManagerEviction"
        )
        assert [(e["involvedObject"]["uid"], e["message"]) for e in events["items"]] == [
            (uid, "Marking for deletion")
        ]
        # The kubernetes sink says it on the Node, the owner first, the device and the taint named.
        found: list[Any] = []

        async def node_event() -> bool:
            got = await node.get("events", "-A", "--field-selector", "reason=PodEvictedForDeviceTaint")
            found[:] = [e for e in got["items"] if e["involvedObject"]["name"] == node.name]
            return bool(found)

        await wait_until(node_event, 30, interval=0.5, what="the agent's PodEvictedForDeviceTaint Node Event")
        (note,) = [e["message"] for e in found]
        assert note.startswith(f"Job {namespace}/evicted (team research): pod {namespace}/{name} evicted")
        assert f"{TAINT_KEY}=79 (NoExecute)" in note
        # No page beyond the device's own.
        assert [p["event_action"] for p in pager.events] == ["trigger"]
        assert pager.events[0]["payload"]["class"] == "device.unhealthy"


async def test_an_eviction_at_once_still_names_the_taint_the_agent_reads_after_it(
    reporting: KubeTestCluster,
    scheduled_node: RealNode,
    eviction_controller: KubeControllers,
    short_tmp: Path,
) -> None:
    """No toleration: the controller evicts as soon as it sees the taint, often before the agent's
    next list of the slices. The eviction waits for the taint to be read (two lists at most): still
    one pod.evicted naming it. Whether the device's own story opened while the pod held it depends
    on that race; nothing but that story may page."""
    node = scheduled_node
    dra = await add_dra_driver(node, f"t{uuid.uuid4().hex[:6]}")
    namespace = await node.namespace(f"evict-{uuid.uuid4().hex[:6]}")
    await claim_job(node, dra, namespace, "evicted-now")
    pod = await job_pod(node, namespace, "evicted-now")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    device = allocated_device(await claim_of(node, pod))
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        await dra.driver.taint(device, TAINT_KEY, "79", "NoExecute")
        await run.recorder.until(lambda: "pod.evicted" in run.recorder.kinds(mark), 40)
        await run.recorder.until(lambda: "allocation.removed" in run.recorder.kinds(mark), 30)
        await run.quiet_cycle()
        kinds = run.recorder.kinds(mark)
        assert kinds.count("pod.evicted") == 1 and kinds.count("allocation.removed") == 1
        assert kinds.count("device.unhealthy") <= 1 and len(kinds) <= 3, kinds
        (event,) = [e for e in run.recorder.events[mark:] if e.kind == "pod.evicted"]
        d = event.details
        assert (d["pod"], d["pod_uid"], d["owner"]["name"], d["device_name"]) == (
            name,
            uid,
            "evicted-now",
            device,
        )
        assert [(t["key"], t["effect"]) for t in d["taints"]] == [(TAINT_KEY, "NoExecute")]
        assert all(p["payload"]["class"] == "device.unhealthy" for p in pager.events if "payload" in p)
        assert len(pager.events) == kinds.count("device.unhealthy")
