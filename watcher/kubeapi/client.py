"""The Kubernetes API client: made from the kubeconfig or the pod's service account, each request
paced and its failure one RefusedError."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from watcher.kubeapi.kubeconfig import KubernetesError, client_config
from watcher.kubeapi.settings import ConnectionSettings
from watcher.ratelimit import RateLimiter
from watcher.retry_after import parse_retry_after
from watcher.secrets import redact

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube import AsyncClient

__all__ = ["KubernetesError", "RefusedError", "call", "connect"]

# Answers worth another try later: unauthorized (a token rotating), timeout, conflict, too many requests.
_RETRYABLE = (401, 408, 409, 429)


def connect(settings: ConnectionSettings, *, field_manager: str) -> AsyncClient:
    """A client for the settings: the kubeconfig, or in-cluster from the service-account files."""
    import httpx2
    from lightkube import AsyncClient
    from lightkube import ConfigError as LightkubeConfigError

    single = client_config(settings)
    try:
        return AsyncClient(
            config=single,
            timeout=httpx2.Timeout(settings.timeout),
            field_manager=field_manager.replace("/", "-")[:128],
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

    slot = await limiter.acquire()
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
        # and now, and only now keeps every one-second window at the server within the rate. This
        # call's own slot: the sink's writes and the sources' lists share the limiter in flight.
        limiter.answered_slot(slot)
