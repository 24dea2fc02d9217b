"""Pod reads: what the Pods API watch says changed, re-read for those pods alone.

The watch tells which pods changed. A pod whose holdings may have changed (new, finished, deleted,
a new spec) is read again with pod-resources `Get` for that pod and put into the inventory in place
of its old entry; a pod that only changed its status (device health, labels) needs no kubelet call
at all. Everything else (the socket replaced, a state file rewritten, the timer, a fresh snapshot
after the watch reconnected, more pods at once than reads are worth) goes the whole `List` way.

pod-resources names a pod by namespace and name, and a name is reused (a StatefulSet's pod deleted
and recreated), so what is pending is keyed by uid and the name is only how the kubelet is asked.
pod-resources is the truth for what is held: a DELETED is a reason to read the name again, not a
removal by itself (a force-deleted pod's containers may still run and hold their devices). A new
pod that takes the name of one whose holdings the inventory shows renews the name: one cycle takes
the old entry out (its `allocation.removed` names the old pod), the next reads the new pod.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog
from google.protobuf.message import DecodeError

from watcher import errors
from watcher.kubelet.client import PodResourcesClient
from watcher.kubelet.triggers import Trigger
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build_pod
from watcher.model.devicehealth.pods import PodIndex, PodMeta
from watcher.model.inventory import Inventory
from watcher.model.records import Pod
from watcher.ratelimit import RateLimiter

if TYPE_CHECKING:  # the watch itself runs beside the reactor, not under it
    from watcher.sources.pods_api.watch import PodChange

__all__ = [
    "PLUGIN_HEALTH",
    "PodAnswers",
    "PodReads",
    "POD_READS",
    "POD_STATUS",
    "RESYNC",
    "READS_MAX",
    "TERMINAL_PHASES",
]

log = structlog.get_logger("watcher.sources.pods_api.reads")

# The trigger reasons the watch fires: pods to read, a status to look at, a fresh snapshot, and a
# device plugin's device whose health a pod's status changed (a whole look: see on_changes).
POD_READS, POD_STATUS, RESYNC = "pods-api", "pod-status", "pods-api-resync"
PLUGIN_HEALTH = "pod-status-plugin-health"
# More pods than this changed at once: one List is cheaper than their Gets (the kubelet's limiter
# allows a burst of 10, shared by every client on the node).
READS_MAX = 4
# pod-resources List shows active pods only, while Get still answers a finished one (it looks among
# every pod the kubelet knows): a finished pod is taken out, not read.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

PodKey = tuple[str, str]  # (namespace, name)
PodAnswers = dict[PodKey, Pod | None]  # a read's answers (None: the kubelet no longer has it)


class PodReads:
    """The pods the watch named since the last cycle, and how the next cycle can serve them."""

    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger
        # The watch's index (the app sets it when it runs the watch): which pods have a name now.
        self.index: PodIndex | None = None
        # uid -> (its name, True: read the name with Get; False: it finished, take the name out).
        self.pending: dict[str, tuple[PodKey, bool]] = {}
        self.get_disabled: str | None = None  # why Get cannot be used (this kubelet disabled it)
        # Pods that finished, and older pods a new one took the name from, since the last cycle took
        # them: their allocation.removed names them, not whichever pod has the name now.
        self.gone: dict[PodKey, PodMeta] = {}
        # Deleted pods whose holdings pod-resources may still list under their name (the watch's
        # index forgot them at once): each stays until a cycle's inventory no longer has the name
        # (its removal names it) or a new pod takes the name.
        self.deleted: dict[PodKey, PodMeta] = {}
        # Names a new pod took while the inventory shows an older pod's holdings under them.
        self.renewed: dict[PodKey, PodMeta] = {}
        # Older pods whose name a newer one took: what they still say (a late status update, their
        # DELETED) is not about the name's holdings. Each leaves with its DELETED, its last event.
        self.superseded: set[str] = set()

    def on_changes(self, changes: Sequence[PodChange], resync: bool) -> None:
        """The watch's callback: note what to read, fire the trigger (cheap; the stream goes on)."""
        reads = status = plugin = False
        new: list[PodMeta] = []
        for change in changes:
            meta = change.after or change.before
            if meta is None:
                continue
            if not change.resources:
                status = True
                plugin = plugin or _plugin_health_changed(change.before, change.after)
            elif change.uid in self.superseded:
                if change.after is None:
                    self.superseded.discard(change.uid)  # its last event
            elif change.before is None:
                new.append(meta)  # after the ended ones: a batch may end the pod it replaces
            else:
                reads = self._ended_or_changed(meta, change.before, change.after) or reads
        for meta in new:
            self._arrived(meta)
            reads = True
        if resync and any(c.resources for c in changes):
            self.pending.clear()  # a fresh snapshot's differences: the whole List way
            self.trigger.fire(RESYNC, urgent=True)
        elif reads:
            # Not debounced: one pod's change is read at once; what comes while the cycle runs joins
            # the next one anyway.
            self.trigger.fire(POD_READS, urgent=True)
        if status:
            self.trigger.fire(POD_STATUS, urgent=True)
        if plugin:
            # The kubelet puts a plugin device's new health in its holders' statuses after its
            # device manager took the device out of (or back into) allocatable: milliseconds after
            # the plugin said so when the pod worker syncs at once, up to its one-second relist when
            # changes come back to back; the checkpoint it rewrites is seen up to a watch step
            # later. A whole look now sees the device go or come back that much sooner.
            self.trigger.fire(PLUGIN_HEALTH, urgent=True)

    def _ended_or_changed(self, meta: PodMeta, before: PodMeta, after: PodMeta | None) -> bool:
        """Note a known pod's change; whether its name is to be read or taken out."""
        key = (meta.namespace, meta.name)
        if after is None:
            if before.phase in TERMINAL_PHASES:
                return False  # its entry went when it finished
            self.deleted[key] = before  # pod-resources decides whether its holdings went
        elif after.phase in TERMINAL_PHASES:
            self.gone[key] = before
        self.pending[meta.uid] = (key, after is None or after.phase not in TERMINAL_PHASES)
        return True

    def _arrived(self, meta: PodMeta) -> None:
        """A pod new to the watch: read its name, after taking out an older pod's entry under it."""
        key = (meta.namespace, meta.name)
        holder = self.index.get(*key) if self.index is not None else None
        if holder is not None and holder.uid != meta.uid:
            self.superseded.add(meta.uid)  # a newer pod has the name already (a snapshot with both)
            return
        old = self._displaced(key, meta.uid)
        if old is not None:
            self.renewed.setdefault(key, old)
            self.pending.pop(old.uid, None)
            self.deleted.pop(key, None)
            if self.index is not None and old.uid in self.index:
                self.superseded.add(old.uid)  # until its DELETED
        self.pending[meta.uid] = (key, True)

    def _displaced(self, key: PodKey, uid: str) -> PodMeta | None:
        """The older pod whose holdings the inventory may show under `key`, if any."""
        for known in (self.deleted.get(key), self.gone.get(key)):
            if known is not None and known.uid != uid:
                return known
        for pod in reversed(self.index.named(*key) if self.index is not None else ()):
            if pod.uid != uid and pod.uid not in self.superseded and pod.phase not in TERMINAL_PHASES:
                return pod
        return None

    def serve(self, reasons: Collection[str], *, usable: bool) -> dict[PodKey, bool] | None:
        """The pods a cycle for `reasons` reads alone (empty: none, a status look), or None when it
        must List (`usable` False: no inventory yet, the kubelet failing or warming up).

        A renewed name first gets a cycle of its own that only takes the old pod's entry out (no
        call): the old pod's allocation.removed, then the new one's allocation.added, never an
        allocation.changed that would make two pods one. What `reasons` asked for comes next."""
        renewed, self.renewed = self.renewed, {}
        self.gone.update(renewed)  # this cycle's removals under those names are the old pods'
        if renewed and usable:
            for reason in reasons:
                self.trigger.fire(reason, urgent=True)
            return dict.fromkeys(renewed, False)
        pending, self.pending = self.pending, {}
        ours = {POD_READS, POD_STATUS}
        if not usable or not reasons or not set(reasons) <= ours:
            return None
        wanted: dict[PodKey, bool] = {}
        for key, read in pending.values():
            wanted[key] = wanted.get(key, False) or read
        reads = [key for key, read in wanted.items() if read]
        if len(reads) > READS_MAX or (reads and self.get_disabled is not None):
            return None
        return wanted

    def take_gone(self, after: Inventory | None = None) -> dict[PodKey, PodMeta]:
        """The pods that ended, by name, for the cycle that reports their removal (`after`, its
        inventory). A deleted pod whose name `after` still has stays for a later cycle."""
        gone, self.gone = self.gone, {}
        for key, meta in list(self.deleted.items()):
            gone.setdefault(key, meta)
            if after is not None and after.pod(*key) is None:
                del self.deleted[key]
        return gone

    async def read(
        self, client: PodResourcesClient, limiter: RateLimiter, pods: Mapping[PodKey, bool]
    ) -> PodAnswers | None:
        """Each pod to read, as Get answers it now (None: the kubelet no longer has it, or it
        ended); None when the cycle must List instead (this kubelet has Get disabled, and later
        cycles List too; or an answer did not parse). Raises the kubelet's other errors as List would."""
        out: dict[PodKey, Pod | None] = {}
        for (namespace, name), read in pods.items():
            if not read:
                out[(namespace, name)] = None
                continue
            await limiter.acquire()
            try:
                raw = await client.get_raw(namespace, name)
            except (errors.KubeletUnavailableError, errors.SocketMissingError):
                limiter.refund(1)  # nobody answered: the kubelet's limiter never saw it
                raise
            except errors.PodNotFoundError:
                limiter.answered(1)
                out[(namespace, name)] = None  # gone between the watch's word and our read
                continue
            except (errors.MethodDisabledError, errors.MethodNotImplementedError) as err:
                limiter.answered(1)
                self.get_disabled = str(err)
                log.info("pod-resources Get is not available: pod changes are read with List", error=str(err))
                return None
            limiter.answered(1)
            try:
                answer = api_pb2.GetPodResourcesResponse.FromString(raw).pod_resources
            except DecodeError as err:
                # List's way repairs invalid text, or says what is wrong with the answer.
                log.warning(
                    "Get answered bytes that do not parse; reading with List",
                    pod=f"{namespace}/{name}",
                    error=str(err),
                )
                return None
            out[(namespace, name)] = build_pod(namespace, name, [answer])
        return out


def _plugin_health_changed(before: PodMeta | None, after: PodMeta | None) -> bool:
    """Whether a device plugin's device (not a DRA claim's) the pod held before changed health in
    its status. Verdicts appearing (a new pod's first container statuses) or going are no health
    change: they must not cost a whole look each."""
    if before is None or after is None:
        return False

    def plugin(meta: PodMeta) -> dict[tuple[str, str, str], str]:
        return {(v.container, v.resource, v.resource_id): v.health for v in meta.verdicts if not v.is_claim}

    was, now = plugin(before), plugin(after)
    return any(now[key] != health for key, health in was.items() if key in now)
