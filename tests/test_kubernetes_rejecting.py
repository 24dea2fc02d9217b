"""A node that keeps rejecting a resource's pods, through the kubernetes sink: its own Node condition
(NvidiaGpuPodsRejected) True while node.rejecting_pods is open and False after its end, written
against the contract-enforcing API server with the shipped RBAC and admission policy, kept through
a start's prune of stale conditions, and the Node Events that say it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from testkit.fake_api import AGENT, agent_api_server, serving
from testkit.inventories import inventory_of
from watcher.model import lifecycle
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.sim.apiserver import FakeApiServer
from watcher.sim.send_test import MemoryStore
from watcher.sinks.kubernetes import KubernetesSink, KubernetesSinkSettings
from watcher.sinks.kubernetes.condition_plan import OWNER_MARK, is_owned
from watcher.sinks.kubernetes.episodes import REJECTING

NODE = "node-a"
GPU = "nvidia.com/gpu"
OPENED = "node keeps rejecting nvidia.com/gpu pods: 12 in 5 min (latest: Allocate failed ...)"
ENDED = "node no longer rejecting nvidia.com/gpu pods: none in 5 min (12 rejected while it lasted)"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    async with serving(agent_api_server(tmp_path / "api", node=NODE), NODE) as server:
        yield server


_seq = 0


def _events(*changes: Change) -> list[Event]:
    global _seq
    out = []
    for change in changes:
        _seq += 1
        out.append(envelope(change, seq=_seq, node=NODE, cycle=f"c{_seq}", before=None, after=None))
    return out


def _opened() -> Change:
    return Change(Kind.NODE_REJECTING_PODS, Severity.CRITICAL, OPENED, {"resource": GPU, "count": 12})


def _ended() -> Change:
    return Change(Kind.NODE_REJECTING_PODS_ENDED, Severity.INFO, ENDED, {"resource": GPU, "count": 12})


def _condition(api: FakeApiServer, ctype: str) -> dict[str, Any] | None:
    found = [c for c in api.node(NODE)["status"].get("conditions", []) if c["type"] == ctype]
    return found[0] if found else None


def test_the_type_is_derived_like_the_device_condition_and_owned() -> None:
    assert REJECTING.type_of(GPU) == "NvidiaGpuPodsRejected"
    assert REJECTING.type_of("example.com/sriov-nic") == "ExampleSriovNicPodsRejected"
    (cond,) = REJECTING.conditions(REJECTING.after(_events(_opened()), {}))
    assert (cond.type, cond.status, cond.reason) == ("NvidiaGpuPodsRejected", "True", "PodsRejected")
    assert cond.message == OWNER_MARK + OPENED and is_owned(cond.type, cond.message)
    assert not is_owned("NvidiaGpuPodsRejected", "another writer's")
    assert not is_owned("PodsRejected", OWNER_MARK + "no name of its own")


async def test_the_condition_is_true_while_the_node_rejects_and_false_after(
    tmp_path: Path, api: FakeApiServer
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "agent.kubeconfig", AGENT)
    store = MemoryStore()
    sink = KubernetesSink(KubernetesSinkSettings(name="k8s", kubeconfig=kubeconfig), node=NODE, store=store)
    try:
        assert (await sink.deliver(_events(_opened()))).delivered
        cond = _condition(api, "NvidiaGpuPodsRejected")
        assert cond is not None and cond["status"] == "True" and cond["message"] == OWNER_MARK + OPENED
        # The agent restarts: its start reconciles (and prunes) the conditions it owns; this one
        # stays, the incident being open still.
        started = lifecycle.started(
            inventory_of(["GPU-0", "GPU-1"], {}), baseline="saved", changes=0, error=None
        )
        assert (await sink.deliver(_events(started))).delivered
        cond = _condition(api, "NvidiaGpuPodsRejected")
        assert cond is not None and cond["status"] == "True"
        assert (await sink.deliver(_events(_ended()))).delivered
        cond = _condition(api, "NvidiaGpuPodsRejected")
        assert cond is not None and cond["status"] == "False" and cond["reason"] == "PodsAdmitted"
        node_events = sorted(e["reason"] for e in api.events() if e["regarding"]["kind"] == "Node")
        assert node_events == ["NodeRejectingPods", "NodeRejectingPodsEnded"]
    finally:
        await sink.close()
