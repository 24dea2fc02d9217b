"""DeviceTaintRules: the taints an admin puts on DRA devices (`resource.k8s.io/v1`), read from the
API server through the agent's KubeApi (watcher.kubeapi): the client and rate limiter it shares
with the kubernetes sink and the ResourceSlices reader.

The rules are never written into the ResourceSlices (the scheduler and the eviction controller merge
them in memory), so a reader of slices alone misses them. Every `interval` seconds this lists them
all (cluster-scoped, in pages: RBAC cannot narrow it to the rules that touch one node, and a rule's
selector says nothing of nodes) and keeps them; each cycle matches them against the node's held DRA
devices (watcher.model.devicehealth.taint_rules) and hands the taints over with the rules. A change
fires the trigger's reason `device-taint-rules`.

A list, not a watch: rules are few and small, one list per interval costs the API server less than
a watch per node held open, and a poll has no stream to lose or resume. The interval is short by
default (10 s) because a NoExecute rule evicts at once: the page should not trail the evictions.

A failure (403 without the RBAC, the API server down, the kind not served) is logged once per kind
until a list succeeds again (watcher.sources.listing), and keeps the rules last read: an outage
never lifts a taint nor heals a device. `rules` is None until the first list succeeds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from watcher.kubeapi.api import KubeApi
from watcher.kubelet.triggers import Trigger
from watcher.model.devicehealth.taint_rules import TaintRule, device_taints, rules_of
from watcher.model.inventory import Inventory
from watcher.sources.base import Evidence
from watcher.sources.listing import Listing, ListingSource

__all__ = ["REASON", "DeviceTaintRules"]

log = structlog.get_logger("watcher.sources.device_taint_rules")

REASON = "device-taint-rules"
# Rules per page: a cluster has a handful; a page bounds a surprise.
_PAGE = 500


class DeviceTaintRules(ListingSource):
    """The supervised loop (`run`) and what it last read (`rules`, `stale`): a `Source`."""

    name = "device-taint-rules"
    status_key = "device_taint_rules"
    reason = REASON

    def __init__(self, api: KubeApi, *, interval: float, trigger: Trigger, stop: asyncio.Event) -> None:
        listing = Listing(
            log,
            what="the DeviceTaintRules",
            resource="devicetaintrules",
            kind="DeviceTaintRules",
            section="device_taint_rules",
            kept_what="rules",
        )
        super().__init__(api, listing, interval=interval, trigger=trigger, stop=stop)
        self.rules: tuple[TaintRule, ...] | None = None

    def status(self) -> dict[str, Any]:
        return {"rules": None if self.rules is None else len(self.rules), **self.listing.status()}

    def evidence(self, after: Inventory) -> Evidence:
        if self.rules is None:
            return Evidence()
        held = after.tally.claim_holders.keys()
        return Evidence(taints=device_taints(self.rules, held), rules=self.rules)

    def _kept(self) -> int | None:
        return len(self.rules) if self.rules is not None else None

    def _take(self, found: list[Any]) -> bool:
        rules = rules_of(found)
        changed, self.rules = rules != self.rules, rules
        return changed

    async def _list(self) -> list[Any]:
        from lightkube.resources.resource_v1 import DeviceTaintRule

        found = self.api.client().list(DeviceTaintRule, chunk_size=_PAGE)
        return [item.to_dict() async for item in found]
