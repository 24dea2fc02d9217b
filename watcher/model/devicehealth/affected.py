"""Who is hit: the pods a change is about, named as the Pods API names them (uid, controller,
allowlisted labels), and the short text a person reads first ("Job ml/llm-pretrain (team research)").
Pure.

pod-resources names a pod by namespace and name only, and a name is reused: the uid says which pod
it was. What is added comes from the `PodIndex` alone; a pod it does not know gains nothing, so an
event never carries a guessed owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from watcher.model.changes import Change, Kind
from watcher.model.devicehealth.pods import PodIndex, PodMeta
from watcher.model.wording import printable

__all__ = ["OWNER_LABELS", "annotate", "hit_pods", "owner_text"]

# The labels a person looks for next to the owner: which team, which larger application.
OWNER_LABELS = ("team", "app.kubernetes.io/part-of")


def annotate(
    changes: Sequence[Change], pods: PodIndex, gone: Mapping[tuple[str, str], PodMeta] | None = None
) -> list[Change]:
    """`changes` with what the index knows of the pods they name. A change about one pod (details
    `namespace` and `pod`) gains `pod_uid`, `owner` and `labels`; a change naming holders
    (`allocated_to`: "namespace/pod/container") gains `pods`, one entry per known pod, sorted.
    `gone`: pods the watch saw end since the last look, by (namespace, name): their removal is
    named as their arrival was (the index forgot them already), and an `allocation.removed` under
    a name a new pod took names the old pod whose holdings went, not the new one. Summaries stay as
    they are; a change with nothing to add is returned as it is."""
    lookup = _Lookup(pods, gone or {})
    return [_annotated(change, lookup) for change in changes]


class _Lookup:
    def __init__(self, pods: PodIndex, gone: Mapping[tuple[str, str], PodMeta]) -> None:
        self.pods, self.gone = pods, gone

    def get(self, namespace: str, name: str, *, removed: bool = False) -> PodMeta | None:
        """The pod named so now; for a removal (`removed`), the pod that ended under the name first."""
        ended = self.gone.get((namespace, name))
        if removed and ended is not None:
            return ended
        meta = self.pods.get(namespace, name)
        return meta if meta is not None else ended


def _annotated(change: Change, pods: _Lookup) -> Change:
    details = change.details
    more: dict[str, Any] = {}
    namespace, name = details.get("namespace"), details.get("pod")
    if isinstance(namespace, str) and isinstance(name, str):
        meta = pods.get(namespace, name, removed=change.kind == Kind.ALLOCATION_REMOVED)
        if meta is not None:
            who = meta.who()
            more.update(pod_uid=who["uid"], owner=who["owner"], labels=who["labels"])
    holders = details.get("allocated_to")
    if isinstance(holders, list | tuple):
        known: dict[tuple[str, str], dict[str, Any]] = {}
        for holder in holders:
            key = _pod_of(holder)
            if key is None or key in known:
                continue
            meta = pods.get(*key)
            if meta is not None:
                who = meta.who()
                known[key] = {"namespace": key[0], "name": key[1], **who}
        if known:
            more["pods"] = [known[key] for key in sorted(known)]
    if not more:
        return change
    return Change(change.kind, change.severity, change.summary, {**details, **more})


def _pod_of(holder: Any) -> tuple[str, str] | None:
    if not isinstance(holder, str):
        return None
    parts = holder.split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def hit_pods(details: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pods an annotated change names, each as a `pods` entry (namespace, name, uid, owner,
    labels): the one pod of a single-pod change, else its `pods`. Malformed entries are left out."""
    uid, namespace, name = details.get("pod_uid"), details.get("namespace"), details.get("pod")
    if isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str):
        return [
            {
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "owner": details.get("owner"),
                "labels": details.get("labels"),
            }
        ]
    entries = details.get("pods")
    if not isinstance(entries, list | tuple):
        return []
    return [
        e
        for e in entries
        if isinstance(e, Mapping) and all(isinstance(e.get(k), str) for k in ("namespace", "name", "uid"))
    ]


def owner_text(details: Mapping[str, Any]) -> str | None:
    """What a person reads first about an annotated change: the owner's kind and namespace/name,
    then its `team` and `app.kubernetes.io/part-of` labels, e.g. "Job ml/llm-pretrain (team
    research)"; for several pods the first owner and "+N more" (the other owners, and pods without
    one). None when no pod named has an owner: the texts then read as they always did."""
    pods = hit_pods(details)
    first: str | None = None
    seen: set[tuple[str, ...]] = set()
    for pod in pods:
        owner = _owner(pod.get("owner"))
        if owner is not None:
            seen.add(("owner", pod["namespace"], owner["kind"], owner["name"], str(owner.get("uid", ""))))
            if first is None:
                first = _named(pod["namespace"], owner, pod.get("labels"))
        else:
            seen.add(("pod", pod["namespace"], pod["name"]))
    if first is None:
        return None
    return first if len(seen) == 1 else f"{first} +{len(seen) - 1} more"


def _owner(owner: Any) -> Mapping[str, Any] | None:
    """`owner` when it names a kind and a name, else None."""
    if isinstance(owner, Mapping) and all(
        isinstance(owner.get(k), str) and owner[k] for k in ("kind", "name")
    ):
        return owner
    return None


def _named(namespace: str, owner: Mapping[str, Any], labels: Any) -> str:
    text = f"{printable(owner['kind'])} {printable(namespace)}/{printable(owner['name'])}"
    if isinstance(labels, Mapping):
        shown = [
            f"{key.rsplit('/', 1)[-1]} {printable(value)}"
            for key in OWNER_LABELS
            if isinstance(value := labels.get(key), str) and value
        ]
        if shown:
            text += f" ({', '.join(shown)})"
    return text
