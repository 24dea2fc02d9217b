"""KubeApi: the agent's one way to the API server, shared by the kubernetes sink and every source
that reads the API: one client, made on first use, and one limiter, so that `api_rate` bounds all
the agent asks of a server the whole cluster shares."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from watcher.kubeapi.client import call, connect
from watcher.kubeapi.settings import ConnectionSettings
from watcher.ratelimit import RateLimiter

if TYPE_CHECKING:  # imported for real only when the API is first used
    from lightkube import AsyncClient

__all__ = ["KubeApi"]


class KubeApi:
    def __init__(self, connection: ConnectionSettings, *, field_manager: str) -> None:
        self.connection = connection
        self.field_manager = field_manager
        self.limiter = RateLimiter(connection.api_rate)
        self._client: AsyncClient | None = None

    def client(self) -> AsyncClient:
        """The client, made on first use (KubernetesError: the configuration is unusable)."""
        if self._client is None:
            self._client = connect(self.connection, field_manager=self.field_manager)
        return self._client

    async def call(self, request: Awaitable[Any]) -> Any:
        """One request, paced by the shared limiter; its failure as RefusedError."""
        return await call(self.limiter, request)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
