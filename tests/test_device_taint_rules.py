"""DeviceTaintRules through the whole agent, on the contract-enforcing fake API server (shipped RBAC,
strict schemas; the rules written by an admin through the API): one rule tainting eight held DRA
devices is eight device.unhealthy naming the rule and ONE page (the device.incident); a NoExecute
rule with an empty selector is one critical device.taint_rule_evicts_all paged under its uid, and its
deletion resolves it; an unknown effect pages nothing; a refusal or an outage is said once and keeps
the rules last read. tests/test_e2e_device_taint_rules.py runs the same against the real API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from lightkube.core.exceptions import ApiError

from testkit.admission_policy import review
from testkit.agent import Running, make_settings, running_agent
from testkit.kube_rbac import rules_from_manifests
from testkit.kube_schemas import strict_schemas
from testkit.receivers import PagerDutyReceiver
from testkit.taint_rules import (
    DRIVER,
    eight_gpu_node,
    paging_settings,
    rule_body,
    rule_writer,
    taint_rules_of,
)
from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.settings import KubernetesApiSettings
from watcher.kubelet.triggers import Trigger
from watcher.sim.apiserver import ADMIN, FakeApiServer, pod_bound_user
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sources.device_taint_rules import REASON, DeviceTaintRules

ROOT = Path(__file__).resolve().parent.parent
RBAC = ROOT / "deploy" / "kubernetes" / "reporting" / "rbac.yaml"
NODE = "node-a"
AGENT = "agent"
SA = pod_bound_user(
    "system:serviceaccount:pod-resources-watcher:pod-resources-watcher", node=NODE, pod="prw-x7k2p"
)


def _server(tmp: Path, *, grant: bool = True) -> FakeApiServer:
    rules = [
        r
        for r in rules_from_manifests(
            [RBAC], service_account="pod-resources-watcher", namespace="pod-resources-watcher"
        )
        if grant or "devicetaintrules" not in str(r)
    ]
    return FakeApiServer(
        tmp / "api", users={AGENT: SA}, rules={AGENT: rules}, admission=review, schema=strict_schemas()
    )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    server = _server(tmp_path)
    await server.start()
    server.add_node(NODE)
    try:
        yield server
    finally:
        await server.stop()


async def _watching(run: Running) -> DeviceTaintRules:
    """The agent's rules source once it has read the (empty) list and the node is settled."""
    source = taint_rules_of(run.agent.reactor.sources)
    await run.recorder.until(lambda: source.rules == (), 10)
    await run.quiet_cycle()
    return source


def _kinds(run: Running, mark: int) -> list[str]:
    return [str(e.kind) for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]


async def test_one_rule_tainting_eight_held_devices_is_eight_events_naming_it_and_one_page(
    api: FakeApiServer, short_tmp: Path
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    eight_gpu_node("ml", NODE, fake.node)
    kubeconfig = api.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT)
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(api.write_kubeconfig(short_tmp / "admin", ADMIN)) as admin,
    ):
        settings = paging_settings(make_settings(short_tmp), pager.url("/v2/enqueue"), kubeconfig)
        async with fake, running_agent(settings, fake) as run:
            source = await _watching(run)
            mark = len(run.recorder.events)
            await admin.create(rule_body("drain-gpus", {"driver": DRIVER}))
            await run.recorder.until(lambda: len(_kinds(run, mark)) >= 9, 10)
            await run.quiet_cycle()
            assert sorted(_kinds(run, mark)) == ["device.incident"] + ["device.unhealthy"] * 8
            failed = [e for e in run.recorder.events[mark:] if e.kind == "device.unhealthy"]
            assert all(e.details["rules"] == ["drain-gpus"] for e in failed)
            assert all(e.details["sources"] == ["device-taint-rule"] for e in failed)
            assert all("rule drain-gpus" in e.summary for e in failed)
            await pager.wait_accepted(1)
            # The rule deleted: each device healthy again, the incident resolved: one resolve.
            back = len(run.recorder.events)
            await admin.delete("drain-gpus")
            await run.recorder.until(lambda: len(_kinds(run, back)) >= 9, 10)
            await run.quiet_cycle()
            assert sorted(_kinds(run, back)) == ["device.healthy"] * 8 + ["device.incident_resolved"]
            await pager.wait_accepted(2)
            assert source.trouble is None and not source.stale
        assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
        assert pager.incidents_opened() == 1 and pager.events[0]["payload"]["class"] == "device.incident"
        assert pager.violations == []


async def test_an_empty_noexecute_rule_is_one_critical_event_paged_under_its_uid(
    api: FakeApiServer, short_tmp: Path
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    eight_gpu_node("ml", NODE, fake.node)
    kubeconfig = api.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT)
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(api.write_kubeconfig(short_tmp / "admin", ADMIN)) as admin,
    ):
        settings = paging_settings(make_settings(short_tmp), pager.url("/v2/enqueue"), kubeconfig)
        async with fake, running_agent(settings, fake) as run:
            await _watching(run)
            mark = len(run.recorder.events)
            made = await admin.create(rule_body("evict-everything", {}))
            uid = made["metadata"]["uid"]
            assert made["spec"]["taint"]["timeAdded"]  # the server set it, as the real one does
            await run.recorder.until(lambda: len(_kinds(run, mark)) >= 1, 10)
            await run.quiet_cycle()
            (opened,) = [e for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]
            assert opened.kind == "device.taint_rule_evicts_all" and opened.severity == "critical"
            assert opened.details["rule"] == "evict-everything" and opened.details["rule_uid"] == uid
            held = len(run.agent.committer.state.inventory.tally.claim_holders)  # type: ignore[union-attr]
            assert held >= 8 and opened.details["device_count"] == held
            assert "DeviceTaintRule evict-everything" in opened.summary
            lifted_at = len(run.recorder.events)
            await admin.delete("evict-everything")
            await run.recorder.until(lambda: len(_kinds(run, lifted_at)) >= 1, 10)
            await run.quiet_cycle()
            assert _kinds(run, mark) == ["device.taint_rule_evicts_all", "device.taint_rule_lifted"]
            await pager.wait_accepted(2)
        key = f"pod-resources-watcher/device-taint-rule/{uid}"
        assert [(e["event_action"], e["dedup_key"]) for e in pager.events] == [
            ("trigger", key),
            ("resolve", key),
        ]
        assert pager.incidents_opened() == 1


async def test_an_unknown_effect_pages_nothing(
    api: FakeApiServer, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server refuses an effect it does not know (422, as the real one); a rule a newer server
    stored with one (its list answer rewritten here) and a rule with effect None taint nothing."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    eight_gpu_node("ml", NODE, fake.node)
    kubeconfig = api.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT)
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(api.write_kubeconfig(short_tmp / "admin", ADMIN)) as admin,
    ):
        with pytest.raises(ApiError, match="EvictLater") as refused:
            await admin.create(rule_body("future", {"driver": DRIVER}, "EvictLater"))
        assert 'Unsupported value: "EvictLater"' in str(refused.value)
        settings = paging_settings(make_settings(short_tmp), pager.url("/v2/enqueue"), kubeconfig)
        async with fake, running_agent(settings, fake) as run:
            source = await _watching(run)
            listed = source._list

            async def from_a_newer_server() -> list[Any]:
                found = await listed()
                for rule in found:
                    if rule["metadata"]["name"] == "future":
                        rule["spec"]["taint"]["effect"] = "EvictLater"
                return found

            monkeypatch.setattr(source, "_list", from_a_newer_server)
            mark = len(run.recorder.events)
            await admin.create(rule_body("future", {"driver": DRIVER}, "NoSchedule"))
            await admin.create(rule_body("informational", {}, "None"))
            await run.recorder.until(lambda: source.rules is not None and len(source.rules) == 2, 10)
            assert {r.effect for r in source.rules or ()} == {"None"}
            for _ in range(2):
                await run.quiet_cycle()
            assert _kinds(run, mark) == []
        assert pager.events == []


def _source(server: FakeApiServer, tmp: Path) -> tuple[DeviceTaintRules, Trigger]:
    kubeconfig = server.write_kubeconfig(tmp / "agent.kubeconfig", AGENT)
    api = KubeApi(KubernetesApiSettings(api="on", kubeconfig=kubeconfig, timeout=2.0), field_manager="test")
    trigger = Trigger()
    return DeviceTaintRules(api, interval=30.0, trigger=trigger, stop=asyncio.Event()), trigger


async def test_without_the_rbac_it_says_so_once_and_knows_no_rules(tmp_path: Path) -> None:
    server = _server(tmp_path, grant=False)
    await server.start()
    source, _ = _source(server, tmp_path)
    try:
        with structlog.testing.capture_logs() as logs:
            assert not await source.read() and not await source.read()
        (warning,) = [e for e in logs if e["log_level"] == "warning"]
        assert "may not list resource.k8s.io devicetaintrules" in warning["problem"]
        assert source.rules is None and source.trouble == "forbidden" and server.count(status=403) == 2
    finally:
        await source.api.close()
        await server.stop()


async def test_an_outage_keeps_the_rules_last_read(api: FakeApiServer, tmp_path: Path) -> None:
    source, trigger = _source(api, tmp_path)
    try:
        async with rule_writer(api.write_kubeconfig(tmp_path / "admin", ADMIN)) as admin:
            await admin.create(rule_body("drain-gpus", {"driver": DRIVER}))
            assert await source.read() and source.rules is not None and len(source.rules) == 1
        assert REASON in await trigger.wait(time.monotonic() + 0.05, 0.0)
        kept = source.rules
        api.fail_next(404, path_prefix="/apis/resource.k8s.io")
        with structlog.testing.capture_logs() as logs:
            assert not await source.read()
            await api.stop()
            assert not await source.read() and not await source.read()
        assert [e["problem"] for e in logs if e["log_level"] == "warning"] == [
            "the API server does not serve resource.k8s.io/v1 DeviceTaintRules",
            "the API server did not answer",
        ]
        # The rule was deleted meanwhile, but an outage lifts nothing: what was read stands.
        assert source.rules == kept and source.stale and source.status()["problem"] == "unreachable"
        assert REASON not in await trigger.wait(time.monotonic() + 0.05, 0.0)  # failures fire nothing
    finally:
        await source.api.close()
