"""One Pod from the kubelet's Pods API (raw core/v1 Pod bytes) -> a PodMeta, within bounds.

The Pod message can be megabytes (annotations, a long spec); the agent keeps only the few fields
events use, so the decoded message is dropped as soon as they are copied out: a 10,000-pod snapshot
leaves 10,000 small PodMeta records behind, not the objects. Everything is put in one canonical
order (the kubelet lists resources in Go map order), so an unchanged pod decodes to an equal PodMeta
and a re-sent pod compares equal.

Nothing in a Pod is checked before it reaches the agent: users choose labels, drivers choose device
ids and messages. Strings are cut to bounded lengths, label values made printable, and the number
of device verdicts capped; bytes that are not UTF-8 come back escaped, never as an error.
"""

from __future__ import annotations

import sys
from collections.abc import Collection

from google.protobuf.message import DecodeError

from watcher import errors
from watcher.kubeletapi.k8s import core_v1_pb2
from watcher.model.devicehealth.pods import HEALTHY, DeviceVerdict, ExtendedRequest, Owner, PodMeta
from watcher.model.wording import printable

__all__ = ["LABEL_MAX", "MESSAGE_MAX", "NAME_MAX", "VERDICTS_MAX", "pod_meta", "pod_uid"]

LABEL_MAX = 63  # Kubernetes' own limit on a label value: a longer one is not a real label
MESSAGE_MAX = 1024  # a driver's message, in characters
NAME_MAX = 512  # names and ids: far above any real one, low enough that a hostile one costs little
VERDICTS_MAX = 256  # device verdicts kept per pod (a node has at most a few dozen devices)
CLAIMS_MAX = 256  # claims and extended-resource mappings kept per pod
_ELLIPSIS = "…"


def _text(value: object, limit: int) -> str:
    # proto2 strings that are not UTF-8 come back from upb as bytes instead of raising.
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + _ELLIPSIS
    return text


def _name(value: object) -> str:
    # Interned: namespaces, phases, resource names and health words repeat across 10,000 pods.
    return sys.intern(_text(value, NAME_MAX))


def _parse(raw: bytes) -> core_v1_pb2.Pod:
    try:
        pod = core_v1_pb2.Pod.FromString(raw)
    except DecodeError as err:
        raise errors.PodDecodeError(
            f"a pod from the Pods API is not a Pod message ({len(raw)} bytes: {err}): it is skipped; "
            "a kubelet that keeps sending such pods is broken or is not a kubelet"
        ) from err
    if not pod.metadata.uid:
        raise errors.PodDecodeError("a pod from the Pods API has no uid: it is skipped")
    return pod


def pod_uid(raw: bytes) -> str:
    """The uid of the pod in `raw` (all a DELETED event is read for)."""
    return _name(_parse(raw).metadata.uid)


def _owner(pod: core_v1_pb2.Pod) -> Owner | None:
    # Only the controller: a pod may have several owners, but only the controller (at most one,
    # the API server enforces it) manages it; any other owner is a garbage-collection link
    # whose name would mislead a person asking "what runs this pod".
    for ref in pod.metadata.ownerReferences:
        if ref.controller:
            return Owner(_name(ref.kind), _text(ref.name, NAME_MAX), _text(ref.uid, NAME_MAX))
    return None


def _labels(pod: core_v1_pb2.Pod, keys: Collection[str]) -> tuple[tuple[str, str], ...]:
    found = pod.metadata.labels
    return tuple(
        (key, printable(_text(found[key], 4 * LABEL_MAX))[:LABEL_MAX]) for key in sorted(keys) if key in found
    )


def _verdicts(pod: core_v1_pb2.Pod) -> tuple[tuple[DeviceVerdict, ...], int]:
    # Init containers get no allocatedResourcesStatus from the kubelet: containerStatuses only.
    entries = [
        (c.name, status.name, health)
        for c in pod.status.containerStatuses
        for status in c.allocatedResourcesStatus
        for health in status.resources
    ]
    dropped = max(0, len(entries) - VERDICTS_MAX)
    if dropped:
        # A hostile pod padding its status with healthy entries must not push a failure out.
        entries.sort(key=lambda e: e[2].health == HEALTHY)
        del entries[VERDICTS_MAX:]
    verdicts = [
        DeviceVerdict(
            container=_name(container),
            resource=_name(resource),
            resource_id=_name(health.resourceID),
            health=_name(health.health),
            message=_text(health.message, MESSAGE_MAX),
        )
        for container, resource, health in entries
    ]
    verdicts.sort(key=lambda v: (v.container, v.resource, v.resource_id, v.health, v.message))
    return tuple(verdicts), dropped


def _claims(pod: core_v1_pb2.Pod) -> tuple[tuple[str, str], ...]:
    # A claim the spec names directly (resourceClaimName) is that object; one made from a template
    # is named only in the status (resourceClaimStatuses). The status wins where both say.
    named: dict[str, str] = {}
    for c in pod.spec.resourceClaims[:CLAIMS_MAX]:
        if c.resourceClaimName:
            named[_name(c.name)] = _name(c.resourceClaimName)
    for s in pod.status.resourceClaimStatuses[:CLAIMS_MAX]:
        if s.resourceClaimName:
            named[_name(s.name)] = _name(s.resourceClaimName)
    return tuple(sorted(named.items())[:CLAIMS_MAX])


def _extended(pod: core_v1_pb2.Pod) -> tuple[str | None, tuple[ExtendedRequest, ...]]:
    if not pod.status.HasField("extendedResourceClaimStatus"):
        return None, ()
    status = pod.status.extendedResourceClaimStatus
    mappings = sorted(
        (
            ExtendedRequest(_name(m.containerName), _name(m.resourceName), _name(m.requestName))
            for m in status.requestMappings[:CLAIMS_MAX]
        ),
        key=lambda r: (r.container, r.resource, r.request),
    )
    return (_name(status.resourceClaimName) or None), tuple(mappings)


def _disruption(pod: core_v1_pb2.Pod) -> str:
    # The kubelet copies the condition an evicting controller wrote into the status it serves (it
    # owns the others); only a True one says the pod is being deleted.
    for c in pod.status.conditions:
        if c.type == "DisruptionTarget" and c.status == "True":
            return _name(c.reason)
    return ""


def _meta(pod: core_v1_pb2.Pod, labels: Collection[str]) -> PodMeta:
    verdicts, dropped = _verdicts(pod)
    extended_claim, extended = _extended(pod)
    meta = pod.metadata
    return PodMeta(
        uid=_name(meta.uid),
        namespace=_name(meta.namespace),
        name=_text(meta.name, NAME_MAX),
        phase=_name(pod.status.phase),
        generation=meta.generation,
        owner=_owner(pod),
        labels=_labels(pod, labels),
        verdicts=verdicts,
        claims=_claims(pod),
        extended_claim=extended_claim,
        extended=extended,
        dropped_verdicts=dropped,
        wants=_wants(pod) if pod.status.phase == "Pending" else (),
        # Only a failed pod's: a running pod's reason and message are no one's business here,
        # and an unchanged pod must decode equal.
        reason=_name(pod.status.reason) if pod.status.phase == "Failed" else "",
        message=_text(pod.status.message, MESSAGE_MAX) if pod.status.phase == "Failed" else "",
        disruption=_disruption(pod),
    )


def _wants(pod: core_v1_pb2.Pod) -> tuple[str, ...]:
    # Extended resources only (a domain-prefixed name, not kubernetes.io's cpu or memory), asked
    # for (a limit of 0 asks nothing), bounded.
    names = {
        _name(r)
        for c in (*pod.spec.initContainers, *pod.spec.containers)
        for r, q in c.resources.limits.items()
        if "/" in r and not r.startswith(("kubernetes.io/", "requests.", "hugepages-")) and q.string != "0"
    }
    return tuple(sorted(names)[:CLAIMS_MAX])


def pod_meta(raw: bytes, *, labels: Collection[str]) -> PodMeta:
    """The PodMeta of the Pod in `raw`, keeping only the label keys in `labels`.

    Raises PodDecodeError when `raw` is not a Pod message or the pod has no uid."""
    # The message is a temporary: the PodMeta holds copies of its strings, never a part of it.
    return _meta(_parse(raw), labels)
