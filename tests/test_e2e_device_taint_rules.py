"""DeviceTaintRules against the real API server (kube-testcluster: upstream's kube-apiserver 1.37,
where DRADeviceTaintRules is on by default), written by the admin with the same client calls as
the fast tier's tests/test_device_taint_rules.py makes against the fake, and read by the agent with
a pod-bound token under the shipped RBAC. Exact event counts and the pages a PagerDuty receiver got:
(a) one rule tainting eight held devices of one driver: eight device.unhealthy naming the rule and
one page; (b) a NoExecute rule with an empty selector: one critical device.taint_rule_evicts_all
paged under a dedup key from its uid, and its deletion resolves it; (c) an effect the server does
not know is refused (as the fake refuses it), and an effect None pages nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import pytest
from lightkube.core.exceptions import ApiError

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.kube_reporting import Placement, install_reporting, place_agent
from testkit.kube_testcluster import KubeTestCluster
from testkit.receivers import PagerDutyReceiver
from testkit.taint_rules import (
    DRIVER,
    eight_gpu_node,
    paging_settings,
    rule_body,
    rule_writer,
    taint_rules_of,
)
from watcher.settings import Settings
from watcher.sources.device_taint_rules import DeviceTaintRules

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(kube_cluster: KubeTestCluster) -> KubeTestCluster:
    """The session's cluster with the shipped RBAC (list devicetaintrules) and policy in force."""
    asyncio.run(install_reporting(kube_cluster))
    return kube_cluster


@pytest.fixture
def placed(cluster: KubeTestCluster, request: pytest.FixtureRequest) -> Placement:
    tag = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())[:20].strip("-")
    return place_agent(cluster, tag)


def _settings(placed: Placement, root: Path, pager: PagerDutyReceiver) -> Settings:
    base = dataclasses.replace(make_settings(root), node=placed.node)
    return paging_settings(base, pager.url("/v2/enqueue"), placed.kubeconfig)


def _kinds(run: Running, mark: int) -> list[str]:
    return [str(e.kind) for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]


async def _watching(run: Running) -> DeviceTaintRules:
    source = taint_rules_of(run.agent.reactor.sources)
    # Other tests' rules may be there (the API server is shared); none of them is ours.
    await run.recorder.until(lambda: source.rules is not None, 20)
    await run.quiet_cycle()
    return source


async def test_one_rule_tainting_eight_held_devices_is_one_page(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(eight_gpu_node(placed.namespace, placed.node))
    name = f"drain-{placed.node}"
    async with PagerDutyReceiver() as pager, rule_writer(cluster.admin_kubeconfig) as admin:
        async with running_agent(_settings(placed, short_tmp, pager), fake) as run:
            source = await _watching(run)
            mark = len(run.recorder.events)
            await admin.create(rule_body(name, {"driver": DRIVER, "pool": placed.node}))
            await run.recorder.until(lambda: len(_kinds(run, mark)) >= 9, 20)
            await run.quiet_cycle()
            assert sorted(_kinds(run, mark)) == ["device.incident"] + ["device.unhealthy"] * 8
            failed = [e for e in run.recorder.events[mark:] if e.kind == "device.unhealthy"]
            assert all(e.details["rules"] == [name] and f"rule {name}" in e.summary for e in failed)
            assert all(e.details["sources"] == ["device-taint-rule"] for e in failed)
            await pager.wait_accepted(1)
            back = len(run.recorder.events)
            await admin.delete(name)
            await run.recorder.until(lambda: len(_kinds(run, back)) >= 9, 20)
            await run.quiet_cycle()
            assert sorted(_kinds(run, back)) == ["device.healthy"] * 8 + ["device.incident_resolved"]
            await pager.wait_accepted(2)
            assert source.trouble is None and not source.stale  # the shipped RBAC let it list
        assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
        assert pager.incidents_opened() == 1 and pager.events[0]["payload"]["class"] == "device.incident"
        assert pager.violations == []


async def test_an_empty_noexecute_rule_is_one_critical_event_paged_under_its_uid(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(eight_gpu_node(placed.namespace, placed.node))
    name = f"evict-all-{placed.node}"
    async with PagerDutyReceiver() as pager, rule_writer(cluster.admin_kubeconfig) as admin:
        async with running_agent(_settings(placed, short_tmp, pager), fake) as run:
            await _watching(run)
            mark = len(run.recorder.events)
            made = await admin.create(rule_body(name, {}))
            uid = made["metadata"]["uid"]
            assert made["spec"]["taint"]["timeAdded"]  # set by the server (the fake does the same)
            await run.recorder.until(lambda: len(_kinds(run, mark)) >= 1, 20)
            await run.quiet_cycle()
            (opened,) = [e for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]
            assert opened.kind == "device.taint_rule_evicts_all" and opened.severity == "critical"
            assert opened.details["rule"] == name and opened.details["rule_uid"] == uid
            assert opened.details["device_count"] == 8 and f"DeviceTaintRule {name}" in opened.summary
            lifted = len(run.recorder.events)
            await admin.delete(name)
            await run.recorder.until(lambda: len(_kinds(run, lifted)) >= 1, 20)
            await run.quiet_cycle()
            assert _kinds(run, mark) == ["device.taint_rule_evicts_all", "device.taint_rule_lifted"]
            await pager.wait_accepted(2)
        key = f"pod-resources-watcher/device-taint-rule/{uid}"
        assert [(e["event_action"], e["dedup_key"]) for e in pager.events] == [
            ("trigger", key),
            ("resolve", key),
        ]
        assert pager.incidents_opened() == 1


async def test_an_unknown_effect_is_refused_and_effect_none_pages_nothing(
    cluster: KubeTestCluster, placed: Placement, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(eight_gpu_node(placed.namespace, placed.node))
    async with PagerDutyReceiver() as pager, rule_writer(cluster.admin_kubeconfig) as admin:
        # The server knows three effects and refuses the others (a newer one's rule keeps its
        # effect, which the agent reads as None: tests/test_device_taint_rules.py).
        with pytest.raises(ApiError, match='Unsupported value: "EvictLater"') as refused:
            await admin.create(rule_body(f"future-{placed.node}", {"driver": DRIVER}, "EvictLater"))
        assert refused.value.status.code == 422
        async with running_agent(_settings(placed, short_tmp, pager), fake) as run:
            source = await _watching(run)
            mark = len(run.recorder.events)
            name = f"note-{placed.node}"
            await admin.create(rule_body(name, {}, "None"))
            await run.recorder.until(lambda: any(r.name == name for r in source.rules or ()), 20)
            for _ in range(2):
                await run.quiet_cycle()
            assert _kinds(run, mark) == []
        assert pager.events == []
