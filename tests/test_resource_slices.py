"""The node's ResourceSlice device taints, read with the kubernetes sink's credentials from a
contract-enforcing API server (shipped RBAC, strict schemas): listed for the node only, a change fires
the `resource-slices` trigger, a refusal or an outage is said once and keeps the taints last read (an
outage never heals a device), and through the whole agent a taint is one device.unhealthy story with
the Pod status's verdict."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from testkit.agent import make_settings, running_agent
from testkit.fake_api import AGENT, agent_api_server, serving, shipped_rules
from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.settings import KubernetesApiSettings
from watcher.kubelet.triggers import Trigger
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.settings import PodsSettings, ResourceSlicesSettings
from watcher.sim.apiserver import FakeApiServer
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeClaim, FakeClaimDevice, FakeContainer, FakePod
from watcher.sinks.kubernetes import KubernetesSinkSettings
from watcher.sources.resource_slices import REASON, ResourceSliceTaints
from watcher.sources.taint_rule_settings import DeviceTaintRulesSettings

NODE = "node-a"
DRIVER, POOL, DEVICE = "gpu.nvidia.com", "node-a", "gpu-3"
XID = "critical XID 79 reported by NVML"
XID_TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}


def _slice(name: str, node: str, taints: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """A driver's slice of `node`'s pool: gpu-0..gpu-3, each with the taints given for it."""
    devices = [{"name": f"gpu-{i}"} for i in range(4)]
    for d in devices:
        if taints.get(d["name"]):
            d["taints"] = taints[d["name"]]
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices,
        },
    }


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    async with serving(agent_api_server(tmp_path / "api", node=NODE), NODE) as server:
        yield server


def _reader(api: FakeApiServer, tmp: Path) -> tuple[ResourceSliceTaints, Trigger]:
    settings = KubernetesSinkSettings(
        name="k8s", kubeconfig=api.write_kubeconfig(tmp / "agent.kubeconfig", AGENT), timeout=2.0
    )
    trigger = Trigger()
    api_ = KubeApi(settings, field_manager="test")
    reader = ResourceSliceTaints(api_, node=NODE, interval=30.0, trigger=trigger, stop=asyncio.Event())
    return reader, trigger


async def _reasons(trigger: Trigger) -> frozenset[str]:
    return await trigger.wait(time.monotonic() + 0.05, 0.0)


async def test_the_nodes_taints_are_listed_and_a_change_fires_the_trigger(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put_resource_slice(_slice("node-a-gpus", NODE, {DEVICE: [XID_TAINT]}))
    api.put_resource_slice(_slice("node-b-gpus", "node-b", {DEVICE: [XID_TAINT]}))
    reader, trigger = _reader(api, tmp_path)
    try:
        assert await reader.read()
        assert reader.taints == (DeviceTaint(DRIVER, POOL, DEVICE, "gpu.nvidia.com/xid", "79", "NoExecute"),)
        assert REASON in await _reasons(trigger)
        # Asked for this node's slices only, by the field the API server selects on.
        (query,) = [r.query for r in api.requests if r.path == "/apis/resource.k8s.io/v1/resourceslices"]
        assert "fieldSelector=spec.nodeName%3Dnode-a" in query
        assert await reader.read() and REASON not in await _reasons(trigger)  # no change: no cycle
        info = {"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "None"}
        api.put_resource_slice(_slice("node-a-gpus", NODE, {DEVICE: [info]}))
        assert await reader.read() and REASON in await _reasons(trigger)
        assert reader.taints is not None and [t.fails for t in reader.taints] == [False]
        assert api.count(status=403) == 0 and not reader.stale
    finally:
        await reader.api.close()


async def test_without_the_rbac_it_says_so_once_and_knows_no_taints(tmp_path: Path) -> None:
    rules = shipped_rules(lambda r: "resourceslices" not in str(r))
    server = agent_api_server(tmp_path / "api", node=NODE, rules=rules)
    await server.start()
    reader, _ = _reader(server, tmp_path)
    try:
        with structlog.testing.capture_logs() as logs:
            assert not await reader.read()
            assert not await reader.read()
        assert server.count(status=403) == 2
        (warning,) = [e for e in logs if e["log_level"] == "warning"]
        assert "may not list resource.k8s.io resourceslices" in warning["problem"]
        assert reader.taints is None and reader.trouble == "forbidden"
    finally:
        await reader.api.close()
        await server.stop()


async def test_an_outage_keeps_the_taints_last_read(tmp_path: Path) -> None:
    server = agent_api_server(tmp_path / "api", node=NODE)
    await server.start()
    server.put_resource_slice(_slice("node-a-gpus", NODE, {DEVICE: [XID_TAINT]}))
    reader, trigger = _reader(server, tmp_path)
    try:
        assert await reader.read()
        kept = reader.taints
        assert kept
        # Not served (an API server without resource.k8s.io/v1), then gone altogether.
        server.fail_next(404, path_prefix="/apis/resource.k8s.io")
        with structlog.testing.capture_logs() as logs:
            assert not await reader.read()
            assert reader.trouble == "not-served" and reader.taints == kept and reader.stale
            await server.stop()
            assert not await reader.read()
            assert not await reader.read()
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert [w["problem"] for w in warnings] == [
            "the API server does not serve resource.k8s.io/v1 ResourceSlices",
            "the API server did not answer",
        ]
        assert reader.taints == kept and reader.stale and REASON in await _reasons(trigger)
        assert REASON not in await _reasons(trigger)  # the failures fired nothing
    finally:
        await reader.api.close()


def _dra_pod() -> FakePod:
    gpu = FakeClaimDevice(DRIVER, POOL, DEVICE, [f"nvidia.com/gpu={DEVICE}"])
    claim = FakeClaim("ml", "llm-pretrain-0-gpu", [gpu], request="gpu")
    return FakePod("ml", "llm-pretrain-0-abcde", [FakeContainer("trainer", claims=[claim])])


async def test_through_the_agent_a_taint_and_the_pod_status_are_one_story(
    api: FakeApiServer, short_tmp: Path
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    fake.node.add_pod(_dra_pod())
    kube = KubernetesSinkSettings(
        name="k8s", kubeconfig=api.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT), api_rate=50.0
    )
    base = make_settings(short_tmp)
    settings = dataclasses.replace(base, sinks=(*base.sinks, kube), pods=PodsSettings())
    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        reader, watch = run.agent.slice_taints, run.agent.pods_watch
        assert reader is not None and watch is not None
        await run.recorder.until(lambda: watch.state == "watching" and reader.taints == (), 10)
        await run.quiet_cycle()
        mark = len(run.recorder.events)

        def health(since: int) -> list[Any]:
            return [e for e in run.recorder.events[since:] if e.kind.startswith("device.")]

        api.put_resource_slice(_slice("node-a-gpus", NODE, {DEVICE: [XID_TAINT]}))
        assert await reader.read()
        await run.recorder.until(lambda: len(health(mark)) >= 1, 5)
        (failed,) = health(mark)
        assert failed.kind == "device.unhealthy" and failed.details["sources"] == ["resource-slice"]
        assert "gpu.nvidia.com/xid=79 (NoExecute)" in failed.summary
        assert failed.details["pods"][0]["name"] == "llm-pretrain-0-abcde"
        # The Pod status agrees: no second event.
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Unhealthy", XID)
        for _ in range(2):
            await run.quiet_cycle()
        assert len(health(mark)) == 1
        # The taint goes but the Pod status still says Unhealthy: still one story.
        api.put_resource_slice(_slice("node-a-gpus", NODE, {}))
        assert await reader.read()
        await run.quiet_cycle()
        assert len(health(mark)) == 1
        fake.dra.set_health(DRIVER, POOL, DEVICE, "Healthy")
        await run.recorder.until(lambda: len(health(mark)) >= 2, 5)
        await run.quiet_cycle()
        assert [e.kind for e in health(mark)] == ["device.unhealthy", "device.healthy"]
        assert health(mark)[1].details["sources"] == ["pod-status", "resource-slice"]
        ready = run.agent.status.readiness().details["resource_slices"]
        assert ready["taints"] == 0 and ready["stale"] is False and ready["problem"] is None


async def test_without_a_kubernetes_sink_a_role_that_only_lists_slices_is_enough(short_tmp: Path) -> None:
    """[kubernetes] api = "on" and no kubernetes sink: the agent reads its node's slices with a role
    that may list them and nothing else (no Event, node or pod verb), and a taint on a held device
    is a device.unhealthy; nothing else is asked of the API server."""
    rules = shipped_rules(lambda r: "resourceslices" in str(r))
    assert len(rules) == 1
    server = agent_api_server(short_tmp / "api", node=NODE, rules=rules)
    await server.start()
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    fake.node.add_pod(_dra_pod())
    kubeconfig = server.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT)
    settings = dataclasses.replace(
        make_settings(short_tmp),
        pods=PodsSettings(),
        kubernetes=KubernetesApiSettings(api="on", kubeconfig=kubeconfig, api_rate=50.0),
        resource_slices=ResourceSlicesSettings(interval=1.0),
        device_taint_rules=DeviceTaintRulesSettings(enabled=False),  # its own list: its own grant
    )
    assert not any(s.type == "kubernetes" for s in settings.sinks)
    try:
        async with fake, running_agent(settings, fake) as run:
            reader = run.agent.slice_taints
            assert reader is not None
            await run.recorder.until(lambda: reader.taints == (), 10)
            mark = len(run.recorder.events)
            server.put_resource_slice(_slice("node-a-gpus", NODE, {DEVICE: [XID_TAINT]}))
            await run.recorder.until(
                lambda: any(e.kind == "device.unhealthy" for e in run.recorder.events[mark:]), 10
            )
            (failed,) = [e for e in run.recorder.events[mark:] if e.kind.startswith("device.")]
            assert failed.details["sources"] == ["resource-slice"]
            assert run.agent.status.readiness().details["resource_slices"]["problem"] is None
        assert server.count(status=403) == 0
        paths = {r.path for r in server.requests}
        assert paths == {"/apis/resource.k8s.io/v1/resourceslices"}, paths
    finally:
        await server.stop()
