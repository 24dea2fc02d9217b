"""Expected devices: a resource with fewer devices known to the kubelet than the operator expects.

Some device plugins drop a device that fell off the bus from their list instead of marking it
unhealthy: allocatable shrinks by one and no answer of the kubelet's says a device is missing. Only
a count the operator gives (a config value, or a node label such as GPU feature discovery's
`nvidia.com/gpu.count`) tells it. So, per resource with an expectation:

- known = what the kubelet knows of: its allocatable devices plus its unhealthy ones. The
  pod-resources API leaves an unhealthy device out of allocatable, so it alone cannot tell a
  failing device (already a `device.removed`) from a vanished one; the Node's `status.capacity` is
  the device manager's healthy + unhealthy count. It lags (the kubelet posts its status every 10 s)
  and drops to 0 for a moment after a kubelet restart, while pod-resources answers at once and the
  warm-up hold covers it: known is the larger of the two, so neither's lag opens anything.
- known < expected: one `device.missing` (warning; critical when pods on this node wait for the
  resource), opened only once the Node's capacity has been read (without it an unhealthy device
  would look vanished) and never while the kubelet's warm-up is held.
- known back to expected, or the expectation withdrawn: one `device.missing_resolved`.

The open shortfalls are plain data (`to_json`), kept in the saved state: an agent restart neither
pages them again nor loses their resolve. Pure: the caller brings what it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.inventory import Inventory

__all__ = ["Expected", "Shortfall", "waiting_for"]


def waiting_for(
    pods: Iterable[PodMeta], expected: Mapping[str, int] | None, inv: Inventory | None = None
) -> dict[str, int]:
    """Pods of this node (the Pods API's view) that wait for each expected resource: Pending, with
    the resource in a container's limits, and holding none of its devices in `inv` (pod-resources:
    a pod admitted with its devices and still starting waits for nothing). The scheduler binds no
    pod to a node short of what it asks, so these are pods bound before the device went (or sent
    with nodeName); pods waiting elsewhere in the cluster are not this agent's to see."""
    if not expected:
        return {}
    held = (
        set()
        if inv is None
        else {(p.namespace, p.name, d.resource) for p in inv.pods for c in p.containers for d in c.devices}
    )
    counts: dict[str, int] = {}
    for pod in pods:
        if pod.phase != "Pending":
            continue
        for resource in pod.wants:
            if resource in expected and (pod.namespace, pod.name, resource) not in held:
                counts[resource] = counts.get(resource, 0) + 1
    return counts


@dataclass(frozen=True)
class Shortfall:
    """One open `device.missing`: what was expected and known when it opened, the ids that left.
    `pages`: whether it is a page of its own. Every device that left allocatable while the agent
    watched already holds its own page (its `device.removed`, open while it is gone): when those
    account for the whole shortfall, a second page for the same GPU would be one failure paged
    twice, so the event and the Node condition say it and no pager is woken again. A shortfall
    nobody saw happen (the devices went while the agent was away, or before it knew the count) or
    one that pods wait for pages."""

    resource: str
    expected: int
    known: int
    devices: tuple[str, ...] = ()
    pages: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "expected": self.expected,
            "known": self.known,
            "devices": list(self.devices),
            "pages": self.pages,
        }


@dataclass(frozen=True)
class Expected:
    """The open shortfalls (by resource), and each expected resource's ids when its count was last
    complete: which ids are gone is then known (`devices` of the event)."""

    open: tuple[Shortfall, ...] = ()
    complete: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Resources with no device known at all, and since when (monotonic; not saved: a restart counts
    # afresh, which only delays). See `observe`'s `grace`.
    none_since: tuple[tuple[str, float], ...] = ()

    def observe(
        self,
        expected: Mapping[str, int] | None,
        allocatable: Mapping[str, frozenset[str]],
        capacity: Mapping[str, int] | None,
        *,
        waiting: Mapping[str, int],
        holding: bool,
        now: float = 0.0,
        grace: float = 0.0,
    ) -> tuple[Expected, list[Change]]:
        """One look. `expected`: None when the source has not read it yet (nothing is judged then);
        `allocatable`: the device ids the kubelet's answer (as presented) lists, by resource;
        `capacity`: the Node's status.capacity counts (None: not read); `waiting`: pods of this
        node waiting for each resource; `holding`: the kubelet's warm-up is held.

        A resource with no device known at all is its plugin not registered (a plugin hands over
        its whole list at once): in a kubelet's warm-up that the hold cannot cover (the agent
        started without a baseline in the middle of it, both counts read 0), or a plugin gone. It
        opens only once it has stayed so for `grace` (the kubelet's warm-up grace), as the
        plugin's own devices are reported missing only then."""
        if expected is None:
            return self, []
        opened = {s.resource: s for s in self.open}
        complete = dict(self.complete)
        none_since = dict(self.none_since)
        changes: list[Change] = []
        for resource in sorted(opened.keys() - expected.keys()):
            changes.append(_resolved(opened.pop(resource), None, withdrawn=True))
        for resource, want in sorted(expected.items()):
            ids = allocatable.get(resource, frozenset())
            known = len(ids) if capacity is None else max(len(ids), capacity.get(resource, 0))
            if len(ids) >= want:  # every expected device allocatable: these are the ids to miss
                complete[resource] = tuple(sorted(ids))
            if known > 0:
                none_since.pop(resource, None)
            else:
                none_since.setdefault(resource, now)
            if known >= want:
                if resource in opened:
                    changes.append(_resolved(opened.pop(resource), known, withdrawn=False))
                continue
            if resource in opened or capacity is None or holding:
                continue
            if known == 0 and now - none_since[resource] < grace:
                continue
            gone = tuple(sorted(set(complete.get(resource, ())) - ids))
            pages = waiting.get(resource, 0) > 0 or len(gone) < want - known
            shortfall = Shortfall(resource, want, known, gone, pages)
            opened[resource] = shortfall
            changes.append(_missing(shortfall, waiting.get(resource, 0)))
        complete = {r: ids for r, ids in complete.items() if r in expected}
        after = Expected(
            open=tuple(opened[r] for r in sorted(opened)),
            complete=tuple(sorted(complete.items())),
            none_since=tuple(sorted((r, t) for r, t in none_since.items() if r in expected)),
        )
        return after, changes

    def to_json(self) -> dict[str, Any]:
        return {
            "open": [s.to_json() for s in self.open],
            "complete": {r: list(ids) for r, ids in self.complete},
        }

    @classmethod
    def from_json(cls, data: Any) -> Expected:
        """What `to_json` saved; an unreadable entry is left out, never an error (the worst it
        costs is a page sent again, not a page lost)."""
        if not isinstance(data, Mapping):
            return cls()
        opened: list[Shortfall] = []
        for item in data.get("open") or ():
            try:
                opened.append(
                    Shortfall(
                        str(item["resource"]),
                        int(item["expected"]),
                        int(item["known"]),
                        tuple(str(d) for d in item.get("devices") or ()),
                        item.get("pages") is not False,  # saved before it was kept: it paged
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        complete = data.get("complete")
        done: dict[str, tuple[str, ...]] = {}
        if isinstance(complete, Mapping):
            for r, ids in complete.items():
                if isinstance(ids, list):
                    done[str(r)] = tuple(sorted(str(i) for i in ids))
        return cls(
            open=tuple(sorted({s.resource: s for s in opened}.values(), key=lambda s: s.resource)),
            complete=tuple(sorted(done.items())),
        )


def _missing(shortfall: Shortfall, waiting: int) -> Change:
    short = shortfall.expected - shortfall.known
    named = f" ({', '.join(shortfall.devices)} gone from allocatable)" if shortfall.devices else ""
    summary = (
        f"{shortfall.resource}: {short} device(s) missing: the kubelet knows {shortfall.known} of "
        f"{shortfall.expected} expected{named}"
    )
    if waiting:
        summary += f"; {waiting} pod(s) on this node waiting for it"
    details = {
        **shortfall.to_json(),
        "missing": short,
        "pods_waiting": waiting,
    }
    return Change(Kind.DEVICE_MISSING, Severity.CRITICAL if waiting else Severity.WARNING, summary, details)


def _resolved(shortfall: Shortfall, known: int | None, *, withdrawn: bool) -> Change:
    if withdrawn:
        summary = (
            f"{shortfall.resource}: no device count is expected any more; its missing devices are no "
            "longer reported"
        )
    else:
        summary = (
            f"{shortfall.resource}: the kubelet knows {known} device(s) again, {shortfall.expected} expected"
        )
    details: dict[str, Any] = {
        "resource": shortfall.resource,
        "expected": None if withdrawn else shortfall.expected,
        "known": known,
        "withdrawn": withdrawn,
        "devices": list(shortfall.devices),
        "pages": shortfall.pages,  # the resolve goes where the open went, and only there
    }
    return Change(Kind.DEVICE_MISSING_RESOLVED, Severity.INFO, summary, details)
