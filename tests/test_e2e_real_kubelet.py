"""The agent on a real node: upstream's whole kubelet (peers/cmd/kubelet: the real container
manager, status manager, PLEG, pod-resources and Pods API servers) on a fake CRI, registered with
the real kube-apiserver, our v1beta1 device plugin registered with it. Pods are created in the API
server as a user does; the kubelet admits them, the device manager allocates, PLEG and the status
manager publish container statuses. Each scenario counts the agent's events exactly."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.node_namespaces import KUBELET_SYSCTLS
from testkit.real_node import RealNode

# A whole node starts and restarts here: the default 60 s is too short on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}

# Host state the kubelet would change without its private mount namespace (its container manager
# rewrites these six sysctls; its device-plugin socket and container logs are at fixed paths).
SYSCTLS = tuple(KUBELET_SYSCTLS)
HOST_PATHS = (Path("/var/lib/kubelet"), Path("/var/log/containers"), Path("/var/log/pods"))


def _host_state(pid: str = "self") -> dict[str, Any]:
    """The sysctls, the fixed paths and the mount points, as process `pid` sees them (its root,
    `/proc/PID/root`, is in its mount namespace)."""
    root = Path(f"/proc/{pid}/root")
    state: dict[str, Any] = {s: (root / "proc/sys" / s).read_text() for s in SYSCTLS}
    for path in HOST_PATHS:
        seen = root / path.relative_to("/")
        state[str(path)] = sorted(p.name for p in seen.iterdir()) if seen.exists() else None
    mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    state["mount points"] = sorted(line.split()[4] for line in mountinfo)
    return state


@asynccontextmanager
async def _agent(short_tmp: Path, node: RealNode, **overrides: Any) -> AsyncIterator[AgentRun]:
    """The agent on the real kubelet's root dir, past its first look with the Pods API watch live."""
    settings = make_settings(short_tmp, kubelet_root=node.root, node=node.name, **overrides)
    async with agent_against(settings) as run:
        await run.pods_watching(timeout=30)
        await run.released()
        yield run


async def _gpu_pod(node: RealNode, namespace: str, name: str, count: int = 1) -> dict[str, Any]:
    await node.apply(node.pod(namespace, name, {GPU: count}))
    pod: dict[str, Any] = await node.wait_pod(namespace, name)
    return pod


async def test_the_kubelet_changes_nothing_on_the_host(kube_cluster: Any, short_tmp: Path) -> None:
    """Its private mount namespace keeps the six sysctls and the kubelet's fixed host paths as
    they were, while the kubelet ran, registered the Node and ran a pod holding a device."""
    before = _host_state()
    name = f"node-{uuid.uuid4().hex[:8]}"
    async with RealNode(kube_cluster, short_tmp / "node", name) as node:
        await node.add_plugin(GPU, GPUS)
        namespace = await node.namespace(f"host-{uuid.uuid4().hex[:6]}")
        await _gpu_pod(node, namespace, "holder")
        during = _host_state()
        assert (node.root / "device-plugins" / "kubelet.sock").exists()  # the kubelet's, in the test dir
        # The positive control: inside its namespace the kubelet sees what it wants, and its mounts.
        inside = _host_state(str(node.pid))
        assert inside["vm/overcommit_memory"] == "1\n" and inside["kernel/panic"] == "10\n", inside
        assert {"/var/lib", "/var/log", "/proc/sys/vm/overcommit_memory"} <= set(inside["mount points"])
        assert inside["mount points"] != before["mount points"]
    assert during == before
    assert _host_state() == before


async def test_start_says_the_pods_api_is_watching_and_nothing_but_started(
    real_node: RealNode, short_tmp: Path
) -> None:
    await real_node.add_plugin(GPU, GPUS)
    node = await real_node.get("node", real_node.name)
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"  # stamped at build (make peers)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("fakeRuntime://")
    namespace = await real_node.namespace(f"start-{uuid.uuid4().hex[:6]}")
    await _gpu_pod(real_node, namespace, "already-running")
    async with _agent(short_tmp, real_node) as run:
        ready = await run.readyz()
        assert ready["pods_api"]["state"] == "watching", ready
        await run.quiet_cycle()
        assert run.recorder.kinds() == ["watcher.started"]


async def test_a_pod_given_a_gpu_is_one_allocation_added_with_its_uid(
    real_node: RealNode, short_tmp: Path
) -> None:
    await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"add-{uuid.uuid4().hex[:6]}")
    async with _agent(short_tmp, real_node) as run:
        mark = len(run.recorder.events)
        pod = await _gpu_pod(real_node, namespace, "trainer")
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark), timeout=15)
        await run.quiet_cycle()
        # With it, the free count's change (one fewer free GPU), which an info event reports.
        assert run.recorder.kinds(mark) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert (added.details["namespace"], added.details["pod"]) == (namespace, "trainer")
        assert added.details["pod_uid"] == pod["metadata"]["uid"]


async def test_kubelet_restarts_by_sigterm_and_sigkill_are_one_kubelet_restarted_each(
    real_node: RealNode, short_tmp: Path
) -> None:
    """With a pod holding a GPU in place: the real checkpoint restore, the pods re-admitted from
    the API server, the plugin registering again: nothing but kubelet.restarted."""
    await real_node.add_plugin(GPU, GPUS)
    namespace = await real_node.namespace(f"restart-{uuid.uuid4().hex[:6]}")
    await _gpu_pod(real_node, namespace, "survivor")
    async with _agent(short_tmp, real_node) as run:
        before = run.agent.inventory
        mark = len(run.recorder.events)
        for n, how in enumerate((signal.SIGTERM, signal.SIGKILL)):
            await real_node.restart(how)

            def restarted(count: int = n + 1) -> bool:
                return run.recorder.kinds(mark).count("kubelet.restarted") == count

            await run.recorder.until(restarted, timeout=60)
            await real_node.wait_allocatable(GPU, set(GPUS), timeout=30)
            await run.released()
            await run.pods_watching(timeout=30)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["kubelet.restarted"] * 2
        assert run.agent.inventory == before
