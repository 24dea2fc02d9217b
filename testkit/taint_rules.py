"""DeviceTaintRules for the tests: the objects an admin writes, written through the API with the
admin's kubeconfig (lightkube, the same calls against the fake API server and the real one), a node
whose eight pods each hold one DRA GPU, and an agent with a PagerDuty sink that resolves at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from testkit.agent import Running
from testkit.receivers import PagerDutyReceiver
from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.settings import KubernetesApiSettings
from watcher.settings import Settings
from watcher.settings_file import parse_settings
from watcher.sim.fake_node import FakeClaim, FakeClaimDevice, FakeContainer, FakeNode, FakePod
from watcher.sources.device_taint_rules import DeviceTaintRules
from watcher.sources.taint_rule_settings import DeviceTaintRulesSettings

__all__ = [
    "DRIVER",
    "PD_KEY",
    "RuleWriter",
    "device_kinds",
    "eight_gpu_node",
    "evicts_all_then_lifted",
    "one_rule_on_eight_devices",
    "paging_settings",
    "rule_body",
    "rule_writer",
    "taint_rules_of",
    "watching",
]

DRIVER = "gpu.taint-rules.example.com"
PD_KEY = "R0UTINGKEY0000000000000000000000"
COUNT = 8  # the incident threshold's default: eight devices of one driver failing at once


def rule_body(
    name: str,
    selector: Mapping[str, str] | None,
    effect: str = "NoExecute",
    *,
    key: str = "example.com/maintenance",
    value: str = "rma",
) -> dict[str, Any]:
    """A DeviceTaintRule as an admin writes one (`selector` None: no deviceSelector at all)."""
    spec: dict[str, Any] = {"taint": {"key": key, "value": value, "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = dict(selector)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


def eight_gpu_node(namespace: str, pool: str, node: FakeNode | None = None) -> FakeNode:
    """`node` (a new one by default) with eight pods `train-0`..`train-7`, each holding one of
    DRIVER's devices `gpu-0`..`gpu-7` of pool `pool` through its own claim."""
    node = FakeNode() if node is None else node
    if not node.cpu_ids:
        node.cpu_ids = {0, 1}
    for i in range(COUNT):
        gpu = FakeClaimDevice(DRIVER, pool, f"gpu-{i}", [f"{DRIVER}/gpu=gpu-{i}"])
        claim = FakeClaim(namespace, f"train-{i}-gpu", [gpu], request="gpu")
        node.add_pod(FakePod(namespace, f"train-{i}", [FakeContainer("trainer", claims=[claim])]))
    return node


def paging_settings(base: Settings, pager_url: str, kubeconfig: Path, *, interval: float = 1.0) -> Settings:
    """`base` reading the API server with `kubeconfig` ([kubernetes] api on, no kubernetes sink),
    the rules listed every `interval` seconds, the slices not at all, and a PagerDuty sink that
    resolves at once (no hold-down: the test counts the resolve)."""
    pd = parse_settings(
        {
            "sinks": {
                "pd": {
                    "type": "pagerduty",
                    "routing_key": PD_KEY,
                    "endpoint": pager_url,
                    "resolve_hold_down": 0,
                }
            }
        }
    )
    return dataclasses.replace(
        base,
        sinks=(*base.sinks, *pd.sinks),
        kubernetes=KubernetesApiSettings(api="on", kubeconfig=kubeconfig, api_rate=50.0),
        resource_slices=dataclasses.replace(base.resource_slices, enabled=False),
        device_taint_rules=DeviceTaintRulesSettings(interval=interval),
    )


def taint_rules_of(sources: Any) -> DeviceTaintRules:
    """The agent's DeviceTaintRules source among `sources` (the reactor's)."""
    found = [s for s in sources if isinstance(s, DeviceTaintRules)]
    assert len(found) == 1, found
    return found[0]


@dataclasses.dataclass
class RuleWriter:
    """An admin writing DeviceTaintRules through the API (create, delete)."""

    api: KubeApi
    made: set[str] = dataclasses.field(default_factory=set)  # the names it created, not deleted yet

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import DeviceTaintRule

        rule = DeviceTaintRule.from_dict(dict(body))
        assert isinstance(rule, DeviceTaintRule)
        made = await self.api.client().create(rule)
        self.made.add(body["metadata"]["name"])
        return made.to_dict()

    async def delete(self, name: str) -> None:
        from lightkube.resources.resource_v1 import DeviceTaintRule

        await self.api.client().delete(DeviceTaintRule, name)
        self.made.discard(name)


@asynccontextmanager
async def rule_writer(admin_kubeconfig: Path) -> AsyncIterator[RuleWriter]:
    """A RuleWriter with the admin's kubeconfig; every rule it made and did not delete is deleted
    at the end (they are cluster-scoped: a rule left behind would taint the next test's devices)."""
    api = KubeApi(KubernetesApiSettings(api="on", kubeconfig=admin_kubeconfig), field_manager="test-admin")
    writer = RuleWriter(api)
    try:
        yield writer
    finally:
        try:
            for name in sorted(writer.made):
                await writer.delete(name)
        finally:
            await api.close()


# --- the stories, told the same way against the fake API server and the real one ---


def device_kinds(run: Running, mark: int) -> list[str]:
    """The kinds of the device.* events since index `mark`."""
    return [str(e.kind) for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]


async def watching(run: Running, timeout: float) -> DeviceTaintRules:
    """The agent's rules source once it has listed them and the node is settled (a shared API
    server may hold other tests' rules: none of them touches this node's devices)."""
    source = taint_rules_of(run.agent.reactor.sources)
    await run.recorder.until(lambda: source.rules is not None, timeout)
    await run.quiet_cycle()
    return source


async def one_rule_on_eight_devices(
    run: Running,
    admin: RuleWriter,
    pager: PagerDutyReceiver,
    name: str,
    selector: Mapping[str, str],
    timeout: float,
) -> None:
    """A NoExecute rule on DRIVER's eight held devices, then deleted: eight device.unhealthy naming
    the rule and one device.incident; eight device.healthy and its resolve; ONE page, resolved."""
    source = await watching(run, timeout)
    mark = len(run.recorder.events)
    await admin.create(rule_body(name, selector))
    await run.recorder.until(lambda: len(device_kinds(run, mark)) >= COUNT + 1, timeout)
    await run.quiet_cycle()
    assert sorted(device_kinds(run, mark)) == ["device.incident"] + ["device.unhealthy"] * COUNT
    failed = [e for e in run.recorder.events[mark:] if e.kind == "device.unhealthy"]
    assert all(e.details["rules"] == [name] and f"rule {name}" in e.summary for e in failed)
    assert all(e.details["sources"] == ["device-taint-rule"] for e in failed)
    await pager.wait_accepted(1)
    back = len(run.recorder.events)
    await admin.delete(name)
    await run.recorder.until(lambda: len(device_kinds(run, back)) >= COUNT + 1, timeout)
    await run.quiet_cycle()
    assert sorted(device_kinds(run, back)) == ["device.healthy"] * COUNT + ["device.incident_resolved"]
    await pager.wait_accepted(2)
    assert source.trouble is None
    assert not source.stale
    assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
    assert pager.incidents_opened() == 1
    assert pager.events[0]["payload"]["class"] == "device.incident"
    assert pager.violations == []


async def evicts_all_then_lifted(
    run: Running, admin: RuleWriter, pager: PagerDutyReceiver, name: str, timeout: float
) -> str:
    """A NoExecute rule with an empty selector, then deleted: one critical
    device.taint_rule_evicts_all naming it (no device.unhealthy, no incident), one
    device.taint_rule_lifted; one page under the rule's uid, resolved. Returns the uid."""
    await watching(run, timeout)
    mark = len(run.recorder.events)
    made = await admin.create(rule_body(name, {}))
    uid: str = made["metadata"]["uid"]
    assert made["spec"]["taint"]["timeAdded"]  # set by the server
    await run.recorder.until(lambda: len(device_kinds(run, mark)) >= 1, timeout)
    await run.quiet_cycle()
    (opened,) = [e for e in run.recorder.events[mark:] if str(e.kind).startswith("device.")]
    assert opened.kind == "device.taint_rule_evicts_all"
    assert opened.severity == "critical"
    assert opened.details["rule"] == name
    assert opened.details["rule_uid"] == uid
    held = run.agent.committer.state.inventory
    assert held is not None
    assert opened.details["device_count"] == len(held.tally.claim_holders) >= COUNT
    assert f"DeviceTaintRule {name}" in opened.summary
    lifted = len(run.recorder.events)
    await admin.delete(name)
    await run.recorder.until(lambda: len(device_kinds(run, lifted)) >= 1, timeout)
    await run.quiet_cycle()
    assert device_kinds(run, mark) == ["device.taint_rule_evicts_all", "device.taint_rule_lifted"]
    await pager.wait_accepted(2)
    key = f"pod-resources-watcher/device-taint-rule/{uid}"
    assert [(e["event_action"], e["dedup_key"]) for e in pager.events] == [("trigger", key), ("resolve", key)]
    assert pager.incidents_opened() == 1
    return uid
