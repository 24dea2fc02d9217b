"""A device plugin's GPU failing on a real node (upstream's kubelet, peers/cmd/kubelet): the agent's
critical event naming the pod, its page, the Pod Event and the Node condition written through the
kubernetes sink to the same API server the kubelet reports to (the shipped RBAC and admission
policy in force); the heal's recovery; a flapping GPU paging once; a plugin restart paging never."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.kube_reporting import agent_identity, install_reporting
from testkit.kube_testcluster import KubeTestCluster
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until
from watcher.settings_file import parse_settings
from watcher.sinks.kubernetes import KubernetesSinkSettings

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
CONDITION = "ExampleGpuDevicesUnavailable"
PD_KEY = "R0UT1NGKEY0123456789ABCDEFGHIJKL"


@pytest.fixture(scope="module")
def reporting(kube_cluster: KubeTestCluster) -> KubeTestCluster:
    """The session's cluster with the shipped RBAC and admission policy in force."""
    asyncio.run(install_reporting(kube_cluster))
    return kube_cluster


@asynccontextmanager
async def _agent(
    short_tmp: Path,
    node: RealNode,
    pager: PagerDutyReceiver,
    *,
    kubernetes: bool = True,
    hold_down: float = 0.0,
    **watch: Any,
) -> AsyncIterator[AgentRun]:
    """The agent on the real kubelet, paging `pager` (resolves held `hold_down` s), and (with
    `kubernetes`) writing Events and its Node condition as its own service account, bound to its
    Pod on this node."""
    parsed = parse_settings(
        {
            "sinks": {
                "pager": {
                    "type": "pagerduty",
                    "routing_key": PD_KEY,
                    "endpoint": pager.url("/v2/enqueue"),
                    "resolve_hold_down": hold_down,
                }
            }
        }
    )
    sinks = list(parsed.sinks)
    if kubernetes:
        kubeconfig = await asyncio.to_thread(
            agent_identity, node.cluster, node.name, f"agent-{uuid.uuid4().hex[:6]}"
        )
        sinks.append(KubernetesSinkSettings(name="k8s", kubeconfig=kubeconfig, api_rate=50.0))
    base = make_settings(short_tmp, kubelet_root=node.root, node=node.name)
    settings = dataclasses.replace(
        base, sinks=(*base.sinks, *sinks), watch=dataclasses.replace(base.watch, **watch)
    )
    async with agent_against(settings) as run:
        await run.pods_watching(timeout=30)
        await run.released()
        yield run


async def _condition(node: RealNode) -> dict[str, Any] | None:
    seen = await node.get("node", node.name)
    found = [c for c in seen["status"].get("conditions", []) if c["type"] == CONDITION]
    return found[0] if found else None


async def _until_condition(node: RealNode, status: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def has() -> bool:
        seen["c"] = await _condition(node)
        return seen["c"] is not None and seen["c"]["status"] == status

    await wait_until(has, timeout=30, interval=0.2, what=f"{CONDITION} {status} on {node.name}")
    return seen["c"]  # type: ignore[no-any-return]


async def _pod_event_reasons(node: RealNode, namespace: str, pod: str) -> list[str]:
    events = await node.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}")
    return sorted(
        e["reason"]
        for e in events["items"]
        if e["source"].get("component") != "kubelet" and e.get("reportingComponent") != "kubelet"
    )


async def test_a_gpu_failing_at_its_plugin_is_one_page_a_pod_event_and_the_node_condition(
    reporting: KubeTestCluster, real_node: RealNode, short_tmp: Path
) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"fail-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 1}))
    pod = await real_node.wait_pod(namespace, "trainer")
    (held,) = [
        r["resourceID"]
        for s in pod["status"]["containerStatuses"]
        for a in s.get("allocatedResourcesStatus", [])
        for r in a["resources"]
    ]
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager) as run:
        await _until_condition(real_node, "False")
        mark = len(run.recorder.events)
        await plugin.set_healthy(held, False)
        await pager.wait_for(1, timeout=15)
        failed = await _until_condition(real_node, "True")
        assert held in failed["message"] and f"{namespace}/trainer" in failed["message"]
        await run.quiet_cycle()
        critical = [e for e in run.recorder.events[mark:] if e.severity.value == "critical"]
        assert len(critical) == 1, run.recorder.kinds(mark)
        assert critical[0].kind == "device.removed"  # it left allocatable: the kubelet's only word
        assert critical[0].details["allocated_to"] == [f"{namespace}/trainer/main"]
        assert [p["event_action"] for p in pager.events] == ["trigger"]

        await plugin.set_healthy(held, True)
        await _until_condition(real_node, "False")
        await pager.wait_for(2, timeout=15)
        await run.quiet_cycle()
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]
        kinds = run.recorder.kinds(mark)
    assert kinds == ["device.removed", "capacity.changed", "device.added", "capacity.changed"]
    reasons = await _pod_event_reasons(real_node, namespace, "trainer")
    assert reasons == ["DeviceFailed", "DeviceRecovered"], (reasons, kinds)


async def test_a_flapping_gpu_is_one_page(real_node: RealNode, short_tmp: Path) -> None:
    """Ten failures and heals of a held GPU at its plugin, each seen by the agent: one incident,
    resolved once the flapping ends."""
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"flap-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 2}))
    await real_node.wait_pod(namespace, "trainer")
    # Short settings standing for the defaults: a 2 s resolve hold-down for 60 s, quiet 1 s for 300 s.
    flaps: dict[str, Any] = {"flap_limit": 4, "flap_window": 60.0, "flap_quiet": 1.0, "hold_down": 2.0}
    async with (
        PagerDutyReceiver() as pager,
        _agent(short_tmp, real_node, pager, kubernetes=False, **flaps) as run,
    ):
        for n in range(1, 11):
            for healthy, kind in ((False, "device.removed"), (True, "device.added")):
                await plugin.set_healthy("gpu0", healthy)
                await run.recorder.until(lambda kind=kind, n=n: run.recorder.kinds().count(kind) >= n, 15)
        await run.recorder.until(lambda: "device.flap_ended" in run.recorder.kinds(), timeout=15)
        await pager.wait_for(lambda _: any(e["event_action"] == "resolve" for e in pager.events), timeout=15)
        await run.quiet_cycle()
        assert pager.incidents_opened() == 1, [e["event_action"] for e in pager.events]
        assert run.recorder.kinds().count("device.flapping") == 1


async def test_a_device_plugin_restart_pages_never(real_node: RealNode, short_tmp: Path) -> None:
    plugin = await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"plug-{uuid.uuid4().hex[:6]}")
    await real_node.apply(real_node.pod(namespace, "trainer", {GPU: 1}))
    await real_node.wait_pod(namespace, "trainer")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, real_node, pager, kubernetes=False) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        await plugin.stop()  # the process ends, its socket goes; the kubelet drops its devices
        await run.recorder.until(lambda: "plugin.unregistered" in run.recorder.kinds(mark), timeout=15)
        await plugin.start()
        await real_node.wait_allocatable(GPU, set(GPUS))
        await run.recorder.until(lambda: "plugin.registered" in run.recorder.kinds(mark), timeout=15)
        await run.released()
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["plugin.unregistered", "plugin.registered"]
        assert run.agent.inventory == before
        assert pager.events == []
