"""A refusal of the API server as the kubernetes sink's delivery outcome: retried when a later try
may be answered otherwise, and said with what to fix when it will not."""

from __future__ import annotations

from watcher.kubeapi.client import RefusedError
from watcher.sinks.base import Outcome

__all__ = ["refused_outcome"]


def refused_outcome(err: RefusedError, what: str) -> Outcome:
    """The delivery's outcome for a refusal while doing `what`; a permanent one says what to fix."""
    error = f"{what}: {err}"
    # 409 reaches here only after CONFLICT_RETRIES re-reads: someone keeps writing the node; later.
    if err.retryable:
        return Outcome(retry=True, retry_after=err.retry_after, status=err.status, error=error)
    if err.status == 403:
        error += (
            " (the service account lacks this permission, or the admission policy refused it: "
            "apply deploy/overlays/kubernetes-reporting and check the node name)"
        )
    if err.status == 404:
        error += " (no such node in the API server: the agent's `node` must be the Kubernetes node name)"
    return Outcome(status=err.status, error=error)
