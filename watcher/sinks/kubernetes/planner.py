"""What the agent reports into Kubernetes: Events on the Pods and the Node, and one Node condition per
device resource. Pure: the `kubernetes` sink turns a batch of our events into a `Report` here and only
does the API calls; what each condition says is `condition_plan`'s.

Events. A device that fails or vanishes while allocated gets a Warning on each Pod holding it, and a
Normal one when it is back; one Event per Pod and reason per batch (a batch is one re-query's events),
however many of its devices are involved, so a mass failure costs one Event per Pod, not one per
device. Node-level changes (devices added or removed per resource, topology, CPUs, memory, kubelet and
device-plugin lifecycle) become Events on the Node. Allocation and capacity bookkeeping does not: the
scheduler and the kubelet already say when a pod starts.

Conditions. One Node condition per device resource, True while any of its devices is failed or missing
(left the kubelet's allocatable after settling, so warm-up after a restart never sets it), False once
every one is back. The state behind it, `Missing`, is kept by the sink and reconciled from the
inventory the agent reports at every start (`watcher.started`), so a restart neither leaves a stale
condition nor clears a live one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from watcher.model.changes import Kind
from watcher.model.devicehealth.affected import hit_pods, owner_text
from watcher.model.devicehealth.taints import RULE_SOURCE
from watcher.model.devicehealth.verdicts import SLICE_SOURCE
from watcher.model.devicehealth.verdicts import SOURCE as POD_STATUS
from watcher.model.events import Event
from watcher.model.wording import printable
from watcher.sinks.kubernetes.notes import fit, listed, pods_of

__all__ = [
    "MAX_NOTE_BYTES",
    "NODE_REASONS",
    "POD_REASONS",
    "Regarding",
    "KubeEvent",
    "Missing",
    "Report",
    "plan",
]

# The API server refuses an Event whose note is over 1 kB.
MAX_NOTE_BYTES = 1024

# The reasons, stable: alerting and `kubectl get events --field-selector reason=...` rely on them.
POD_REASONS = {
    "DeviceFailed": "a device allocated to the pod left the node's allocatable devices (failed or vanished)",
    "DeviceRecovered": "that device is back",
    "DeviceFlapping": "a device allocated to the pod keeps failing and coming back",
}
NODE_REASONS = {
    "DeviceRemoved": "devices of a resource left allocatable (unhealthy or unplugged)",
    "DeviceAdded": "devices of a resource joined or came back to allocatable",
    "DeviceFlapping": "a device keeps failing and coming back",
    "DeviceFlapEnded": "that device has been stable for the quiet period",
    "DeviceIncident": "many devices of one resource left allocatable at once",
    "DeviceIncidentResolved": "every device of that incident is back",
    "PodEvictedForDeviceTaint": "a pod was evicted because a device it held has a NoExecute taint",
    "NodeRejectingPods": "the kubelet keeps failing pods of a device resource at admission",
    "NodeRejectingPodsEnded": "a window passed with no such rejection",
    "DevicesMissing": "fewer devices of a resource known to the kubelet than expected",
    "DevicesMissingResolved": "the kubelet knows the expected count again",
    "DeviceTopologyChanged": "a device's NUMA placement changed",
    "CpusAdded": "CPUs joined the allocatable set",
    "CpusRemoved": "CPUs left the allocatable set",
    "MemoryChanged": "allocatable memory changed",
    "KubeletRestarted": "the kubelet restarted (its socket was replaced)",
    "KubeletUnreachable": "the kubelet's pod-resources API has not answered for the grace period",
    "KubeletReachable": "it answers again",
    "DevicePluginUnregistered": "a device plugin went away (its devices are held meanwhile)",
    "DevicePluginRegistered": "it registered again",
    "DeviceReset": "a failed device is back only because its plugin restarted: not a verified heal",
    "PodResourcesApiDegraded": "part of the pod-resources API is disabled or failing",
    "InvalidDeviceText": "the kubelet's answer carried a name or id that is not valid UTF-8",
    "PodResourcesAnswerTooLarge": "the kubelet's answer is over the receive limit: the agent is blind",
    "DeviceTaintRuleEvictsAll": "an admin's DeviceTaintRule evicts every DRA pod of the cluster",
    "DeviceTaintRuleLifted": "that rule is deleted or no longer evicts from every device",
    "SendTest": "`send-test` checked the sink: no action needed",
}

# One Node event per kind below, worded by the agent's own summary of it.
_NODE_EVENTS: dict[Kind, tuple[str, Literal["Normal", "Warning"]]] = {
    Kind.DEVICE_FLAP_ENDED: ("DeviceFlapEnded", "Normal"),
    Kind.DEVICE_FLAPPING: ("DeviceFlapping", "Warning"),
    Kind.DEVICE_INCIDENT: ("DeviceIncident", "Warning"),
    Kind.DEVICE_INCIDENT_RESOLVED: ("DeviceIncidentResolved", "Normal"),
    Kind.DEVICE_TAINT_RULE_EVICTS_ALL: ("DeviceTaintRuleEvictsAll", "Warning"),
    Kind.DEVICE_TAINT_RULE_LIFTED: ("DeviceTaintRuleLifted", "Normal"),
    Kind.POD_EVICTED: ("PodEvictedForDeviceTaint", "Warning"),
    Kind.NODE_REJECTING_PODS: ("NodeRejectingPods", "Warning"),
    Kind.NODE_REJECTING_PODS_ENDED: ("NodeRejectingPodsEnded", "Normal"),
    Kind.DEVICE_MISSING: ("DevicesMissing", "Warning"),
    Kind.DEVICE_MISSING_RESOLVED: ("DevicesMissingResolved", "Normal"),
    Kind.DEVICE_TOPOLOGY_CHANGED: ("DeviceTopologyChanged", "Normal"),
    Kind.CPU_ADDED: ("CpusAdded", "Normal"),
    Kind.CPU_REMOVED: ("CpusRemoved", "Warning"),
    Kind.MEMORY_CHANGED: ("MemoryChanged", "Normal"),
    Kind.KUBELET_RESTARTED: ("KubeletRestarted", "Normal"),
    Kind.KUBELET_UNREACHABLE: ("KubeletUnreachable", "Warning"),
    Kind.KUBELET_REACHABLE: ("KubeletReachable", "Normal"),
    Kind.PLUGIN_UNREGISTERED: ("DevicePluginUnregistered", "Normal"),
    Kind.PLUGIN_REGISTERED: ("DevicePluginRegistered", "Normal"),
    Kind.DEVICE_RESET: ("DeviceReset", "Warning"),
    Kind.API_DEGRADED: ("PodResourcesApiDegraded", "Warning"),
    Kind.API_INVALID_TEXT: ("InvalidDeviceText", "Warning"),
    Kind.API_ANSWER_TOO_LARGE: ("PodResourcesAnswerTooLarge", "Warning"),
}
# events.k8s.io requires an action: what the reporter was doing. Ours is always watching.
ACTION = "WatchPodResources"

# resource -> device -> the containers ("namespace/pod/container") holding it when it went missing.
Missing = dict[str, dict[str, list[str]]]

# Where a DRA device's story comes from (its holders' Pod status, its ResourceSlice's taints, an
# admin's DeviceTaintRule): such a device is never in allocatable, which the Node conditions are kept
# from and reconciled against.
_DRA_SOURCES = frozenset({POD_STATUS, SLICE_SOURCE, RULE_SOURCE})


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about: a Pod (namespaced) or the Node (cluster-scoped). A Pod's `uid`,
    when the agent's events carried it (the Pods API), saves reading the pod to learn it."""

    kind: Literal["Pod", "Node"]
    name: str
    namespace: str = ""
    uid: str = ""


@dataclass(frozen=True)
class KubeEvent:
    regarding: Regarding
    type: Literal["Normal", "Warning"]
    reason: str
    note: str
    action: str = ACTION
    # When the agent saw it happen (the Event's eventTime): a late delivery keeps the real time.
    observed: datetime = field(default=datetime.min.replace(tzinfo=UTC), compare=False)

    @property
    def key(self) -> str:
        """The same event (same object, reason and words) has the same key: a repeat updates the
        existing Event's series rather than creating another object."""
        parts = (self.regarding.kind, self.regarding.namespace, self.regarding.name, self.reason, self.note)
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Report:
    """What one batch asks for: Events, the new missing-device state, the resources whose condition
    may have changed, and whether the batch starts a run (then every owned condition is reconciled)."""

    events: list[KubeEvent] = field(default_factory=list)
    missing: Missing = field(default_factory=dict)
    resources: set[str] = field(default_factory=set)
    started: bool = False


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


# --- the plan ---


@dataclass
class _PodNotes:
    failed: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    flapping: list[str] = field(default_factory=list)


def _pod_of(holder: str) -> tuple[str, str, str] | None:
    parts = holder.split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def plan(events: Sequence[Event], missing: Mapping[str, Mapping[str, Sequence[str]]]) -> Report:
    """The Events and the new missing-device state for one batch of our events (in seq order)."""
    planner = _Planner(missing)
    for event in events:
        planner.take(event)
    node = events[0].node if events else ""
    report = Report(planner.events, planner.state, planner.resources, started=planner.started)
    report.events.extend(planner.node_summaries(node))
    report.events.extend(planner.pod_events(node))
    if events:
        # One re-query's events: they were seen together, at the last one's time.
        seen = _time_of(events[-1])
        report.events[:] = [replace(e, observed=seen) for e in report.events]
    return report


class _Planner:
    """One batch's plan in the making: the missing-device state, the Events so far, and what the
    batch says of each pod and of the devices added and removed (worded once it is all read)."""

    def __init__(self, missing: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
        self.state: Missing = {
            res: {dev: list(pods) for dev, pods in devs.items()} for res, devs in missing.items()
        }
        self.events: list[KubeEvent] = []
        self.resources: set[str] = set()
        self.started = False
        self.pods: dict[tuple[str, str], _PodNotes] = {}
        # What the batch's events say of the pods they name (the Pods API's uid, owner and labels).
        self.who: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.removed: dict[str, list[str]] = {}
        self.added: dict[str, list[str]] = {}

    def _notes(self, holder: str) -> tuple[_PodNotes, str] | None:
        pod = _pod_of(holder)
        if pod is None:
            return None
        return self.pods.setdefault((pod[0], pod[1]), _PodNotes()), pod[2]

    def take(self, event: Event) -> None:
        d = event.details
        for entry in hit_pods(d):
            self.who[(entry["namespace"], entry["name"])] = entry
        if d.get("test") is True:
            # `send-test`: a Normal Event on the Node that says so; no condition, no pod touched.
            self.events.append(_node_event(event.node, "Normal", "SendTest", event.summary))
            return
        if d.get("source") in _DRA_SOURCES:
            # A DRA device's health, from its holder's Pod status or its slice's taints: such
            # devices are never in allocatable, which the Node conditions are kept from, so its
            # flapping or incident would stay "missing" there for good. The Node Event says it;
            # the conditions leave it out, whichever source told it.
            if event.kind in _NODE_EVENTS:
                reason, kind = _NODE_EVENTS[event.kind]
                self.events.append(_node_event(event.node, kind, reason, event.summary))
            return
        if event.kind in (Kind.WATCHER_STARTED, Kind.INVENTORY_SNAPSHOT):
            self._reconcile(event)
            return
        self._device(event)
        if event.kind in _NODE_EVENTS:
            reason, kind = _NODE_EVENTS[event.kind]
            self.events.append(_node_event(event.node, kind, reason, _owner_first(event.summary, d)))

    def _reconcile(self, event: Event) -> None:
        d = event.details
        if event.kind is Kind.WATCHER_STARTED:
            reconciled = _reconcile(self.state, d.get("inventory"), d.get("allocatable_devices"))
        else:
            canonical = d.get("inventory")
            allocatable = canonical.get("allocatable") if isinstance(canonical, Mapping) else None
            ids = allocatable.get("devices") if isinstance(allocatable, Mapping) else None
            reconciled = _reconcile(self.state, d.get("summary"), ids)
        if reconciled is not None:
            self.resources.update(reconciled)
            self.started = True

    def _device(self, event: Event) -> None:
        """A device's change: the missing-device state, and what the pods holding it are told."""
        d, state = event.details, self.state
        resource, device = str(d.get("resource", "")), str(d.get("device", ""))
        holders = _strings(d.get("allocated_to"))
        if event.kind in (Kind.DEVICE_REMOVED, Kind.DEVICE_FLAPPING):
            # A flapping device counts as unavailable until its flapping ends present.
            self._missing(resource, device, holders)
            if event.kind is Kind.DEVICE_REMOVED and "incident" not in d:
                self.removed.setdefault(resource, []).append(device)
            for holder in holders:
                if (got := self._notes(holder)) is not None:
                    target = got[0].failed if event.kind is Kind.DEVICE_REMOVED else got[0].flapping
                    target.append(_held(resource, device, got[1]))
        elif event.kind is Kind.DEVICE_ADDED or (event.kind is Kind.DEVICE_FLAP_ENDED and d.get("present")):
            self._back(resource, device, added=event.kind is Kind.DEVICE_ADDED)
        elif event.kind is Kind.DEVICE_FLAP_ENDED:  # ended missing: it stays missing
            self._missing(resource, device, holders)
        elif event.kind is Kind.DEVICE_INCIDENT:
            for dev in _strings(d.get("devices")):
                state.setdefault(resource, {}).setdefault(dev, [])
            self.resources.add(resource)

    def _back(self, resource: str, device: str, *, added: bool) -> None:
        """A device back in allocatable (`added`), or whose flapping ended with it there."""
        state = self.state
        was = state.get(resource, {}).pop(device, None)
        if resource in state and not state[resource]:
            del state[resource]
        self.resources.add(resource)
        if added:
            self.added.setdefault(resource, []).append(device)
        for holder in sorted(set(was or [])):
            if (got := self._notes(holder)) is not None:
                got[0].recovered.append(_held(resource, device, got[1]))

    def _missing(self, resource: str, device: str, holders: list[str]) -> None:
        before = self.state.get(resource, {}).get(device, [])
        self.state.setdefault(resource, {})[device] = sorted(set(before) | set(holders))
        self.resources.add(resource)

    def node_summaries(self, node: str) -> list[KubeEvent]:
        """One Node Event per resource whose devices left, or joined, allocatable in the batch."""
        out = []
        for resource, devices in sorted(self.removed.items()):
            hit = pods_of(h for dev in devices for h in self.state.get(resource, {}).get(dev, []))
            note = f"{len(devices)} {resource} device(s) left allocatable (unhealthy or unplugged): "
            note += listed(devices)
            if hit:
                note += f"; allocated to {listed(hit)}"
                known = [self.who[key] for p in hit if (key := _split(p)) in self.who]
                note = _owner_first(note, {"pods": known})
            out.append(_node_event(node, "Warning", "DeviceRemoved", note))
        for resource, devices in sorted(self.added.items()):
            note = (
                f"{len(devices)} {resource} device(s) joined or came back to allocatable: {listed(devices)}"
            )
            out.append(_node_event(node, "Normal", "DeviceAdded", note))
        return out

    def pod_events(self, node: str) -> list[KubeEvent]:
        """One Event per Pod and reason: its devices that failed, flap, or are back."""
        out = []
        for (namespace, name), n in sorted(self.pods.items()):
            its = self.who.get((namespace, name))
            regarding = Regarding("Pod", name, namespace, str(its["uid"]) if its else "")
            first = owner_text({"pods": [its]}) if its else None
            head = f"{first}: " if first else ""
            if n.failed:
                note = head + (
                    f"{len(n.failed)} device(s) allocated to this pod left the node's allocatable devices "
                    f"(failed or vanished) on node {node}: {listed(n.failed)}"
                )
                out.append(KubeEvent(regarding, "Warning", "DeviceFailed", fit(note, MAX_NOTE_BYTES)))
            if n.flapping:
                note = head + (
                    f"device(s) allocated to this pod keep failing and coming back on node {node}: "
                    f"{listed(n.flapping)}"
                )
                out.append(KubeEvent(regarding, "Warning", "DeviceFlapping", fit(note, MAX_NOTE_BYTES)))
            if n.recovered:
                note = (
                    head + f"device(s) allocated to this pod are back on node {node}: {listed(n.recovered)}"
                )
                out.append(KubeEvent(regarding, "Normal", "DeviceRecovered", fit(note, MAX_NOTE_BYTES)))
        return out


def _time_of(event: Event) -> datetime:
    try:
        return datetime.fromisoformat(event.time.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return datetime.now(UTC)  # never: the agent writes its own times


def _owner_first(text: str, details: Mapping[str, Any]) -> str:
    """`text` after the owner of the pods `details` names (watcher.model.devicehealth.affected),
    if it has one."""
    owner = owner_text(details)
    return text if owner is None else f"{owner}: {text}"


def _split(pod: str) -> tuple[str, str]:
    namespace, _, name = pod.partition("/")
    return namespace, name


def _held(resource: str, device: str, container: str) -> str:
    return f"{resource} {device}" + (f" (container {container})" if container else "")


def _node_event(node: str, kind: Literal["Normal", "Warning"], reason: str, note: str) -> KubeEvent:
    return KubeEvent(Regarding("Node", node), kind, reason, fit(printable(note), MAX_NOTE_BYTES))


def _reconcile(state: Missing, summary: Any, allocatable: Any) -> set[str] | None:
    """From an inventory the agent reports whole (at start, and in every inventory.snapshot): every
    device resource on the node gets its condition set, a device the saved state has as missing but
    that is allocatable now is not missing (positive evidence only: it is there), and a device held
    by a pod but absent from allocatable is missing whatever the saved state says. Returns the
    resources, or None when there is no inventory to reconcile with (the kubelet not reachable yet,
    or List-only: nothing can be called present or missing then, so nothing changes).

    Clearing only on presence is what makes a restart safe both ways: the saved state may miss a
    device.added (a flap that ended while the agent was away, events dropped by the queue's caps),
    and a kubelet warming up lists no device at all, which clears nothing."""
    if not isinstance(summary, Mapping) or not summary.get("allocatable_known"):
        return None
    for resource in [r for r in state if _is_dra_driver(r)]:
        # A DRA driver's devices are no device-plugin resource: an earlier version let a taint-only
        # story set its condition and never cleared it. Dropped here, the start prunes it.
        del state[resource]
    devices = summary.get("devices")
    counts = devices if isinstance(devices, Mapping) else {}
    present = allocatable if isinstance(allocatable, Mapping) else {}
    for resource in list(state):
        ids = present.get(resource)
        if isinstance(ids, list | tuple | Mapping):
            for device in [d for d in state[resource] if d in ids]:
                del state[resource][device]
        if not state[resource]:
            del state[resource]
    resources = set(state) | {str(r) for r in counts}
    for m in summary.get("missing_devices") or []:
        if not isinstance(m, Mapping):
            continue
        resource = str(m.get("resource", ""))
        # A resource with no allocatable device at all is warming up (its plugin has not registered
        # since a kubelet restart) or its plugin is gone: the agent's settling reports that as
        # device.removed if it lasts, so it is not called missing here. Held by a pod while its
        # siblings are allocatable, a device is missing for real.
        if counts.get(resource):
            state.setdefault(resource, {})[str(m.get("device", ""))] = _strings(m.get("allocated_to"))
            resources.add(resource)
    return resources


def _is_dra_driver(resource: str) -> bool:
    """A device plugin's resource is always `domain/name` (an extended resource); a DRA driver's
    name, which DRA device events carry as their resource, has no slash."""
    return "/" not in resource
