"""What an answered cycle found: the answer held against the warm-up, diffed, damped and grouped.

Every way a cycle reads the node (the whole List, or Get for the pods the Pods API named) ends
here, so both report a change the same way: what the kubelet's warm-up explains is held
(watcher.model.settling), the rest diffed, flapping devices damped, mass failures grouped, and an
inventory.snapshot added when one is due.
"""

from __future__ import annotations

import dataclasses
import time

import structlog

from watcher.cycle.state import CycleState
from watcher.kubelet.plugins import plugin_sockets
from watcher.kubelet.registrations import driver_registrations, plugin_socket_identities
from watcher.model import lifecycle
from watcher.model.changes import Change, Kind
from watcher.model.devicehealth.affected import annotate
from watcher.model.devicehealth.plugin_devices import corroborate
from watcher.model.diff import diff
from watcher.model.expected import waiting_for
from watcher.model.flapping import FlapRule
from watcher.model.inventory import Inventory
from watcher.model.settling import Settling
from watcher.settings import Settings
from watcher.sources.base import Evidence

__all__ = ["restarted", "settle", "conclude"]

log = structlog.get_logger("watcher.cycle.findings")


def restarted(settling: Settling, before: Inventory | None) -> Settling:
    """The kubelet was seen restarting: hold its warm-up from now, on every path of the cycle
    (answered or not: a refused look must not leave the next answer's warm-up to be diffed raw)."""
    if before is None:
        return settling
    return settling.kubelet_restarted(time.monotonic(), before)


def settle(
    settings: Settings, settling: Settling, before: Inventory | None, answer: Inventory
) -> tuple[Settling, list[Change], Inventory]:
    """Hold what the kubelet's warm-up explains (see watcher.model.settling): the next settling
    state, the plugin lifecycle changes, and the inventory to report."""
    if before is None:
        return settling, [], answer
    now = time.monotonic()
    grace = settings.kubelet.warmup_grace
    sockets = plugin_sockets(settings.kubelet.root_dir / "device-plugins")
    after, changes = settling.observe(now, before, answer, sockets, grace)
    if after.holding and not settling.holding:
        log.info(
            "holding what the warm-up explains until the node settles",
            resources=sorted(after.held_resources()),
            pods=after.pods_since is not None,
            grace_s=grace,
        )
    elif settling.holding and not after.holding:
        began = settling.began()
        held_for = None if began is None else round(now - began, 3)
        log.info("node settled: reporting the net change", held_s=held_for)
    return after, changes, after.present(before, answer)


def _ids_by_resource(inv: Inventory) -> dict[str, frozenset[str]]:
    ids: dict[str, set[str]] = {}
    for d in inv.devices:
        ids.setdefault(d.resource, set()).add(d.id)
    return {r: frozenset(s) for r, s in ids.items()}


def _missing_devices(
    settings: Settings,
    draft: CycleState,
    changes: list[Change],
    after: Inventory,
    evidence: Evidence,
    now: float,
) -> CycleState:
    """Fewer devices known to the kubelet than the operator expects (watcher.model.expected), added
    to `changes`: judged on the presented inventory, so the warm-up's hold covers a restart here too."""
    pods = evidence.pods
    expected, missing = draft.expected.observe(
        evidence.expected,
        _ids_by_resource(after),
        evidence.capacity,
        waiting=waiting_for(pods, evidence.expected, after) if pods is not None else {},
        holding=draft.settling.holding,
        now=now,
        grace=settings.kubelet.warmup_grace,
    )
    changes.extend(missing)
    return dataclasses.replace(draft, expected=expected)


def flap_rule(settings: Settings) -> FlapRule:
    w = settings.watch
    return FlapRule(limit=w.flap_limit, window=w.flap_window, quiet=w.flap_quiet)


def eviction_wait(settings: Settings) -> float:
    """How long an eviction waits for its device's taint to be read: two lists of the slices."""
    return 2 * settings.resource_slices.interval


def conclude(
    settings: Settings,
    draft: CycleState,
    changes: list[Change],
    cycle: str,
    before: Inventory | None,
    after: Inventory,
    evidence: Evidence,
) -> CycleState:
    """Diff `before` against the inventory to report, add the changes to `changes` (after the
    lifecycle ones already there) and return the draft that holds `after`.

    `evidence`: what the sources say (watcher.sources.base). With the Pods API's complete view of
    the pods, a DRA device's verdict in its holders' Pod status is a change too, a device plugin's
    device that left allocatable carries the kubelet's verdicts, and every change names the pods it
    hits; the ResourceSlice taints are the second source of DRA device health, merged with the Pod
    status's (watcher.model.devicehealth.verdicts)."""
    pods = evidence.pods
    if before is not None and after is not before:
        after.carry_tally(before)  # one pod's change costs that pod, not a recount of the node
    diffs: list[Change] = list(diff(before, after)) if before is not None and after is not before else []
    now = time.monotonic()
    device_health = draft.device_health
    if before is not None:
        # Even with neither source now (the Pods API down or off, no slices read): pod-resources
        # still tells when an open story's device has no holder any more, and its unheld grace runs.
        if pods is not None:
            diffs = corroborate(diffs, pods)
        device_health, verdicts = device_health.observe(
            now,
            after,
            pods,
            unknown_grace=settings.pods.health_unknown_grace,
            unheld_grace=settings.pods.unheld_grace,
            holding=draft.settling.holding,
            taints=evidence.taints,
        )
        diffs.extend(verdicts)
        device_health, told = device_health.observe_rules(evidence.rules, after)
        diffs.extend(told)
    # A failed device back only because its plugin or driver re-registered is no heal (model/resets).
    restarted = {str(c.details.get("resource", "")) for c in changes if c.kind is Kind.PLUGIN_REGISTERED}
    drivers = driver_registrations(settings.kubelet.root_dir / "plugins_registry")
    plugins = plugin_socket_identities(settings.kubelet.root_dir / "device-plugins")
    hold_down = settings.watch.reset_hold_down
    resets, diffs = draft.resets.observe(now, diffs, restarted, hold_down, drivers, plugins)
    draft = dataclasses.replace(draft, resets=resets)
    flaps, damped = draft.flaps.damp(now, diffs, flap_rule(settings))
    incidents, grouped = draft.incidents.group(cycle, damped, settings.watch.incident_threshold)
    changes.extend(annotate(grouped, pods, evidence.gone) if pods is not None else grouped)
    if pods is not None:
        # Pods evicted for a device taint, each named once (watcher.model.devicehealth.evictions).
        seen = [*pods, *evidence.gone.values()]
        wait = eviction_wait(settings)
        evictions, evicted = draft.evictions.observe(now, seen, (after, before), evidence.taints, wait=wait)
        changes.extend(evicted)
        draft = dataclasses.replace(draft, evictions=evictions)
    if evidence.expected is not None:  # no expectation read (or none configured): nothing to judge
        draft = _missing_devices(settings, draft, changes, after, evidence, now)
    rejections = draft.rejections
    if pods is not None:
        # Pods the kubelet failed at admission for a device reason (watcher.model.rejections).
        p = settings.pods
        rejections, told = rejections.observe(
            now,
            pods,
            threshold=p.rejections_threshold,
            window=p.rejections_window,
            holding=draft.settling.holding,
        )
        changes.extend(told)
    draft = dataclasses.replace(
        draft,
        flaps=flaps,
        incidents=incidents,
        inventory=after,
        device_health=device_health,
        rejections=rejections,
    )
    every = settings.watch.snapshot_interval
    if every > 0 and now - draft.last_snapshot >= every:
        draft = dataclasses.replace(draft, last_snapshot=now)
        changes.append(lifecycle.snapshot(after))
    return draft
