"""Pods the node rejects at admission for a device reason, and a node that keeps doing it. Pure.

The kubelet fails a pod it cannot admit at once (`kubelet.go:rejectPod`): phase Failed, the
handler's reason, and "Pod was rejected: " before its words. Of its admission handlers (1.37.2),
these are about devices:

- `UnexpectedAdmissionError` from the device manager's Allocate, run by the topology manager's
  admit handler (`cm/admission/errors.go`: "Allocate failed due to <cause>, which is unexpected"),
  with the causes in `cm/devicemanager/manager.go`: "no healthy devices present; cannot allocate
  unhealthy devices R", "requested number of devices unavailable for R. Requested: n, Available:
  m", "cannot allocate unregistered device R", "previously allocated devices are no longer
  healthy; ...", "unknown Device Plugin R", a plugin's Allocate or GetPreferredAllocation RPC
  failing. The same reason also comes from the CPU and memory managers ("not enough cpus
  available ..."): only the device manager's causes count, recognised by their words.
- `UnexpectedAdmissionError` with "Update plugin resources failed due to ..." (the predicate
  handler's call into the device manager's UpdatePluginResources).
- `OutOf<resource>` for an extended resource (`OutOfnvidia.com/gpu`, "Node didn't have enough
  resource: nvidia.com/gpu, ..."): the node's allocatable had too few when the pod came. OutOfcpu,
  OutOfmemory, OutOfpods, OutOfephemeral-storage and hugepages are not devices and never count.

Not counted: `TopologyAffinityError` (its words never say which resource could not be aligned:
CPUs as often as devices), node affinity, taints, sysctls. The DRA manager has no admission handler
in 1.37.2: a claim its driver fails to prepare leaves the pod Pending and retried
(FailedPrepareDynamicResources), never Failed, so DRA gives no rejection to report here.

Each rejected pod is one `pod.rejected` (warning). `threshold` of one resource within `window`
seconds are one incident: one critical `node.rejecting_pods`, and one `node.rejecting_pods_ended`
once `window` passes without another. A pod is reported once: the uids told are kept and saved
with the state, so neither a restart nor a resync tells it again. One the kubelet no longer shows is
kept FORGET_AFTER more (a restarted kubelet shows its failed pods again only as it reads them back
from the API server, after its Pods API is live), then forgotten: a uid never comes back for real.
At the very first look (no saved state) the pods already rejected are old news: taken as told,
never reported, never counted. While the kubelet's warm-up is held (`holding`), a rejection is told
but not counted toward an incident: pods a kubelet refuses before its device plugins registered
again are the warm-up's, which pages nobody.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.wording import printable

__all__ = ["FAILED", "THRESHOLD_DOC", "WINDOW_DOC", "Rejection", "Rejections", "rejection_of", "window_text"]

# `[pods] rejections_threshold` and `rejections_window`, documented here beside what they tune.
THRESHOLD_DOC = (
    "This many pods of one device resource rejected at admission (`pod.rejected`) within "
    "rejections_window are one critical `node.rejecting_pods` that pages once: one rejection is a "
    "race a retry wins (a device went between scheduling and admission), three in a row is a node "
    "that takes every such pod and fails it. 0: never."
)
WINDOW_DOC = (
    "Seconds the rejections are counted over, and `node.rejecting_pods_ended` (the page resolved) "
    "once this long passes without another. A Job's controller creates a failed pod's replacement "
    "within seconds and backs off to minutes, so 5 min sees a node that fails each retry."
)

FAILED = "Failed"
UNEXPECTED = "UnexpectedAdmissionError"
OUT_OF = "OutOf"
REJECTED_PREFIX = "Pod was rejected: "
_FORMAT = 1
# A resource name as Kubernetes writes an extended resource: domain/name.
_RESOURCE = r"([A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]*[A-Za-z0-9])"
# The device manager's causes (cm/devicemanager/manager.go), the resource where the words name it.
_DEVICE_CAUSES = (
    re.compile(r"cannot allocate unhealthy devices " + _RESOURCE),
    re.compile(r"requested number of devices unavailable for " + _RESOURCE),
    re.compile(r"cannot allocate unregistered device " + _RESOURCE),
    re.compile(r"unknown Device Plugin " + _RESOURCE),
    re.compile(r"endpoint not found in cache for a registered resource: " + _RESOURCE),
    re.compile(r"changed request for resource \"" + _RESOURCE),
    re.compile(r"device plugin \w+ rpc failed"),
    re.compile(r"unexpectedly allocated less resources than required"),
    re.compile(r"^Update plugin resources failed due to "),
)
# Far above a real node's rejections in a window; a runaway loop costs this much state at most.
_RECENT_MAX = 10_000
# Seconds a told uid the kubelet no longer shows is kept (see the module), and how many at most.
FORGET_AFTER = 3600.0
_GONE_MAX = 10_000


@dataclass(frozen=True)
class Rejection:
    """What the kubelet said of a pod it would not admit: `resource` is "" when its words name none."""

    reason: str
    resource: str
    message: str


def rejection_of(pod: PodMeta) -> Rejection | None:
    """The pod's admission failure if it is one for a device reason, else None."""
    if pod.phase != FAILED or not pod.reason:
        return None
    words = pod.message.removeprefix(REJECTED_PREFIX)
    if pod.reason == UNEXPECTED:
        for cause in _DEVICE_CAUSES:
            found = cause.search(words)
            if found is not None:
                resource = found.group(1) if found.groups() else ""
                return Rejection(pod.reason, resource, words)
        return None
    resource = pod.reason.removeprefix(OUT_OF)
    if pod.reason.startswith(OUT_OF) and re.fullmatch(_RESOURCE, resource) and "hugepages" not in resource:
        return Rejection(pod.reason, resource, words)
    return None


def window_text(seconds: float) -> str:
    """300 -> "5 min", 90 -> "90 s": how the incident's window reads in its summary."""
    return f"{seconds / 60:g} min" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"


@dataclass(frozen=True)
class _Incident:
    resource: str
    count: int  # rejections since it opened, the opening ones included
    last: float  # monotonic time of its latest rejection


@dataclass(frozen=True)
class Rejections:
    """What has been told: `baseline` (the first look is taken), `told` (uids reported or taken as
    old news), `recent` ((monotonic time, resource) of the rejections in the window) and the open
    incidents, one per resource."""

    baseline: bool = False
    told: frozenset[str] = frozenset()
    recent: tuple[tuple[float, str], ...] = ()
    open: tuple[_Incident, ...] = ()
    gone: tuple[tuple[str, float], ...] = ()  # told uids not shown now, and since when (monotonic)

    def next_look(self, window: float) -> float | None:
        """When an open incident's window may have passed with no new rejection."""
        return min((i.last + window for i in self.open), default=None)

    def observe(
        self, now: float, pods: Iterable[PodMeta], *, threshold: int, window: float, holding: bool = False
    ) -> tuple[Rejections, list[Change]]:
        """The new state and its changes, for the Pods API's whole live view `pods` at `now`."""
        pods = list(pods)
        rejected = [(p, r) for p in pods if (r := rejection_of(p)) is not None]
        if not self.baseline:
            return replace(self, baseline=True, told=frozenset(p.uid for p, _ in rejected)), []
        changes: list[Change] = []
        new = [(p, r) for p, r in rejected if p.uid not in self.told]
        new.sort(key=lambda pr: (pr[1].resource, pr[0].namespace, pr[0].name, pr[0].uid))
        changes.extend(_rejected(p, r) for p, r in new)
        present = {p.uid for p in pods}
        gone = self._gone(now, present)
        told = frozenset(u for u in self.told if u in present or u in gone) | {p.uid for p, _ in new}
        recent = [(t, res) for t, res in self.recent if now - t < window]
        if holding:  # the kubelet's warm-up: told, never counted toward a page
            new = []
        recent += [(now, r.resource) for _, r in new]
        recent = recent[-_RECENT_MAX:]
        incidents = {i.resource: i for i in self.open}
        by_resource: dict[str, list[tuple[PodMeta, Rejection]]] = {}
        for p, r in new:
            by_resource.setdefault(r.resource, []).append((p, r))
        for resource, hits in sorted(by_resource.items()):
            if resource in incidents:
                was = incidents[resource]
                incidents[resource] = _Incident(resource, was.count + len(hits), now)
                continue
            count = sum(1 for _, res in recent if res == resource)
            if threshold > 0 and count >= threshold:
                incidents[resource] = _Incident(resource, count, now)
                changes.append(_opened(resource, count, window, hits))
        for resource, incident in sorted(incidents.items()):
            if resource not in by_resource and now - incident.last >= window:
                del incidents[resource]
                changes.append(_ended(incident, window))
        opened = tuple(incidents[r] for r in sorted(incidents))
        return Rejections(True, told, tuple(recent), opened, tuple(sorted(gone.items()))), changes

    def _gone(self, now: float, present: set[str]) -> dict[str, float]:
        """The told uids not shown now, each since when it was first missed, none past FORGET_AFTER."""
        was = dict(self.gone)
        gone = {}
        for uid in self.told - present:
            since = was.get(uid, now)
            if now - since < FORGET_AFTER:
                gone[uid] = since
        if len(gone) > _GONE_MAX:
            gone = dict(sorted(gone.items(), key=lambda ut: ut[1])[-_GONE_MAX:])
        return gone

    def to_json(self, now: float) -> dict[str, Any]:
        """For the saved state. Times are monotonic, so they are saved as ages at `now`: a restart
        reads them back as that old at its own now (the agent's downtime is not counted, which
        only ever keeps an incident open longer, never ends one early)."""
        return {
            "format": _FORMAT,
            "baseline": self.baseline,
            "told": sorted(self.told),
            "gone": [[u, round(now - t, 3)] for u, t in self.gone],
            "recent": [[round(now - t, 3), res] for t, res in self.recent],
            "open": [
                {"resource": i.resource, "count": i.count, "age": round(now - i.last, 3)} for i in self.open
            ],
        }

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> Rejections:
        """What `to_json` saved, at monotonic `now`; anything unreadable is a fresh state (its first
        look takes the rejected pods as old news: at worst a rejection is not told, never twice)."""
        try:
            if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
                return cls()
            told = frozenset(str(u) for u in data["told"])
            recent = tuple((now - float(age), str(res)) for age, res in data["recent"])
            incidents = tuple(
                _Incident(str(i["resource"]), int(i["count"]), now - float(i["age"])) for i in data["open"]
            )
            gone = tuple((str(u), now - float(age)) for u, age in data.get("gone", []))
            return cls(data.get("baseline") is True, told, recent, incidents, gone)
        except (KeyError, TypeError, ValueError):
            return cls()


def _who(pod: PodMeta) -> dict[str, Any]:
    return {"namespace": pod.namespace, "name": pod.name, **pod.who()}


def _rejected(pod: PodMeta, rejection: Rejection) -> Change:
    entry = _who(pod)
    resource = rejection.resource or "a device"
    text = f"pod {pod.key} rejected at admission for {resource}: {printable(rejection.message)}"
    details = {
        "namespace": pod.namespace,
        "pod": pod.name,
        "pod_uid": pod.uid,
        "owner": entry["owner"],
        "labels": entry["labels"],
        "resource": rejection.resource,
        "reason": rejection.reason,
        "message": rejection.message,
    }
    # The owner goes first where people read it: each sink puts owner_text before the summary.
    return Change(Kind.POD_REJECTED, Severity.WARNING, text, details)


def _opened(resource: str, count: int, window: float, hits: list[tuple[PodMeta, Rejection]]) -> Change:
    pods = [_who(p) for p, _ in hits]
    what = f"{resource} pods" if resource else "device pods"
    text = f"node keeps rejecting {what}: {count} in {window_text(window)}"
    latest = hits[-1][1]
    text += f" (latest: {printable(latest.message)})"
    details = {
        "resource": resource,
        "count": count,
        "window_s": window,
        "pods": pods,
        "reason": latest.reason,
        "message": latest.message,
    }
    return Change(Kind.NODE_REJECTING_PODS, Severity.CRITICAL, text, details)


def _ended(incident: _Incident, window: float) -> Change:
    what = f"{incident.resource} pods" if incident.resource else "device pods"
    text = (
        f"node no longer rejecting {what}: none in {window_text(window)} "
        f"({incident.count} rejected while it lasted)"
    )
    details = {"resource": incident.resource, "count": incident.count, "window_s": window}
    return Change(Kind.NODE_REJECTING_PODS_ENDED, Severity.INFO, text, details)
