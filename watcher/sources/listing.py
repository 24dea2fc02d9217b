"""Listing: what the sources that poll the API server with a list share (ResourceSlices,
DeviceTaintRules): the list made through the agent's KubeApi, a failure told once per kind, and
the supervised loop that lists every `interval` seconds and fires the trigger on news.

A failure (403 without the RBAC, the API server down, the kind not served) is logged once per kind
until a list succeeds again; the source keeps what it last read (an outage must never heal a
device, nor lift a taint), and `stale` says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from watcher.kubeapi.api import KubeApi
from watcher.kubeapi.client import KubernetesError, RefusedError
from watcher.kubelet.triggers import Trigger
from watcher.supervision import sleep_or_stop

__all__ = ["Listing", "ListingSource"]


class Listing:
    """One kind listed again and again: its failures told once per kind, its last success timed.
    `what`: the objects as a log line names them ("the node's ResourceSlices"); `resource`: the
    resource RBAC names ("resourceslices"); `kind`: the kind as the API names it; `section`: the
    settings section that turns the source off."""

    def __init__(
        self, log: Any, *, what: str, resource: str, kind: str, section: str, kept_what: str
    ) -> None:
        self.log = log
        self.what = what
        self.resource = resource
        self.kind = kind
        self.section = section
        self.kept_what = kept_what
        self.trouble: str | None = None  # the kind of the failure last warned of
        self.stale = False  # the last list failed: what the source has is what an earlier one read
        self.last_read: float | None = None  # monotonic, of the last list that succeeded

    async def read(
        self, api: KubeApi, listing: Callable[[], Awaitable[list[Any]]], kept: int | None
    ) -> list[Any] | None:
        """The objects listed, or None when the list failed (said once per kind). `kept`: how many
        the source keeps from an earlier list (None: it has read none)."""
        try:
            found: list[Any] = await api.call(listing())
        except (RefusedError, KubernetesError) as err:
            self.stale = kept is not None
            kind, said = self._trouble(err)
            if kind != self.trouble:
                self.trouble = kind
                self.log.warning(
                    f"cannot read {self.what}; keeping the {self.kept_what} last read",
                    problem=said,
                    error=str(err),
                    kept=kept,
                )
            return None
        if self.trouble is not None:
            self.log.info(f"reading {self.what} again", read=len(found))
            self.trouble = None
        self.stale, self.last_read = False, time.monotonic()
        return found

    def status(self) -> dict[str, Any]:
        read = self.last_read
        return {
            "stale": self.stale,
            "problem": self.trouble,
            "last_read_age_s": None if read is None else round(time.monotonic() - read, 3),
        }

    def _trouble(self, err: Exception) -> tuple[str, str]:
        """(kind, what to say) of a failed list."""
        if isinstance(err, RefusedError):
            if err.status == 403:
                return "forbidden", (
                    f"the service account may not list resource.k8s.io {self.resource}: apply the "
                    f"shipped ClusterRole (deploy/kubernetes/reporting), or set [{self.section}] "
                    "enabled = false"
                )
            if err.status == 404:
                return "not-served", f"the API server does not serve resource.k8s.io/v1 {self.kind}"
            if err.status is None:
                return "unreachable", "the API server did not answer"
            return f"http-{err.status}", "the API server refused the list"
        return "client", "the client could not be set up"


class ListingSource:
    """The loop of a source that lists one kind every `interval` seconds: `read` lists, hands what
    it found to `_take` (True: news) and fires the trigger's `reason` on news. A subclass says what
    it lists (`_list`), how many it keeps (`_kept`) and what it takes (`_take`)."""

    reason = ""

    def __init__(
        self, api: KubeApi, listing: Listing, *, interval: float, trigger: Trigger, stop: asyncio.Event
    ) -> None:
        self.api = api  # the agent's one: `api_rate` bounds all it asks of the API server together
        self.listing = listing
        self.interval = interval
        self.trigger = trigger
        self.stop = stop

    @property
    def stale(self) -> bool:
        """The last list failed: what the source has is what an earlier one read."""
        return self.listing.stale

    @property
    def trouble(self) -> str | None:
        """The kind of the failure last warned of."""
        return self.listing.trouble

    async def run(self) -> None:
        """List every `interval` seconds until the stop flag; never raises for the API's sake."""
        while not self.stop.is_set():
            await self.read()
            await sleep_or_stop(self.stop, self.interval)

    async def first_look(self) -> None:
        return None  # the first cycle goes without; the first list fires the trigger

    async def read(self) -> bool:
        """One list: True when it succeeded (and the trigger fired if it brought news)."""
        found = await self.listing.read(self.api, self._list, self._kept())
        if found is None:
            return False
        if self._take(found):
            self.trigger.fire(self.reason)
        return True

    def _kept(self) -> int | None:
        raise NotImplementedError

    def _take(self, found: list[Any]) -> bool:
        raise NotImplementedError

    async def _list(self) -> list[Any]:
        raise NotImplementedError
