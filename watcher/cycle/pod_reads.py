"""Pod reads: what the Pods API watch says changed, re-read for those pods alone.

The watch tells which pods changed. A pod whose holdings may have changed (new, finished, deleted,
a new spec) is read again with pod-resources `Get` for that pod and put into the inventory in place
of its old entry; a pod that only changed its status (device health, labels) needs no kubelet call
at all. Everything else (the socket replaced, a state file rewritten, the timer, a fresh snapshot
after the watch reconnected, more pods at once than reads are worth) goes the whole `List` way.
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
from watcher.model.pod_meta import PodMeta
from watcher.model.records import Pod
from watcher.ratelimit import RateLimiter

if TYPE_CHECKING:  # the watch itself runs beside the reactor, not under it
    from watcher.kubelet.pods_watch import PodChange

__all__ = ["PodAnswers", "PodReads", "POD_READS", "POD_STATUS", "RESYNC", "READS_MAX", "TERMINAL_PHASES"]

log = structlog.get_logger("watcher.cycle.pod_reads")

# The trigger reasons the watch fires: pods to read, a status to look at, a fresh snapshot.
POD_READS, POD_STATUS, RESYNC = "pods-api", "pod-status", "pods-api-resync"
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
        # (namespace, name) -> True: read it with Get; False: it ended, take it out.
        self.pending: dict[PodKey, bool] = {}
        self.get_disabled: str | None = None  # why Get cannot be used (this kubelet disabled it)
        # Pods the watch saw end (deleted, finished) since the last cycle took them: the watch's
        # index forgets a deleted pod at once, and its allocation.removed should still name it.
        self.gone: dict[PodKey, PodMeta] = {}

    def on_changes(self, changes: Sequence[PodChange], resync: bool) -> None:
        """The watch's callback: note what to read, fire the trigger (cheap; the stream goes on)."""
        reads = status = False
        for change in changes:
            meta = change.after or change.before
            if meta is None:
                continue
            if not change.resources:
                status = True
                continue
            ended = change.after is None or change.after.phase in TERMINAL_PHASES
            if ended and change.before is not None:
                self.gone[(meta.namespace, meta.name)] = change.before
            if resync:
                continue  # a fresh snapshot's differences: the whole List way, below
            self.pending[(meta.namespace, meta.name)] = not ended
            reads = True
        if resync and any(c.resources for c in changes):
            self.pending.clear()
            self.trigger.fire(RESYNC, urgent=True)
        elif reads:
            # Not debounced: one pod's change is read at once; what comes while the cycle runs joins
            # the next one anyway.
            self.trigger.fire(POD_READS, urgent=True)
        if status:
            self.trigger.fire(POD_STATUS, urgent=True)

    def serve(self, reasons: Collection[str], *, usable: bool) -> dict[PodKey, bool] | None:
        """The pods a cycle for `reasons` reads alone (empty: none, a status look), or None when it
        must List (`usable` False: no inventory yet, the kubelet failing or warming up)."""
        pending, self.pending = self.pending, {}
        ours = {POD_READS, POD_STATUS}
        if not usable or not reasons or not set(reasons) <= ours:
            return None
        reads = [key for key, read in pending.items() if read]
        if len(reads) > READS_MAX or (reads and self.get_disabled is not None):
            return None
        return pending

    def take_gone(self) -> dict[PodKey, PodMeta]:
        """The pods that ended since the last call, for the cycle that reports their removal."""
        gone, self.gone = self.gone, {}
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
