"""`snapshot`'s look at the kubelet's Pods API: ListPods once, each pod's uid, owner and allowlisted
labels, and the kubelet's verdict on each device its pods hold (device plugins and DRA drivers, with
the drivers' words), for a table or JSON. The Pods API is extra: when it cannot be read (refused, or
an answer that is not protobuf), the snapshot is printed as before with one line saying why; pods in
the answer that are not Pod messages are left out, each named by its place in the answer."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from watcher import errors
from watcher.model.devicehealth.holders import claim_object_of
from watcher.model.devicehealth.pods import HEALTHY, UNHEALTHY, DeviceVerdict, PodMeta
from watcher.model.inventory import Inventory
from watcher.snapshot.common import patiently, table
from watcher.sources.pods_api.client import PodsApiClient
from watcher.sources.pods_api.decoding import pod_meta

__all__ = ["PodsView", "default_pods_socket", "format_pods_json", "format_pods_table", "read_pods"]

_RANK = {UNHEALTHY: 0, HEALTHY: 2}  # anything else (Unknown, a newer word) between the two
UNDECODED_SHOWN = 10  # pods that did not decode named in the table; JSON names them all


@dataclass(frozen=True)
class PodsView:
    """What ListPods said once: the pods in namespace/name order, or why it was not read."""

    pods: tuple[PodMeta, ...] = ()
    unavailable: str | None = None  # why the Pods API was not read (None: it was)
    undecoded: tuple[str, ...] = ()  # each pod that did not decode: where it was in the answer, why

    @property
    def skipped(self) -> int:
        """How many pods did not decode."""
        return len(self.undecoded)

    def verdicts(self) -> list[tuple[PodMeta, DeviceVerdict]]:
        """Every pod's device verdicts, the non-Healthy first (Unhealthy, then Unknown)."""
        pairs = [(pod, v) for pod in self.pods for v in pod.verdicts]
        return sorted(
            pairs,
            key=lambda p: (
                _RANK.get(p[1].health, 1),
                p[0].key,
                p[1].container,
                p[1].resource,
                p[1].resource_id,
            ),
        )


def default_pods_socket(pod_resources_socket: str) -> Path:
    """The Pods API's socket under the kubelet root dir that holds `pod_resources_socket`
    (`<root>/pod-resources/kubelet.sock` -> `<root>/pods-api/pods-api.sock`)."""
    return Path(pod_resources_socket).parent.parent / "pods-api" / "pods-api.sock"


async def read_pods(client: PodsApiClient, *, labels: Collection[str]) -> PodsView:
    """ListPods once (a rate limit retried, as the pod-resources calls are); never raises for what
    the kubelet answers: a refusal becomes the view's `unavailable` reason."""
    try:
        raws = await patiently(client.list_pods)
    except errors.SocketMissingError:
        return PodsView(
            unavailable=f"no socket at {client.socket_path} (a kubelet before 1.37, or its PodsAPI gate off)"
        )
    except errors.KubeletError as err:
        return PodsView(unavailable=str(err))
    except DecodeError as err:
        # Not one pod in it can be read: the same as a refusal, the pod-resources part stands.
        return PodsView(
            unavailable=f"the ListPods answer on {client.socket_path} is not protobuf ({err}): "
            "the kubelet's Pods API is broken, or the socket is not a kubelet's"
        )
    pods, undecoded = [], []
    for position, raw in enumerate(raws, 1):
        try:
            pods.append(pod_meta(raw, labels=labels))
        except errors.PodDecodeError as err:
            # A pod that does not decode has no name we could trust: its place in the answer (uid
            # order) tells it apart; the error says why, with its size.
            undecoded.append(f"pod {position} of {len(raws)} in ListPods' answer: {err}")
    pods.sort(key=lambda p: (p.namespace, p.name, p.uid))
    return PodsView(tuple(pods), None, tuple(undecoded))


def _owner(pod: PodMeta) -> str:
    return f"{pod.owner.kind}/{pod.owner.name}" if pod.owner is not None else "-"


def _claim_object(pod: PodMeta, v: DeviceVerdict, inventory: Inventory | None) -> str | None:
    held = inventory.pod(pod.namespace, pod.name) if inventory is not None else None
    return claim_object_of(held, pod, v)


def _resource(pod: PodMeta, v: DeviceVerdict, inventory: Inventory | None) -> str:
    obj = _claim_object(pod, v, inventory)
    return f"{v.resource} (ResourceClaim {obj})" if obj else v.resource


def format_pods_table(view: PodsView, inventory: Inventory | None = None) -> list[str]:
    """The table's lines for the Pods API (each line made printable by the caller)."""
    if view.unavailable is not None:
        return ["", f"note: Pods API not available: {view.unavailable}"]
    out = ["", "PODS (Pods API)"]
    rows = [
        [pod.key, pod.uid, pod.phase or "-", _owner(pod), ", ".join(f"{k}={v}" for k, v in pod.labels) or "-"]
        for pod in view.pods
    ]
    out += table(["POD", "UID", "PHASE", "OWNER", "LABELS"], rows) if rows else ["(none)"]
    if view.skipped:
        out.append(f"({view.skipped} pods did not decode and are left out)")
        out += [f"  {line}" for line in view.undecoded[:UNDECODED_SHOWN]]
        if view.skipped > UNDECODED_SHOWN:
            out.append(f"  ... and {view.skipped - UNDECODED_SHOWN} more (--output json names them all)")
    out += ["", "DEVICE HEALTH (the kubelet's verdicts, not Healthy first)"]
    verdicts = [
        [pod.key, v.container, _resource(pod, v, inventory), v.resource_id, v.health, v.message or "-"]
        for pod, v in view.verdicts()
    ]
    header = ["POD", "CONTAINER", "RESOURCE", "DEVICE", "HEALTH", "MESSAGE"]
    out += table(header, verdicts) if verdicts else ["(none)"]
    return out


def format_pods_json(view: PodsView, inventory: Inventory | None = None) -> dict[str, Any]:
    """The JSON document's `pods_api` field."""
    return {
        "available": view.unavailable is None,
        "reason": view.unavailable,
        "skipped": view.skipped,
        "undecoded": list(view.undecoded),
        "pods": [
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "phase": pod.phase,
                **pod.who(),
            }
            for pod in view.pods
        ],
        "devices": [
            {
                "namespace": pod.namespace,
                "pod": pod.name,
                "pod_uid": pod.uid,
                "container": v.container,
                "resource": v.resource,
                "resource_id": v.resource_id,
                "health": v.health,
                "message": v.message,
                "claim": _claim_object(pod, v, inventory),
            }
            for pod, v in view.verdicts()
        ],
    }
