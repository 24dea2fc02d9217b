"""The agent as the end-to-end tests run it on a real node (testkit.real_node): on the node's
kubelet, configured by a config.toml's tables, optionally writing to the API server as its own
service account (bound to its Pod on the node, as the chart's token is), and the Node conditions it
writes there, read back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from testkit.agent import AgentRun, agent_against, make_settings, with_config
from testkit.kube_reporting import agent_identity
from testkit.real_node import RealNode
from testkit.waiting import wait_until

__all__ = ["agent_on_node", "node_condition", "until_node_condition"]


@asynccontextmanager
async def agent_on_node(
    root: Path, node: RealNode, config: Mapping[str, Any], *, kubernetes: bool = False
) -> AsyncIterator[AgentRun]:
    """The agent on `node`'s kubelet (its state under `root`) with what `config` sets
    (testkit.agent.with_config); with `kubernetes`, a kubernetes sink `k8s` writing Events and Node
    conditions as the agent's own service account. Yields once its Pods API watch is live and its
    warm-up holds are over: from there on, each event is the test's doing."""
    if kubernetes:  # in the config itself: what needs the API server ([expected]) is checked with it
        pod = f"agent-{uuid.uuid4().hex[:6]}"
        kubeconfig = await asyncio.to_thread(agent_identity, node.cluster, node.name, pod)
        k8s = {"type": "kubernetes", "kubeconfig": str(kubeconfig), "api_rate": 50.0}
        config = {**config, "sinks": {**config.get("sinks", {}), "k8s": k8s}}
    base = make_settings(root, kubelet_root=node.root, node=node.name)
    async with agent_against(with_config(base, config)) as run:
        await run.pods_watching(timeout=60)  # a kubelet starting beside it may take its 60 s
        await run.released()
        yield run


async def node_condition(node: RealNode, ctype: str) -> dict[str, Any] | None:
    """The Node's condition `ctype` in the API server now, or None."""
    seen = await node.get("node", node.name)
    found = [c for c in seen["status"].get("conditions", []) if c["type"] == ctype]
    return found[0] if found else None


async def until_node_condition(
    node: RealNode, ctype: str, status: str, timeout: float = 30.0
) -> dict[str, Any]:
    """Until the Node's condition `ctype` reads `status` (written by the agent's kubernetes sink,
    another process's view: polled); that condition."""
    seen: dict[str, Any] = {}

    async def has() -> bool:
        seen["c"] = await node_condition(node, ctype)
        return seen["c"] is not None and seen["c"]["status"] == status

    await wait_until(has, timeout, interval=0.2, what=f"{ctype}={status} on Node {node.name}")
    condition: dict[str, Any] = seen["c"]
    return condition
