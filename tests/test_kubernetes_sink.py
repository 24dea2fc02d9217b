"""The kubernetes sink against a contract-enforcing API server, read back with the real kubectl.

The API server (watcher/sim/apiserver/, with testkit's strict schema check) validates every object
against the official OpenAPI schemas and the events.k8s.io rules, answers 401/403/404/409/422/429 as
the real one does, grants the agent's service account exactly the shipped ClusterRole
(deploy/kubernetes/reporting/rbac.yaml) and runs the shipped ValidatingAdmissionPolicy
(testkit/admission_policy.py) on every write. What the agent wrote is read back through kubectl, a client we
did not write: `kubectl get events`, `kubectl describe pod`, `kubectl describe node`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from testkit.agent import make_settings, running_agent
from testkit.fake_api import AGENT, SERVICE_ACCOUNT, agent_api_server, serving
from testkit.fake_kubelets import StartKubelet
from testkit.inventories import inventory_of
from testkit.kube_schemas import strict_schemas
from testkit.ports import free_port
from watcher.cli import main
from watcher.config import ConfigError
from watcher.kubeapi.api import KubeApi
from watcher.kubelet.triggers import Trigger
from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.affected import annotate
from watcher.model.devicehealth.pods import Owner, PodIndex, PodMeta
from watcher.model.diff import diff
from watcher.model.events import Event, envelope
from watcher.model.inventory import Inventory
from watcher.settings_file import config_warnings, parse_settings
from watcher.sim.apiserver import FakeApiServer, kubectl
from watcher.sim.demo_kubernetes import run_kubernetes_demo
from watcher.sim.fake_node import FakeContainer, FakeDevice, FakeNode, FakePod, default_node
from watcher.sim.send_test import MemoryStore
from watcher.sinks.kubernetes import KubernetesSink, KubernetesSinkSettings
from watcher.sinks.kubernetes.condition_plan import CONDITION_SUFFIX, OWNER_MARK
from watcher.sinks.kubernetes.planner import plan
from watcher.sources.device_taint_rules import DeviceTaintRules
from watcher.sources.resource_slices import ResourceSliceTaints

ROOT = Path(__file__).resolve().parent.parent
RBAC = ROOT / "deploy" / "kubernetes" / "reporting" / "rbac.yaml"
NODE = "node-a"
GPU = "nvidia.com/gpu"
CONDITION = "NvidiaGpuDevicesUnavailable"
RATE = 20  # the mass failure's API rate: 64 pods' Events take ~6.5 s at it (~26 s at the default 5)
POD = "pod-resources-watcher-x7k2p"  # the agent's, its token bound to it (testkit.fake_api)


def _agent_rules(drop: tuple[int, str] | None = None) -> list[dict[str, Any]]:
    """The shipped ClusterRole's rules, optionally without one verb of one rule."""
    import yaml

    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "ClusterRole")
    rules = [dict(r) for r in role["rules"]]
    if drop is not None:
        index, verb = drop
        rules[index] = {**rules[index], "verbs": [v for v in rules[index]["verbs"] if v != verb]}
    return rules


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    async with serving(agent_api_server(tmp_path / "api", node=NODE, pod=POD), NODE) as server:
        yield server


def _sink_settings(api: FakeApiServer, tmp: Path, **overrides: Any) -> KubernetesSinkSettings:
    return KubernetesSinkSettings(
        name="k8s",
        kubeconfig=api.write_kubeconfig(tmp / "agent.kubeconfig", AGENT),
        **{"api_rate": 50.0, **overrides},
    )


def _condition(api: FakeApiServer, ctype: str = CONDITION) -> dict[str, Any] | None:
    found = [c for c in api.node(NODE)["status"].get("conditions", []) if c["type"] == ctype]
    assert len(found) <= 1, f"condition {ctype} twice: {found}"
    return found[0] if found else None


async def _kubectl_json(api: FakeApiServer, tmp: Path, *args: str) -> Any:
    admin = api.write_kubeconfig(tmp / "admin.kubeconfig", "admin")
    rc, out, err = await kubectl(admin, *args, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


async def _describe(api: FakeApiServer, tmp: Path, *args: str) -> str:
    admin = api.write_kubeconfig(tmp / "admin.kubeconfig", "admin")
    rc, out, err = await kubectl(admin, "describe", *args)
    assert rc == 0 and not err.strip(), err
    return out


def _default_node_in(api: FakeApiServer) -> FakeNode:
    """The fake kubelet's built-in node, its pods known to the API server (so they have uids)."""
    node = default_node()
    for (ns, name), pod in sorted(node.pods.items()):
        api.add_pod(ns, name, NODE, uid=pod.uid)
    return node


def _status(api: FakeApiServer) -> str | None:
    """The status of the GPU condition on the node, None while there is none."""
    return (_condition(api) or {}).get("status")


def _held_gpu(node: FakeNode) -> tuple[str, str, str]:
    """A GPU held by a pod: (namespace, pod, gpu)."""
    for (ns, name), pod in sorted(node.pods.items()):
        for c in pod.containers:
            for gpu in c.devices.get(GPU, []):
                return ns, name, gpu
    raise AssertionError("the default node has no pod holding a GPU")


# --- the agent end to end ---


def _agent_settings(api: FakeApiServer, root: Path, **sink_overrides: Any) -> Any:
    """The test harness's agent under `root` (its kubelet at root/kubelet), plus the kubernetes sink."""
    settings = make_settings(root)
    sink = _sink_settings(api, root, **sink_overrides)
    return dataclasses.replace(settings, sinks=(*settings.sinks, sink))


def _node_writes(api: FakeApiServer) -> int:
    return api.count(method="PATCH", path_prefix=f"/api/v1/nodes/{NODE}/status", status=200)


async def test_a_gpu_failing_while_allocated_and_back_through_kubectl(
    tmp_path: Path, short_tmp: Path, api: FakeApiServer, start_kubelet: StartKubelet
) -> None:
    node = _default_node_in(api)
    ns, pod, gpu = _held_gpu(node)
    fake = await start_kubelet(node)
    async with running_agent(_agent_settings(api, short_tmp), fake) as run:
        # Reconciled at start: the node is healthy, so the condition is there and False.
        await run.recorder.until(lambda: _status(api) == "False", 15)
        fake.make_unhealthy(GPU, gpu)
        await run.recorder.until(lambda: _status(api) == "True", 15)
        failed = _condition(api)
        assert failed is not None and failed["reason"] == "DevicesFailedOrMissing"
        assert gpu in failed["message"] and f"{ns}/{pod}" in failed["message"]

        listed = await _kubectl_json(
            api, tmp_path, "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={pod}"
        )
        warnings = [e for e in listed["items"] if e["reason"] == "DeviceFailed"]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        assert gpu in warnings[0]["message"]
        assert warnings[0]["involvedObject"]["uid"] == api.pod(ns, pod)["metadata"]["uid"]
        described = await _describe(api, tmp_path, "pod", "-n", ns, pod)
        assert "DeviceFailed" in described and gpu in described
        described = await _describe(api, tmp_path, "node", NODE)
        assert CONDITION in described and "DevicesFailedOrMissing" in described
        assert "DeviceRemoved" in described  # the Node's own Event

        fake.heal(GPU, gpu)
        await run.recorder.until(lambda: _status(api) == "False", 15)
        back = _condition(api)
        assert back is not None and back["reason"] == "DevicesAvailable"
        assert back["lastTransitionTime"] >= failed["lastTransitionTime"]
        await run.recorder.until(lambda: any(e["reason"] == "DeviceRecovered" for e in api.events()), 15)
        listed = await _kubectl_json(
            api, tmp_path, "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={pod}"
        )
        normal = [e for e in listed["items"] if e["reason"] == "DeviceRecovered"]
        assert len(normal) == 1 and normal[0]["type"] == "Normal"
        described = await _describe(api, tmp_path, "node", NODE)
        assert "DevicesAvailable" in described
        # Ready, the kubelet's, was never touched.
        ready = [c for c in api.node(NODE)["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


async def test_an_agent_restart_during_a_failure_neither_duplicates_nor_clears(
    tmp_path: Path, short_tmp: Path, api: FakeApiServer, start_kubelet: StartKubelet
) -> None:
    node = _default_node_in(api)
    _, _, gpu = _held_gpu(node)
    fake = await start_kubelet(node)
    async with running_agent(_agent_settings(api, short_tmp), fake) as run:
        await run.recorder.until(lambda: _status(api) == "False", 15)
        fake.make_unhealthy(GPU, gpu)
        await run.recorder.until(lambda: _status(api) == "True", 15)
        await run.recorder.until(lambda: any(e["reason"] == "DeviceFailed" for e in api.events()), 15)
    before = _condition(api)
    events_before = len(api.events())
    writes_before = _node_writes(api)
    reads_before = api.count(method="GET", path_prefix=f"/api/v1/nodes/{NODE}/status")
    async with running_agent(_agent_settings(api, short_tmp), fake) as run:
        # The restart is reconciled (watcher.started, the first delivery): the status is read...
        await run.recorder.until(
            lambda: run.agent.metrics.value("deliveries_total", sink="k8s", result="delivered") > 0, 15
        )
        assert api.count(method="GET", path_prefix=f"/api/v1/nodes/{NODE}/status") > reads_before
        await run.quiet_cycle()
    # ...and found right: not written, not cleared, not duplicated, no new Event.
    assert _condition(api) == before
    assert _node_writes(api) == writes_before
    assert len(api.events()) == events_before
    node_seen = await _kubectl_json(api, tmp_path, "get", "node", NODE)
    ours = [c for c in node_seen["status"]["conditions"] if c["type"] == CONDITION]
    assert [(c["status"], c["lastTransitionTime"]) for c in ours] == [("True", before["lastTransitionTime"])]
    listed = await _kubectl_json(
        api, tmp_path, "get", "events", "-A", "--field-selector", "reason=DeviceFailed"
    )
    assert len(listed["items"]) == 1


async def test_a_flapping_device_healthy_at_an_agent_restart_clears_the_condition(
    tmp_path: Path, short_tmp: Path, api: FakeApiServer, start_kubelet: StartKubelet
) -> None:
    # The flap's end is an hour away (its quiet period counts again from the restart), and the
    # saved inventory already had the device: only its presence at start can clear the condition.
    node = _default_node_in(api)
    _, _, gpu = _held_gpu(node)

    def flappy() -> Any:
        s = _agent_settings(api, short_tmp)
        return dataclasses.replace(s, watch=dataclasses.replace(s.watch, flap_limit=2, flap_quiet=3600.0))

    fake = await start_kubelet(node)
    async with running_agent(flappy(), fake) as run:
        await run.recorder.until(lambda: _status(api) == "False", 15)
        for _ in range(3):
            fake.make_unhealthy(GPU, gpu)
            await run.quiet_cycle()
            fake.heal(GPU, gpu)
            await run.quiet_cycle()
        await run.recorder.until(lambda: any(e["reason"] == "DeviceFlapping" for e in api.events()), 15)
        await run.recorder.until(lambda: _status(api) == "True", 15)
    async with running_agent(flappy(), fake) as run:
        await run.recorder.until(lambda: _status(api) == "False", 15)
    node_seen = await _kubectl_json(api, tmp_path, "get", "node", NODE)
    assert [c["status"] for c in node_seen["status"]["conditions"] if c["type"] == CONDITION] == ["False"]


@pytest.mark.chaos  # long: `make chaos` runs it (CI runs both), `make test` leaves it out
async def test_a_mass_failure_of_64_gpus_is_one_event_per_pod_and_one_condition_write(
    tmp_path: Path, short_tmp: Path, api: FakeApiServer, start_kubelet: StartKubelet
) -> None:
    node = FakeNode()
    node.cpu_ids = {0, 1, 2, 3}
    for i in range(64):
        node.add_device(FakeDevice(GPU, f"GPU-{i}", (i % 2,)))
        pod = FakePod("ml", f"job-{i}", [FakeContainer("main", devices={GPU: [f"GPU-{i}"]})])
        node.add_pod(pod)
        api.add_pod("ml", f"job-{i}", NODE, uid=pod.uid)
    fake = await start_kubelet(node)
    async with running_agent(_agent_settings(api, short_tmp, api_rate=RATE), fake) as run:
        await run.recorder.until(lambda: _status(api) == "False", 15)
        writes = _node_writes(api)
        for d in fake.node.devices.values():
            d.healthy = False
        fake.write_state_files()
        await run.recorder.until(lambda: _status(api) == "True", 30)
        await run.recorder.until(
            lambda: (
                len({e["regarding"]["name"] for e in api.events() if e["reason"] == "DeviceFailed"}) == 64
            ),
            30,
        )
        await run.quiet_cycle()
    pod_events = [e for e in api.events() if e["regarding"]["kind"] == "Pod"]
    assert len(pod_events) == 64  # one per pod, none per device beyond it
    listed = await _kubectl_json(api, tmp_path, "get", "events", "-n", "ml")
    assert sorted(e["involvedObject"]["name"] for e in listed["items"]) == sorted(
        f"job-{i}" for i in range(64)
    )
    assert {(e["type"], e["reason"]) for e in listed["items"]} == {("Warning", "DeviceFailed")}
    assert _node_writes(api) == writes + 1
    node_events = sorted(e["reason"] for e in api.events() if e["regarding"]["kind"] == "Node")
    assert node_events == ["DeviceIncident"]  # the 64 are named once, by the incident
    assert "64 nvidia.com/gpu device(s)" in (_condition(api) or {})["message"]
    # Bounded load: never more than api_rate requests in any one second at the API server.
    arrivals = [r.at for r in api.requests if r.user == SERVICE_ACCOUNT]
    assert len(arrivals) > 2 * RATE  # enough to be bounded by the rate at all
    busiest = max(sum(1 for b in arrivals if a <= b < a + 1.0) for a in arrivals)
    assert busiest <= RATE


# --- the sink alone, on the API server's hard answers ---


GPUS = [f"GPU-{i}" for i in range(4)]
PODS = {"ml/trainer-0": ["GPU-0"], "ml/trainer-1": ["GPU-1"]}
_seq = 0


def _batch(before: Inventory, after: Inventory, pods: PodIndex | None = None) -> list[Event]:
    """The events of one re-query; with `pods`, annotated as the Pods API knows them."""
    global _seq
    out = []
    changes = diff(before, after)
    for change in annotate(changes, pods) if pods is not None else changes:
        _seq += 1
        out.append(envelope(change, seq=_seq, node=NODE, cycle=f"c{_seq}", before=None, after=None))
    return out


HEALTHY = inventory_of(GPUS, PODS)
FAILED = inventory_of(GPUS[1:], PODS)  # GPU-0, held by trainer-0, failed


async def _sink(api: FakeApiServer, tmp: Path, **overrides: Any) -> KubernetesSink:
    for key in PODS:
        ns, name = key.split("/")
        if not _has_pod(api, ns, name):
            api.add_pod(ns, name, NODE)
    return KubernetesSink(_sink_settings(api, tmp, **overrides), node=NODE, store=MemoryStore())


def _has_pod(api: FakeApiServer, namespace: str, name: str) -> bool:
    try:
        api.pod(namespace, name)
    except KeyError:
        return False
    return True


async def test_429_is_retried_after_its_retry_after_without_doubling_events(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    try:
        batch = _batch(HEALTHY, FAILED)
        # The condition and the Node's Event go out, then the API server sheds load at the pod's.
        api.fail_next(429, retry_after=7, method="POST", path_prefix="/apis/events.k8s.io/v1/namespaces/ml")
        outcome = await sink.deliver(batch)
        assert outcome.retry and outcome.retry_after == 7 and outcome.status == 429
        assert [e["reason"] for e in api.events()] == ["DeviceRemoved"]
        outcome = await sink.deliver(batch)  # the worker's retry: same batch, resumed
        assert outcome.delivered, outcome.error
        reasons = sorted(e["reason"] for e in api.events())
        assert reasons == ["DeviceFailed", "DeviceRemoved"]  # each once
        # A 5xx at the Node's Event: retried, resumed, nothing written twice.
        again = _batch(FAILED, HEALTHY)
        api.fail_next(500, method="POST", path_prefix="/apis/events.k8s.io/v1/namespaces/default")
        assert (await sink.deliver(again)).retry
        assert (await sink.deliver(again)).delivered
        assert sorted(e["reason"] for e in api.events()).count("DeviceRecovered") == 1
    finally:
        await sink.close()


async def test_an_event_refused_for_good_is_skipped_never_blocking_the_rest(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    try:
        api.fail_next(422, method="POST", path_prefix="/apis/events.k8s.io/v1/namespaces/ml")
        outcome = await sink.deliver(_batch(HEALTHY, FAILED))
        assert outcome.delivered, outcome.error  # not retried for ever, not dead-lettered
        assert [e["reason"] for e in api.events()] == ["DeviceRemoved"]  # the Node's still went out
        assert _status(api) == "True"
    finally:
        await sink.close()


async def test_a_pod_of_the_same_name_elsewhere_is_not_blamed(tmp_path: Path, api: FakeApiServer) -> None:
    # trainer-0 was deleted and recreated on another node before the batch could be delivered.
    api.add_node("node-b")
    api.add_pod("ml", "trainer-0", "node-b")
    sink = await _sink(api, tmp_path)
    try:
        assert (await sink.deliver(_batch(HEALTHY, FAILED))).delivered
        assert [e["reason"] for e in api.events()] == ["DeviceRemoved"]  # the Node's; no pod blamed
        assert _status(api) == "True"
    finally:
        await sink.close()


async def test_an_event_is_dated_when_it_happened_not_when_delivered(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    try:
        batch = _batch(HEALTHY, FAILED)
        assert (await sink.deliver(batch)).delivered
        seen = batch[-1].time.replace("Z", "")  # milliseconds, the event's own time
        assert {e["eventTime"][: len(seen)] for e in api.events()} == {seen}
    finally:
        await sink.close()


async def test_a_redelivered_or_replayed_batch_is_not_applied_again(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    try:
        failed = _batch(HEALTHY, FAILED)
        back = _batch(FAILED, HEALTHY)
        assert (await sink.deliver(failed)).delivered
        assert (await sink.deliver(failed)).delivered  # redelivered after a lost ack
        assert all("series" not in e for e in api.events())  # not counted twice
        assert (await sink.deliver(back)).delivered
        writes = _node_writes(api)
        assert (await sink.deliver(failed)).delivered  # an old dead letter put back
        assert _status(api) == "False" and _node_writes(api) == writes
        assert [e["reason"] for e in api.events()].count("DeviceFailed") == 1
    finally:
        await sink.close()


async def test_a_refused_batch_leaves_the_state_as_the_node_says(tmp_path: Path) -> None:
    # Events may not be created (RBAC): the batch is refused for good after its condition was
    # written. The saved state must still say GPU-0 is missing, or a later change of another device
    # would clear the condition while GPU-0 is still failed.
    rules = _agent_rules(drop=(0, "create"))
    server = agent_api_server(tmp_path / "api", node=NODE, rules=rules, pod=POD)
    await server.start()
    server.add_node(NODE)
    try:
        sink = await _sink(server, tmp_path)
        try:
            outcome = await sink.deliver(_batch(HEALTHY, FAILED))
            assert not outcome.delivered and not outcome.retry and outcome.status == 403
            assert _status(server) == "True"
            blink = [g for g in GPUS if g != "GPU-3"]
            assert (
                await sink.deliver(_batch(FAILED, inventory_of([g for g in blink if g != "GPU-0"], PODS)))
            ).status
            assert (
                await sink.deliver(_batch(inventory_of([g for g in blink if g != "GPU-0"], PODS), FAILED))
            ).status
            assert _status(server) == "True"
            assert "GPU-0" in (_condition(server) or {})["message"]
        finally:
            await sink.close()
    finally:
        await server.stop()


async def test_409_on_the_node_is_reread_and_reapplied(tmp_path: Path, api: FakeApiServer) -> None:
    sink = await _sink(api, tmp_path)
    try:
        api.fail_next(409, method="PATCH", path_prefix=f"/api/v1/nodes/{NODE}/status")
        outcome = await sink.deliver(_batch(HEALTHY, FAILED))
        assert outcome.delivered, outcome.error
        assert api.count(method="PATCH", path_prefix=f"/api/v1/nodes/{NODE}/status", status=409) == 1
        assert _status(api) == "True"
    finally:
        await sink.close()


async def test_a_real_conflict_another_writer_between_read_and_write(
    tmp_path: Path, api: FakeApiServer
) -> None:
    # Another writer changes the node right after each of our next two reads of it: our patch
    # carries the resourceVersion it read, so the server answers 409 and we read again.
    sink = await _sink(api, tmp_path)
    try:
        assert (await sink.deliver(_batch(FAILED, HEALTHY))).delivered  # the node's uid is known now
        api.conflict_after_reads(NODE, 2)
        outcome = await sink.deliver(_batch(HEALTHY, FAILED))
        assert outcome.delivered, outcome.error
        assert api.count(method="PATCH", path_prefix=f"/api/v1/nodes/{NODE}/status", status=409) == 2
        assert _status(api) == "True"
        # Given up after CONFLICT_RETRIES writes in a row: retried later, never taken as written.
        api.conflict_after_reads(NODE, 10)
        outcome = await sink.deliver(_batch(FAILED, HEALTHY))
        assert outcome.retry and outcome.status == 409 and not outcome.delivered
        assert _status(api) == "True"
    finally:
        await sink.close()


async def test_a_rotated_service_account_token_is_reread(tmp_path: Path, api: FakeApiServer) -> None:
    account = api.write_service_account_dir(tmp_path / "sa", AGENT)
    settings = KubernetesSinkSettings(name="k8s", service_account_dir=account, server=api.url)
    for key in PODS:
        api.add_pod("ml", key.split("/")[1], NODE)
    sink = KubernetesSink(settings, node=NODE, store=MemoryStore())
    try:
        assert (await sink.deliver(_batch(HEALTHY, FAILED))).delivered
        api.rotate_token(AGENT)  # the old token stops working now; the file has the new one
        outcome = await sink.deliver(_batch(FAILED, HEALTHY))
        assert outcome.delivered, outcome.error
        assert api.count(status=401) >= 1  # the old one was refused, then the file re-read
        assert _status(api) == "False"
    finally:
        await sink.close()


async def test_a_repeat_updates_the_series_instead_of_a_new_event(tmp_path: Path, api: FakeApiServer) -> None:
    sink = await _sink(api, tmp_path)
    try:
        for _ in range(3):
            assert (await sink.deliver(_batch(HEALTHY, FAILED))).delivered
            assert (await sink.deliver(_batch(FAILED, HEALTHY))).delivered
        failed = [e for e in api.events() if e["reason"] == "DeviceFailed"]
        assert len(failed) == 1 and failed[0]["series"]["count"] == 3
        listed = await _kubectl_json(
            api, tmp_path, "get", "events", "-n", "ml", "--field-selector", "involvedObject.name=trainer-0"
        )
        counts = {e["reason"]: (e.get("series") or {}).get("count", 1) for e in listed["items"]}
        assert counts == {"DeviceFailed": 3, "DeviceRecovered": 3}
    finally:
        await sink.close()


async def test_cleanup_removes_only_the_agents_conditions(tmp_path: Path, api: FakeApiServer) -> None:
    sink = await _sink(api, tmp_path)
    try:
        assert (await sink.deliver(_batch(HEALTHY, FAILED))).delivered
    finally:
        await sink.close()
    assert _condition(api) is not None
    config = tmp_path / "config.toml"
    config.write_text(
        f'node = "{NODE}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[sinks.k8s]\ntype = "kubernetes"\nkubeconfig = "{tmp_path / "agent.kubeconfig"}"\n'
    )
    assert await _cli("kubernetes", "cleanup", "--config", str(config)) == (
        0,
        f"node {NODE}: removed {CONDITION}",
    )
    types = [c["type"] for c in api.node(NODE)["status"]["conditions"]]
    assert not [t for t in types if t.endswith(CONDITION_SUFFIX)] and "Ready" in types
    described = await _describe(api, tmp_path, "node", NODE)
    assert CONDITION not in described and "Ready" in described
    # Nothing left: still fine. And as an admin, for every node at once.
    assert await _cli("kubernetes", "cleanup", "--config", str(config)) == (
        0,
        f"node {NODE}: none of this agent's conditions",
    )
    admin = api.write_kubeconfig(tmp_path / "admin.kubeconfig", "admin")
    assert (await _cli("kubernetes", "cleanup", "--kubeconfig", str(admin), "--all-nodes"))[0] == 0
    # The agent's token may not list nodes: a clear refusal, exit 1.
    agent = tmp_path / "agent.kubeconfig"
    rc, out = await _cli("kubernetes", "cleanup", "--kubeconfig", str(agent), "--all-nodes")
    assert rc == 1 and "forbidden" in out and "list" in out


# Another controller's conditions named like ours: a NIC operator's, and one of exactly the type the
# agent derives for nvidia.com/gpu (a GPU operator's). Neither carries the agent's mark.
THEIRS = [
    {"type": "VendorNicDevicesUnavailable", "status": "True", "reason": "NicDown", "message": "2 NICs down"},
    {"type": CONDITION, "status": "True", "reason": "GpuOperatorSaysSo", "message": "GPU-9 is down"},
]


def _theirs(api: FakeApiServer) -> list[tuple[str, str, str, str]]:
    return sorted(
        (c["type"], c["status"], c["reason"], c["message"])
        for c in api.node(NODE)["status"]["conditions"]
        if c["type"] in {t["type"] for t in THEIRS}
    )


async def test_another_writers_conditions_of_our_suffix_are_never_touched(
    tmp_path: Path, short_tmp: Path, api: FakeApiServer, start_kubelet: StartKubelet
) -> None:
    admin = api.write_kubeconfig(tmp_path / "admin.kubeconfig", "admin")
    body = json.dumps({"status": {"conditions": THEIRS}})
    rc, _, err = await kubectl(
        admin, "patch", "node", NODE, "--subresource=status", "--type=strategic", "-p", body
    )
    assert rc == 0, err
    before = _theirs(api)
    assert len(before) == 2
    node = _default_node_in(api)
    _, _, gpu = _held_gpu(node)
    fake = await start_kubelet(node)
    async with running_agent(_agent_settings(api, short_tmp), fake) as run:
        # The start's reconcile (which prunes what is ours and no longer wanted) and a failure.
        await run.recorder.until(
            lambda: run.agent.metrics.value("deliveries_total", sink="k8s", result="delivered") > 0, 15
        )
        fake.make_unhealthy(GPU, gpu)
        await run.recorder.until(lambda: any(e["reason"] == "DeviceFailed" for e in api.events()), 15)
        fake.heal(GPU, gpu)
        await run.recorder.until(lambda: any(e["reason"] == "DeviceRecovered" for e in api.events()), 15)
        await run.quiet_cycle()
    assert _theirs(api) == before  # neither removed nor rewritten, True as their writer left it
    # The uninstall step, as an admin for every node: it removes only what it can prove is ours
    # (the agent's conditions of the node's other resources), theirs stay.
    rc, out = await _cli("kubernetes", "cleanup", "--kubeconfig", str(admin), "--all-nodes")
    assert rc == 0 and out.startswith(f"node {NODE}: removed ") and "SmarterDevicesFuse" in out, out
    assert CONDITION not in out and "VendorNic" not in out
    assert _theirs(api) == before
    assert not [c for c in api.node(NODE)["status"]["conditions"] if c["message"].startswith(OWNER_MARK)]


async def _cli(*args: str) -> tuple[int, str]:
    """The command line in its own process (the API server answers on this test's loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "watcher", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, (out.decode() + err.decode()).strip()


# --- the client configuration ---


def _kubeconfig(server: str = "https://127.0.0.1:6443", cluster: str = "", user: str = "token: abc") -> str:
    cluster = cluster or f"server: {server}"
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters:\n- name: c\n  cluster: {{{cluster}}}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
        f"users:\n- name: u\n  user: {{{user}}}\n"
    )


BROKEN_KUBECONFIGS = {
    "not-yaml": ("clusters: [valid\n", r"not YAML \(line 2, column 1\)"),
    "empty": ("", r"not a kubeconfig"),
    "a-list": ("- 1\n", r"not a kubeconfig"),
    "clusters-not-a-list": ("clusters: 5\n", r"not a kubeconfig"),
    "no-contexts": ("clusters: []\n", r"not a valid kubeconfig: missing 'contexts'"),
    "wrong-type": (
        _kubeconfig(user="token: 5"),
        r"not a valid kubeconfig: Expected `str \| null`, got `int`",
    ),
    "undefined-cluster": (_kubeconfig().replace("{cluster: c,", "{cluster: nope,"), r"names 'nope'"),
    "unknown-context": (_kubeconfig().replace("current-context: x", "current-context: y"), r"'y' not found"),
    "missing-ca": (
        _kubeconfig(cluster="server: 'https://127.0.0.1:6443', certificate-authority: missing/ca.crt"),
        r"certificate-authority \S*/missing/ca\.crt: no such file",
    ),
    "missing-token-file": (
        _kubeconfig(user="tokenFile: /nonexistent/token"),
        r"tokenFile /nonexistent/token",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_KUBECONFIGS))
def test_a_broken_kubeconfig_is_one_line_naming_the_file(
    tmp_path: Path, case: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """`kubernetes cleanup` and `check-config` on a kubeconfig that cannot be used: one line that
    names the file and what is wrong with it, never a traceback, and no request sent. In this
    process (no server is asked): the real process's one line is test_a_missing_kubeconfig_is_named's."""
    text, problem = BROKEN_KUBECONFIGS[case]
    kubeconfig = tmp_path / "kube.yaml"
    kubeconfig.write_text(text)
    rc = main(["kubernetes", "cleanup", "--kubeconfig", str(kubeconfig), "--node", NODE])
    captured = capfd.readouterr()
    out = (captured.out + captured.err).strip()
    assert rc == 1 and len(out.splitlines()) == 1, out
    assert f"kubeconfig {kubeconfig}" in out and re.search(problem, out), out
    with pytest.raises(
        ConfigError, match=rf"^sinks\.k\.kubeconfig: kubeconfig {re.escape(str(kubeconfig))}: "
    ):
        parse_settings({"sinks": {"k": {"type": "kubernetes", "kubeconfig": str(kubeconfig)}}})


async def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kube.yaml"
    rc, out = await _cli("kubernetes", "cleanup", "--kubeconfig", str(missing), "--node", NODE)
    assert (rc, out) == (
        1,
        f"pod-resources-watcher: error: cannot read kubeconfig {missing}: No such file or directory",
    )
    config = tmp_path / "config.toml"
    config.write_text(f'node = "{NODE}"\n[sinks.k8s]\ntype = "kubernetes"\nkubeconfig = "{missing}"\n')
    rc, out = await _cli("check-config", str(config))
    assert rc == 2 and f"sinks.k8s.kubeconfig: cannot read kubeconfig {missing}" in out, out


async def test_a_token_is_never_sent_in_clear_text_off_loopback(tmp_path: Path) -> None:
    """Refused before any connection (the host, .invalid, could not even be resolved): the token, a
    password or an exec plugin's token would cross the network readable."""
    for user in ("token: abc", "tokenFile: token", "username: u, password: p"):
        (tmp_path / "token").write_text("abc")
        kubeconfig = tmp_path / "kube.yaml"
        kubeconfig.write_text(_kubeconfig("http://api.example.invalid:8080", user=user))
        rc, out = await _cli("kubernetes", "cleanup", "--kubeconfig", str(kubeconfig), "--node", NODE)
        assert (
            rc == 1 and "refusing to send the bearer token in clear text to http://api.example.invalid" in out
        )
        with pytest.raises(
            ConfigError, match=r"kubeconfig: .* refusing to send the bearer token in clear text"
        ):
            parse_settings({"sinks": {"k": {"type": "kubernetes", "kubeconfig": str(kubeconfig)}}})
    # In a pod, the service account's token always goes along: an http:// server is refused too.
    with pytest.raises(ConfigError, match=r"sinks\.k\.server: server: refusing to send the bearer token"):
        parse_settings(
            {"sinks": {"k": {"type": "kubernetes", "server": "http://kubernetes.default.invalid"}}}
        )
    # Loopback (a tunnel, kubectl proxy) and https are fine, and so is http without credentials.
    for server, user in [("http://127.0.0.1:8001", "token: abc"), ("http://api.example.invalid", "")]:
        kubeconfig.write_text(_kubeconfig(server, user=user))
        parse_settings({"sinks": {"k": {"type": "kubernetes", "kubeconfig": str(kubeconfig)}}})


async def test_a_token_sent_in_clear_text_on_loopback_is_warned_about_once(
    tmp_path: Path, short_tmp: Path, capfd: pytest.CaptureFixture[str], start_kubelet: StartKubelet
) -> None:
    """Loopback http:// goes (a tunnel, kubectl proxy), but not without a word: the agent logs one
    warning at start naming the key, the server and what to do; check-config and `kubernetes
    cleanup` print it before any connection. https://, and http:// without credentials, say nothing."""
    server = f"http://127.0.0.1:{free_port()}"  # nobody answers: the warning needs no connection
    kubeconfig = tmp_path / "kube.yaml"
    kubeconfig.write_text(_kubeconfig(server, user="token: kube-token-4f1d"))
    settings = make_settings(short_tmp, pods_api=False)  # the API server's side is all this is about
    sink = KubernetesSinkSettings(name="k8s", kubeconfig=kubeconfig)
    settings = dataclasses.replace(settings, sinks=(*settings.sinks, sink))
    fake = await start_kubelet(default_node())
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
    warned = [e for e in logs if e["log_level"] == "warning" and server in str(e.get("problem"))]
    assert len(warned) == 1, warned
    assert warned[0]["event"] == "a secret is less private than it should be"
    said = warned[0]["problem"]
    assert said.startswith(
        f"sinks.k8s.kubeconfig: kubeconfig {kubeconfig}: the bearer token travels in clear text"
    )
    assert "use the API server's https:// URL" in said and "kube-token-4f1d" not in said

    config = tmp_path / "config.toml"
    config.write_text(f'node = "{NODE}"\n[sinks.k8s]\ntype = "kubernetes"\nkubeconfig = "{kubeconfig}"\n')
    assert main(["check-config", str(config)]) == 0
    assert f"WARNING: {said}" in capfd.readouterr().err
    rc, out = await _cli("kubernetes", "cleanup", "--kubeconfig", str(kubeconfig), "--node", NODE)
    # No config key there: the kubeconfig is named by itself. Then the unreachable port, as ever.
    plain = said.removeprefix("sinks.k8s.kubeconfig: ")
    assert rc == 1 and out.startswith(f"pod-resources-watcher: WARNING: {plain}\n"), out

    for quiet in (_kubeconfig("https://127.0.0.1:6443"), _kubeconfig(server, user="")):
        kubeconfig.write_text(quiet)
        data = {"sinks": {"k8s": {"type": "kubernetes", "kubeconfig": str(kubeconfig)}}}
        assert config_warnings(parse_settings(data)) == []


# --- least privilege ---


def _role_verbs() -> list[tuple[int, str]]:
    return [(i, v) for i, rule in enumerate(_agent_rules()) for v in rule["verbs"]]


async def _story(api: FakeApiServer, tmp: Path) -> list[bool]:
    """The agent's whole repertoire with the sink's credentials: a pod Event, a Node Event, a
    condition, a repeat (series), the list of the node's ResourceSlices (their device taints) and
    the list of the DeviceTaintRules."""
    sink = await _sink(api, tmp)
    outcomes = []
    try:
        for before, after in [(HEALTHY, FAILED), (FAILED, HEALTHY), (HEALTHY, FAILED)]:
            outcomes.append((await sink.deliver(_batch(before, after))).delivered)
    finally:
        await sink.close()
    kube_api = KubeApi(_sink_settings(api, tmp), field_manager="test")
    slices = ResourceSliceTaints(kube_api, node=NODE, interval=30.0, trigger=Trigger(), stop=asyncio.Event())
    rules = DeviceTaintRules(kube_api, interval=30.0, trigger=Trigger(), stop=asyncio.Event())
    try:
        outcomes.append(await slices.read())
        outcomes.append(await rules.read())
    finally:
        await kube_api.close()
    return outcomes


@pytest.mark.parametrize("drop", _role_verbs(), ids=lambda d: f"rule{d[0]}-{d[1]}")
async def test_every_verb_of_the_cluster_role_is_needed(tmp_path: Path, drop: tuple[int, str]) -> None:
    server = agent_api_server(tmp_path / "api", node=NODE, rules=_agent_rules(drop), pod=POD)
    await server.start()
    server.add_node(NODE)
    try:
        outcomes = await _story(server, tmp_path)
        refused = server.count(status=403)
        assert refused > 0, f"dropping {drop} changed nothing: the verb is not needed"
        # A refusal is seen and said, never silently taken as success for the condition or events.
        pod_uids = [e["regarding"].get("uid") for e in server.events() if e["regarding"]["kind"] == "Pod"]
        assert not all(outcomes) or not all(pod_uids) or not server.events()
    finally:
        await server.stop()


async def test_the_shipped_role_is_enough(tmp_path: Path, api: FakeApiServer) -> None:
    assert await _story(api, tmp_path) == [True, True, True, True, True]
    assert api.count(status=403) == 0


async def test_the_agent_cannot_write_another_nodes_status(tmp_path: Path, api: FakeApiServer) -> None:
    api.add_node("node-b")
    agent_config = api.write_kubeconfig(tmp_path / "agent.kubeconfig", AGENT)
    patch = json.dumps(
        {
            "status": {
                "conditions": [
                    {"type": CONDITION, "status": "True", "reason": "X", "message": OWNER_MARK + "x"}
                ]
            }
        }
    )
    rc, _, err = await kubectl(
        agent_config, "patch", "node", "node-b", "--subresource=status", "--type=strategic", "-p", patch
    )
    assert rc != 0 and "node-b" in err
    ready = json.dumps(
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "X", "message": "x"}]}}
    )
    rc, _, err = await kubectl(
        agent_config, "patch", "node", NODE, "--subresource=status", "--type=strategic", "-p", ready
    )
    assert rc != 0
    rc, _out, err = await kubectl(
        agent_config, "patch", "node", NODE, "--subresource=status", "--type=strategic", "-p", patch
    )
    assert rc == 0, err


@pytest.mark.slow  # the demo in this process: its fake API server and kubelet
async def test_the_kubernetes_demo_shows_the_pod_event_and_the_condition() -> None:
    out = io.StringIO()
    assert await run_kubernetes_demo(out=out, schema=strict_schemas()) == 0
    text = out.getvalue()
    failed, healed = text.split("fails while allocated")[1].split(" heals")
    # After the failure: the pod's Warning and the node's condition True, as kubectl shows them.
    assert "Warning  DeviceFailed" in failed
    assert any(line.split()[:2] == [CONDITION, "True"] for line in failed.splitlines() if CONDITION in line)
    # After healing: the Normal Event and the condition False.
    assert "Normal   DeviceRecovered" in healed
    assert any(line.split()[:2] == [CONDITION, "False"] for line in healed.splitlines() if CONDITION in line)
    assert "(0 refused)" in text


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"kinds": ["device.removed", "device.added"]}, r"kinds: must let watcher\.started through"),
        (
            {"kinds": ["watcher.started", "device.removed", "device.added"]},
            r"kinds: must let device\.flapping through",
        ),
        ({"resources": ["nvidia.com/*"]}, r'resources: must stay \["\*"\]'),
        ({"min_severity": "warning"}, r'min_severity: must stay "info"'),
        ({"condition_types": {GPU: "GpuBroken"}}, r"condition_types\.nvidia\.com/gpu: must end in"),
        ({"condition_types": {GPU: "Ready"}}, r"must end in 'DevicesUnavailable'"),
        ({"event_namespace": "ml"}, r'event_namespace: .* only in "default" or "kube-system"'),
        ({"reporting_controller": "Pod Resources!"}, r"reporting_controller: not a qualified name"),
        ({"kubeconfig": "/k", "server": "https://x"}, r"server: only for in-cluster use"),
        (
            {"condition_types": {GPU: "GpuDevicesUnavailable", "nvidia.io/gpu": "GpuDevicesUnavailable"}},
            r"condition_types\.nvidia\.io/gpu: GpuDevicesUnavailable is nvidia\.com/gpu's condition type too",
        ),
    ],
)
def test_check_config_refuses_what_would_break_the_conditions(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_settings({"sinks": {"k": {"type": "kubernetes", **table}}})


# --- who is hit: the uid from the Pods API, the owner first ---


def _pod_reads(api: FakeApiServer) -> int:
    return api.count(method="GET", path_prefix="/api/v1/namespaces/ml/pods")


async def test_a_pods_api_uid_saves_the_read_and_the_owner_comes_first(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    uid = api.pod("ml", "trainer-0")["metadata"]["uid"]
    owner = Owner("Job", "trainer", "uid-job")
    pods = PodIndex([PodMeta(uid, "ml", "trainer-0", owner=owner, labels=(("team", "research"),))])
    try:
        assert (await sink.deliver(_batch(HEALTHY, FAILED, pods))).delivered
        assert _pod_reads(api) == 0
        (failed,) = [e for e in api.events() if e["reason"] == "DeviceFailed"]
        assert failed["regarding"]["uid"] == uid
        assert failed["note"].startswith("Job ml/trainer (team research): 1 device(s) allocated to this pod")
        (removed,) = [e for e in api.events() if e["reason"] == "DeviceRemoved"]
        assert removed["note"].startswith("Job ml/trainer (team research): 1 nvidia.com/gpu device(s) left")
        described = await _describe(api, tmp_path, "pod", "-n", "ml", "trainer-0")
        assert "DeviceFailed" in described and "Job ml/trainer" in described  # matched by that uid
    finally:
        await sink.close()


async def test_without_a_uid_the_pod_is_read_and_the_notes_are_as_they_were(
    tmp_path: Path, api: FakeApiServer
) -> None:
    sink = await _sink(api, tmp_path)
    try:
        assert (await sink.deliver(_batch(HEALTHY, FAILED))).delivered
        assert _pod_reads(api) == 1  # as ever: the uid read from the pod
        (failed,) = [e for e in api.events() if e["reason"] == "DeviceFailed"]
        assert failed["regarding"]["uid"] == api.pod("ml", "trainer-0")["metadata"]["uid"]
        assert failed["note"].startswith("1 device(s) allocated to this pod left")
        (removed,) = [e for e in api.events() if e["reason"] == "DeviceRemoved"]
        assert removed["note"].startswith("1 nvidia.com/gpu device(s) left")
    finally:
        await sink.close()


def test_a_pod_without_an_owner_gets_its_uid_and_the_same_notes() -> None:
    bare = PodIndex([PodMeta("uid-t0", "ml", "trainer-0")])
    plain, known = plan(_batch(HEALTHY, FAILED), {}), plan(_batch(HEALTHY, FAILED, bare), {})
    assert [(e.reason, e.note, e.key) for e in known.events] == [
        (e.reason, e.note, e.key) for e in plain.events
    ]
    uids = {e.reason: e.regarding.uid for e in known.events}
    assert uids == {"DeviceRemoved": "", "DeviceFailed": "uid-t0"}
    assert {e.regarding.uid for e in plain.events} == {""}


def test_a_flapping_device_names_its_owner_first_on_the_pod_and_the_node() -> None:
    owner = Owner("StatefulSet", "trainer", "uid-sts")
    pods = PodIndex([PodMeta("uid-t0", "ml", "trainer-0", owner=owner, labels=(("team", "research"),))])
    summary = "nvidia.com/gpu GPU-0 is flapping: 5 changes in 600 s"
    details = {"resource": GPU, "device": "GPU-0", "count": 5, "allocated_to": ["ml/trainer-0/main"]}
    (change,) = annotate([Change(Kind.DEVICE_FLAPPING, Severity.CRITICAL, summary, details)], pods)
    event = envelope(change, seq=1, node=NODE, cycle="c1", before=None, after=None)
    notes = {(e.regarding.kind, e.reason): e for e in plan([event], {}).events}
    node_event = notes[("Node", "DeviceFlapping")]
    assert node_event.note == f"StatefulSet ml/trainer (team research): {summary}"
    pod_event = notes[("Pod", "DeviceFlapping")]
    assert pod_event.note.startswith(
        "StatefulSet ml/trainer (team research): device(s) allocated to this pod"
    )
    assert pod_event.regarding.uid == "uid-t0"
