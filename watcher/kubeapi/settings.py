"""How the agent reaches the Kubernetes API server: the `[kubernetes]` section, and the connection
fields every user of the API (the kubernetes sink, the sources that read the API) has in common."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from watcher.config import field_meta

__all__ = ["SERVICE_ACCOUNT_DIR", "ConnectionSettings", "KubernetesApiSettings"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class ConnectionSettings:
    """How a client connects: `[kubernetes]`'s keys, and a kubernetes sink's own (older configs)."""

    kubeconfig: Path | None = field(
        default=None,
        metadata=field_meta(
            "A kubeconfig file to connect with (the systemd deployment). Unset: in-cluster, with the "
            "pod's service-account token (re-read as it rotates) and CA from service_account_dir."
        ),
    )
    context: str | None = field(
        default=None, metadata=field_meta("The kubeconfig context to use (unset: its current-context).")
    )
    server: str | None = field(
        default=None,
        metadata=field_meta(
            "In-cluster only: the API server URL. Unset: https://$KUBERNETES_SERVICE_HOST:"
            "$KUBERNETES_SERVICE_PORT, as Kubernetes sets them in every pod."
        ),
    )
    service_account_dir: Path = field(
        default=SERVICE_ACCOUNT_DIR,
        metadata=field_meta("In-cluster only: where the service-account token, ca.crt and namespace are."),
    )
    api_rate: float = field(
        default=5.0,
        metadata=field_meta(
            "Most API requests per second, for everything the agent asks of the API server together "
            "(its sink's writes and its sources' reads share one limiter).",
            min=0.1,
            max=100,
        ),
    )
    timeout: float = field(
        default=10.0, metadata=field_meta("API request timeout, seconds.", min=0.1, max=300)
    )

    def connection_fields(self) -> tuple[object, ...]:
        """The connection as a value: two settings with equal ones reach the API server alike."""
        return tuple(getattr(self, f.name) for f in fields(ConnectionSettings))


@dataclass(frozen=True)
class KubernetesApiSettings(ConnectionSettings):
    api: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=field_meta(
            "Whether the agent's sources read the API server. auto: where a `kubernetes` sink is "
            "configured; on: always (the sources that read the API, such as [resource_slices], then "
            "work without the sink, with the RBAC they need); off: never (a kubernetes sink still "
            "writes, with its own connection)."
        ),
    )

    def connection_is_default(self) -> bool:
        """No connection field set: a kubernetes sink's own fields then say how to connect."""
        return self.connection_fields() == ConnectionSettings().connection_fields()
