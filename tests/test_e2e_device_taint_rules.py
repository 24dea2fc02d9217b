"""DeviceTaintRules against the real API server (kube-testcluster: upstream's kube-apiserver 1.37,
where DRADeviceTaintRules is on by default), written by the admin with the same client calls as
the fast tier's tests/test_device_taint_rules.py makes against the fake, and read by the agent with
a pod-bound token under the shipped RBAC. Exact event counts and the pages a PagerDuty receiver got:
(a) one rule tainting eight held devices of one driver: eight device.unhealthy naming the rule and
one page; (b) a NoExecute rule with an empty selector: one critical device.taint_rule_evicts_all
paged under a dedup key from its uid, and its deletion resolves it; (c) an effect the server does
not know is refused (as the fake refuses it), and an effect None pages nothing; (d) the same
evict-all rule seen by two nodes' agents paging one PagerDuty service: one incident, as the rule's
uid is both pages' dedup key.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from lightkube.core.exceptions import ApiError

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.kube_reporting import Placement, place_agent
from testkit.kube_testcluster import KubeTestCluster
from testkit.receivers import PagerDutyReceiver
from testkit.taint_rules import (
    DRIVER,
    RuleWriter,
    device_kinds,
    eight_gpu_node,
    evicts_all_then_lifted,
    one_rule_on_eight_devices,
    paging_settings,
    rule_body,
    rule_writer,
    watching,
)
from watcher.settings import Settings

pytestmark = pytest.mark.e2e

TIMEOUT = 20.0  # the real server and the agent share two cores with the rest of the suite


@pytest.fixture(scope="module")
def cluster(reporting: KubeTestCluster) -> KubeTestCluster:
    return reporting


def _settings(placed: Placement, root: Path, pager: PagerDutyReceiver) -> Settings:
    base = dataclasses.replace(make_settings(root), node=placed.node)
    return paging_settings(base, pager.url("/v2/enqueue"), placed.kubeconfig)


@asynccontextmanager
async def _scene(
    cluster: KubeTestCluster, placed: Placement, root: Path, start_kubelet: StartKubelet
) -> AsyncIterator[tuple[Running, RuleWriter, PagerDutyReceiver]]:
    """The agent on the placed node, its eight pods holding one of DRIVER's devices each, reading
    the real API server with its pod-bound token and paging a receiver; the admin's writer beside."""
    fake = await start_kubelet(eight_gpu_node(placed.namespace, placed.node))
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(cluster.admin_kubeconfig) as admin,
        running_agent(_settings(placed, root, pager), fake) as run,
    ):
        yield run, admin, pager


async def test_one_rule_tainting_eight_held_devices_is_one_page(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    selector = {"driver": DRIVER, "pool": placed.node}  # this node's devices only: the server is shared
    async with _scene(cluster, placed, short_tmp, start_kubelet) as (run, admin, pager):
        await one_rule_on_eight_devices(run, admin, pager, f"drain-{placed.node}", selector, TIMEOUT)


async def test_an_empty_noexecute_rule_is_one_critical_event_paged_under_its_uid(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    async with _scene(cluster, placed, short_tmp, start_kubelet) as (run, admin, pager):
        await evicts_all_then_lifted(run, admin, pager, f"evict-all-{placed.node}", TIMEOUT)


async def test_an_unknown_effect_is_refused_and_effect_none_pages_nothing(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    async with _scene(cluster, placed, short_tmp, start_kubelet) as (run, admin, pager):
        # The server knows three effects and refuses the others (a newer one's rule keeps its
        # effect, which the agent reads as None: tests/test_device_taint_rules.py).
        with pytest.raises(ApiError, match='Unsupported value: "EvictLater"') as refused:
            await admin.create(rule_body(f"future-{placed.node}", {"driver": DRIVER}, "EvictLater"))
        assert refused.value.status.code == 422
        source = await watching(run, TIMEOUT)
        mark = len(run.recorder.events)
        name = f"note-{placed.node}"
        await admin.create(rule_body(name, {}, "None"))
        await run.recorder.until(lambda: any(r.name == name for r in source.rules or ()), TIMEOUT)
        for _ in range(2):
            await run.quiet_cycle()
        assert device_kinds(run, mark) == []
    assert pager.events == []


async def test_an_empty_noexecute_rule_seen_by_two_nodes_is_one_incident(
    cluster: KubeTestCluster, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Every node's agent sees the evict-all rule and pages it, each under the rule's uid: one
    PagerDuty incident for the cluster, not one a node. Lifted, each node resolves it; the second
    resolve finds it resolved (PagerDuty answers it and changes nothing; the receiver notes it)."""
    tag = uuid.uuid4().hex[:6]
    nodes = [place_agent(cluster, f"two-{i}-{tag}") for i in range(2)]
    name = f"evict-all-two-{tag}"
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(cluster.admin_kubeconfig) as admin,
        AsyncExitStack() as stack,
    ):
        runs: list[Running] = []
        for i, placed in enumerate(nodes):
            root = short_tmp / f"n{i}"
            fake = await start_kubelet(eight_gpu_node(placed.namespace, placed.node), root=root / "kubelet")
            runs.append(await stack.enter_async_context(running_agent(_settings(placed, root, pager), fake)))
        for run in runs:
            await watching(run, TIMEOUT)
        marks = [len(run.recorder.events) for run in runs]
        uid = (await admin.create(rule_body(name, {})))["metadata"]["uid"]
        for run, mark in zip(runs, marks, strict=True):
            await run.recorder.until(lambda run=run, mark=mark: device_kinds(run, mark) != [], TIMEOUT)
        await pager.wait_accepted(2, TIMEOUT)
        await admin.delete(name)
        for run, mark in zip(runs, marks, strict=True):
            await run.recorder.until(lambda run=run, mark=mark: len(device_kinds(run, mark)) >= 2, TIMEOUT)
            await run.quiet_cycle()
            assert device_kinds(run, mark) == ["device.taint_rule_evicts_all", "device.taint_rule_lifted"]
        await pager.wait_for(4, TIMEOUT)
    key = f"pod-resources-watcher/device-taint-rule/{uid}"
    sent = [r.parsed for r in pager.requests]
    assert sorted((e["event_action"], e["dedup_key"]) for e in sent) == [
        ("resolve", key),
        ("resolve", key),
        ("trigger", key),
        ("trigger", key),
    ]
    assert pager.incidents_opened() == 1
    triggers = [e for e in sent if e["event_action"] == "trigger"]
    assert [e["payload"]["severity"] for e in triggers] == ["critical"] * 2
    assert sorted(e["payload"]["source"] for e in triggers) == sorted(p.node for p in nodes)  # one each
    (noted,) = pager.violations  # "#<index> ...": the second resolve, a no-op at PagerDuty
    assert noted.endswith(f"resolve of dedup_key {key!r} never triggered with this routing_key"), noted
