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
    "eight_gpu_node",
    "paging_settings",
    "rule_body",
    "rule_writer",
    "taint_rules_of",
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
