"""ResourceSliceTaints: the node's DRA device taints, read from the API server (the second source of
DRA device health beside the Pod status), through the agent's KubeApi (watcher.kubeapi): the
client and rate limiter it shares with the kubernetes sink, if one is configured.

Every `interval` seconds it lists the ResourceSlices of the agent's node (`fieldSelector
spec.nodeName=<node>`, in pages) and keeps their devices' taints; when they change it fires the
trigger's reason `resource-slices`, and the next cycle merges them (watcher.model.devicehealth.verdicts). A
list, not a watch: one small request per interval is nothing to the API server, and a poll has no
stream to lose or resume.

A failure (403 without the RBAC, the API server down, resource.k8s.io/v1 not served) is logged once
per kind until a list succeeds again (watcher.sources.listing), and leaves the taints as last read:
an outage must never heal a device. `stale` says the taints are older than the last attempt;
`taints` is None until the first list succeeds (then what a saved state says of them stands).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from watcher.kubeapi.api import KubeApi
from watcher.kubelet.triggers import Trigger
from watcher.model.devicehealth.taints import DeviceTaint, taints_of_slices
from watcher.model.inventory import Inventory
from watcher.sources.base import Evidence
from watcher.sources.listing import Listing, ListingSource

__all__ = ["REASON", "ResourceSliceTaints"]

log = structlog.get_logger("watcher.sources.resource_slices")

REASON = "resource-slices"
# Slices per page: a node's are few (one per driver and pool); a page bounds a surprise.
_PAGE = 500


class ResourceSliceTaints(ListingSource):
    """The supervised loop (`run`) and what it last read (`taints`, `stale`): a `Source`."""

    name = "resource-slices"
    status_key = "resource_slices"
    reason = REASON

    def __init__(
        self, api: KubeApi, *, node: str, interval: float, trigger: Trigger, stop: asyncio.Event
    ) -> None:
        listing = Listing(
            log,
            what="the node's ResourceSlices",
            resource="resourceslices",
            kind="ResourceSlices",
            section="resource_slices",
            kept_what="device taints",
        )
        super().__init__(api, listing, interval=interval, trigger=trigger, stop=stop)
        self.node = node
        self.taints: tuple[DeviceTaint, ...] | None = None

    def status(self) -> dict[str, Any]:
        return {"taints": None if self.taints is None else len(self.taints), **self.listing.status()}

    def evidence(self, after: Inventory) -> Evidence:
        return Evidence(taints=self.taints)

    def _kept(self) -> int | None:
        return len(self.taints) if self.taints is not None else None

    def _take(self, found: list[Any]) -> bool:
        taints = taints_of_slices(found, self.node)
        changed, self.taints = taints != self.taints, taints
        return changed

    async def _list(self) -> list[Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        found = self.api.client().list(ResourceSlice, fields={"spec.nodeName": self.node}, chunk_size=_PAGE)
        return [item.to_dict() async for item in found]
