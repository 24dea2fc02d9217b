"""DeviceTaintRules through the whole agent, on the contract-enforcing fake API server (shipped RBAC,
strict schemas; the rules written by an admin through the API): one rule tainting eight held DRA
devices is eight device.unhealthy naming the rule and ONE page (the device.incident); a NoExecute
rule with an empty selector is one critical device.taint_rule_evicts_all paged under its uid, and its
deletion resolves it; an unknown effect pages nothing; a refusal or an outage is said once and keeps
the rules last read. tests/test_e2e_device_taint_rules.py runs the same against the real API server."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from lightkube.core.exceptions import ApiError

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_api import AGENT, agent_api_server, serving, shipped_rules
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
from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.settings import KubernetesApiSettings
from watcher.kubelet.triggers import Trigger
from watcher.sim.apiserver import ADMIN, FakeApiServer
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sources.device_taint_rules import REASON, DeviceTaintRules

NODE = "node-a"
TIMEOUT = 10.0


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeApiServer]:
    async with serving(agent_api_server(tmp_path / "api", node=NODE), NODE) as server:
        yield server


@asynccontextmanager
async def _scene(
    api: FakeApiServer, tmp: Path
) -> AsyncIterator[tuple[Running, RuleWriter, PagerDutyReceiver]]:
    """The agent on a node whose eight pods hold one of DRIVER's devices each, reading the fake
    API server with the shipped RBAC and paging a receiver; the admin's writer beside it."""
    fake = FakeKubelet(tmp / "kubelet", seed=21)
    eight_gpu_node("ml", NODE, fake.node)
    kubeconfig = api.write_kubeconfig(tmp / "agent.kubeconfig", AGENT)
    async with PagerDutyReceiver() as pager, rule_writer(api.write_kubeconfig(tmp / "admin", ADMIN)) as admin:
        settings = paging_settings(make_settings(tmp), pager.url("/v2/enqueue"), kubeconfig)
        async with fake, running_agent(settings, fake) as run:
            yield run, admin, pager


async def test_one_rule_tainting_eight_held_devices_is_eight_events_naming_it_and_one_page(
    api: FakeApiServer, short_tmp: Path
) -> None:
    async with _scene(api, short_tmp) as (run, admin, pager):
        await one_rule_on_eight_devices(run, admin, pager, "drain-gpus", {"driver": DRIVER}, TIMEOUT)


async def test_an_empty_noexecute_rule_is_one_critical_event_paged_under_its_uid(
    api: FakeApiServer, short_tmp: Path
) -> None:
    async with _scene(api, short_tmp) as (run, admin, pager):
        await evicts_all_then_lifted(run, admin, pager, "evict-everything", TIMEOUT)


async def test_every_nodes_agent_folds_into_the_one_page_of_a_rule_that_evicts_everything(
    api: FakeApiServer, short_tmp: Path
) -> None:
    """Two nodes, two agents, one PagerDuty service: each node tells the rule once, both trigger
    the same dedup key (its uid), so PagerDuty opens one incident; the deletion resolves it (the
    second node's resolve finds it resolved: a no-op at PagerDuty, which the receiver flags)."""
    api.add_node("node-b")
    admin_kubeconfig = api.write_kubeconfig(short_tmp / "admin", ADMIN)
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(admin_kubeconfig) as admin,
        AsyncExitStack() as stack,
    ):
        runs = []
        for node in (NODE, "node-b"):
            root = short_tmp / node
            fake = FakeKubelet(root / "kubelet", seed=21)
            eight_gpu_node("ml", node, fake.node)
            kubeconfig = api.write_kubeconfig(root / "agent.kubeconfig", AGENT)
            base = dataclasses.replace(make_settings(root), node=node)
            settings = paging_settings(base, pager.url("/v2/enqueue"), kubeconfig)
            await stack.enter_async_context(fake)
            runs.append(await stack.enter_async_context(running_agent(settings, fake)))
        for run in runs:
            await watching(run, TIMEOUT)
        marks = [len(run.recorder.events) for run in runs]
        made = await admin.create(rule_body("evict-everything", {}))
        await pager.wait_for(2)
        await admin.delete("evict-everything")
        await pager.wait_for(4)
        for run, mark in zip(runs, marks, strict=True):
            await run.quiet_cycle()
            assert device_kinds(run, mark) == ["device.taint_rule_evicts_all", "device.taint_rule_lifted"]
    key = f"pod-resources-watcher/device-taint-rule/{made['metadata']['uid']}"
    sent = [r.parsed for r in pager.requests]
    assert {e["dedup_key"] for e in sent} == {key}
    assert sorted(e["event_action"] for e in sent) == ["resolve", "resolve", "trigger", "trigger"]
    triggers = [e for e in sent if e["event_action"] == "trigger"]
    assert sorted(e["payload"]["source"] for e in triggers) == [NODE, "node-b"]
    assert pager.incidents_opened() == 1
    (second_resolve,) = pager.violations
    assert f"resolve of dedup_key '{key}' never triggered" in second_resolve


async def test_a_restart_neither_tells_the_rule_again_nor_loses_its_lift(
    api: FakeApiServer, short_tmp: Path
) -> None:
    """The open rule is in the saved state: the restarted agent reads the same rule and says
    nothing (no second event, no second trigger); its deletion then is the one lift and resolve."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    eight_gpu_node("ml", NODE, fake.node)
    kubeconfig = api.write_kubeconfig(short_tmp / "agent.kubeconfig", AGENT)
    async with (
        PagerDutyReceiver() as pager,
        rule_writer(api.write_kubeconfig(short_tmp / "admin", ADMIN)) as admin,
        fake,
    ):
        settings = paging_settings(make_settings(short_tmp), pager.url("/v2/enqueue"), kubeconfig)
        async with running_agent(settings, fake) as run:
            await watching(run, TIMEOUT)
            await admin.create(rule_body("evict-everything", {}))
            await run.recorder.until(
                lambda: device_kinds(run, 0) == ["device.taint_rule_evicts_all"], TIMEOUT
            )
            await pager.wait_accepted(1)
        async with running_agent(settings, fake) as again:
            source = await watching(again, TIMEOUT)
            assert source.rules is not None and [r.name for r in source.rules] == ["evict-everything"]
            for _ in range(2):
                await again.quiet_cycle()
            assert device_kinds(again, 0) == []
            await admin.delete("evict-everything")
            lifted = ["device.taint_rule_lifted"]
            await again.recorder.until(lambda: device_kinds(again, 0) == lifted, TIMEOUT)
            await pager.wait_accepted(2)
            await again.quiet_cycle()
            assert device_kinds(again, 0) == lifted
    assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
    assert pager.incidents_opened() == 1
    assert pager.violations == []


async def test_an_unknown_effect_pages_nothing(
    api: FakeApiServer, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server refuses an effect it does not know (422, as the real one); a rule a newer server
    stored with one (its list answer rewritten here) and a rule with effect None taint nothing."""
    async with _scene(api, short_tmp) as (run, admin, pager):
        with pytest.raises(ApiError, match='Unsupported value: "EvictLater"') as refused:
            await admin.create(rule_body("future", {"driver": DRIVER}, "EvictLater"))
        assert refused.value.status.code == 422
        source = await watching(run, TIMEOUT)
        listed = source._list

        async def from_a_newer_server() -> list[Any]:
            found: list[Any] = await listed()
            for rule in found:
                if rule["metadata"]["name"] == "future":
                    rule["spec"]["taint"]["effect"] = "EvictLater"
            return found

        monkeypatch.setattr(source, "_list", from_a_newer_server)
        mark = len(run.recorder.events)
        await admin.create(rule_body("future", {"driver": DRIVER}, "NoSchedule"))
        await admin.create(rule_body("informational", {}, "None"))
        await run.recorder.until(lambda: source.rules is not None and len(source.rules) == 2, TIMEOUT)
        assert {r.effect for r in source.rules or ()} == {"None"}
        for _ in range(2):
            await run.quiet_cycle()
        assert device_kinds(run, mark) == []
    assert pager.events == []


def _source(server: FakeApiServer, tmp: Path) -> tuple[DeviceTaintRules, Trigger]:
    kubeconfig = server.write_kubeconfig(tmp / "agent.kubeconfig", AGENT)
    api = KubeApi(KubernetesApiSettings(api="on", kubeconfig=kubeconfig, timeout=2.0), field_manager="test")
    trigger = Trigger()
    return DeviceTaintRules(api, interval=30.0, trigger=trigger, stop=asyncio.Event()), trigger


async def test_without_the_rbac_it_says_so_once_and_knows_no_rules(tmp_path: Path) -> None:
    server = agent_api_server(
        tmp_path / "api", node=NODE, rules=shipped_rules(lambda r: "devicetaintrules" not in str(r))
    )
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
