"""The fake API server (watcher.sim.apiserver) as the agent meets a cluster that installed
deploy/kubernetes/reporting: the user `AGENT` is the agent's service account with its token bound to
its Pod on the node, granted what the shipped ClusterRole grants (or the rules a test gives), the
shipped admission policy in force and every object checked against the strict schemas."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from testkit.admission_policy import review
from testkit.kube_rbac import SHIPPED_MANIFEST, rules_from_manifests
from testkit.kube_schemas import strict_schemas
from watcher.sim.apiserver import FakeApiServer, Grant, pod_bound_user

__all__ = ["AGENT", "SERVICE_ACCOUNT", "agent_api_server", "serving", "shipped_rules"]

AGENT = "agent"  # the user a kubeconfig from `FakeApiServer.write_kubeconfig(path, AGENT)` is
SERVICE_ACCOUNT = "system:serviceaccount:pod-resources-watcher:pod-resources-watcher"


def shipped_rules(keep: Callable[[Grant], bool] | None = None) -> list[Grant]:
    """What the shipped ClusterRole and its binding grant the agent's service account; with `keep`,
    only the grants it keeps (a cluster that left one out)."""
    rules = rules_from_manifests(
        [SHIPPED_MANIFEST], service_account="pod-resources-watcher", namespace="pod-resources-watcher"
    )
    return [r for r in rules if keep is None or keep(r)]


def agent_api_server(
    directory: Path,
    *,
    node: str,
    rules: Sequence[Grant | Mapping[str, Any]] | None = None,
    pod: str = "prw-x7k2p",
) -> FakeApiServer:
    """The server (not started), its state under `directory`; `AGENT` bound to Pod `pod` on `node`
    and granted `rules` (default: the shipped ones)."""
    user = pod_bound_user(SERVICE_ACCOUNT, node=node, pod=pod)
    granted = shipped_rules() if rules is None else list(rules)
    return FakeApiServer(
        directory, users={AGENT: user}, rules={AGENT: granted}, admission=review, schema=strict_schemas()
    )


@asynccontextmanager
async def serving(server: FakeApiServer, node: str) -> AsyncIterator[FakeApiServer]:
    """`server` started with the Node `node` in it, stopped at the end."""
    await server.start()
    server.add_node(node)
    try:
        yield server
    finally:
        await server.stop()
