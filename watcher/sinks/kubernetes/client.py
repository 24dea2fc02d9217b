"""The Kubernetes API as the sink reaches it: a client from the kubeconfig or the pod's service
account, each request paced and its failure one RefusedError, and that error as an outcome."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from watcher.ratelimit import RateLimiter
from watcher.secrets import redact
from watcher.sinks.base import Outcome
from watcher.sinks.http import parse_retry_after
from watcher.sinks.kubernetes.kubeconfig import KubernetesError, client_config
from watcher.sinks.kubernetes.settings import KubernetesSinkSettings

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = ["KubernetesError", "RefusedError", "connect", "call", "refused_outcome"]

# Answers worth another try later: unauthorized (a token rotating), timeout, conflict, too many requests.
_RETRYABLE = (401, 408, 409, 429)


def connect(settings: KubernetesSinkSettings) -> AsyncClient:
    """A client for the settings: the kubeconfig, or in-cluster from the service-account files."""
    import httpx2
    from lightkube import AsyncClient
    from lightkube import ConfigError as LightkubeConfigError

    single = client_config(settings)
    try:
        return AsyncClient(
            config=single,
            timeout=httpx2.Timeout(settings.timeout),
            field_manager=settings.reporting_controller.replace("/", "-")[:128],
            trust_env=False,  # never a proxy from the environment between us and the API server
            lazy=False,
        )
    except (LightkubeConfigError, OSError, ValueError) as err:  # a CA or key file that is not one
        where = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the service account"
        raise KubernetesError(f"cannot set up the client from {where}: {err}") from None


@dataclass
class RefusedError(Exception):
    """The API server answered a request with an error status (or did not answer: status None)."""

    status: int | None
    message: str
    retry_after: float | None = None

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}" if self.status else self.message

    @property
    def retryable(self) -> bool:
        """Whether a later try may get another answer (no answer, a 5xx, or one of _RETRYABLE)."""
        return self.status is None or self.status in _RETRYABLE or self.status >= 500


async def call(limiter: RateLimiter, request: Awaitable[Any]) -> Any:
    """One API request, paced, its failure as RefusedError."""
    import httpx2
    from lightkube import ApiError

    await limiter.acquire()
    try:
        return await request
    except ApiError as err:
        retry_after = parse_retry_after(err.response.headers.get("Retry-After")) if err.response else None
        code = err.status.code if err.status is not None else None
        message = (err.status.message if err.status is not None else None) or str(err)
        raise RefusedError(code, message, retry_after) from err
    except httpx2.HTTPStatusError as err:  # an error answer that is not a Status object (a proxy's)
        response = err.response
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        raise RefusedError(response.status_code, redact(response.text[:200]), retry_after) from err
    except (httpx2.HTTPError, OSError, ValueError) as err:
        raise RefusedError(None, f"{type(err).__name__}: {err}") from err
    finally:
        # The slot counts from the answer: the server saw the request somewhere between the slot
        # and now, and only now keeps every one-second window at the server within the rate.
        limiter.answered(1)


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
