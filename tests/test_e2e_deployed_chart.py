"""The agent as users run it: its image (`make image`, built here without a container engine), its
Helm chart installed with `helm install` on a node whose kubelet (upstream v1.37) runs pods on
containerd and runc, with CNI bridge networking in namespaces the test made
(testkit.container_node). Everything is read back as an operator would: the DaemonSet's pod and its
probes, `kubectl logs`, the events at a webhook receiver on the node's network, the agent's process
as the runtime started it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from testkit.container_node import ContainerNode
from testkit.deployed import (
    IMAGE,
    USER_SECRET,
    Release,
    agent_config,
    agent_image,
    agent_process,
    json_logs,
    quiet,
    user_secret,
)
from testkit.kubelet_lite import DevicePlugin
from testkit.real_node import held_devices
from testkit.receivers import WebhookReceiver
from testkit.waiting import wait_until

# The node and its cluster are the module's (tests/conftest.py: image_node); each test installs the
# chart afresh and leaves the node as it found it: no workload, no plugin, no state directory.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420), pytest.mark.asyncio(loop_scope="module")]

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
# Where the chart's hostPaths point (its defaults), inside the node.
STATE_DIR = "/var/lib/pod-resources-watcher"
HOST_PATHS = {
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/pods-api",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/plugins_registry",
    STATE_DIR,
}
GONE = "app.kubernetes.io/instance=gone"
CLUSTER_WIDE = (
    "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"
)


@dataclass
class Deployed:
    node: ContainerNode
    release: Release
    hook: WebhookReceiver
    pod: dict[str, Any]
    # What the test added to the node (workloads, plugins): undone once the agent is gone.
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def kinds(self, since: int = 0) -> list[str]:
        return [r.json()["kind"] for r in self.hook.accepted[since:]]

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return [r.json() for r in self.hook.accepted[since:]]


# The webhook's signing secret, as users hand secrets to the agent: a Secret of theirs whose keys
# the pod gets as environment variables (`secrets.existingSecret`), read by the config as ${NAME}.
SIGNING_SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtZGVwbG95ZWQtYWdlbnQ="


def _values(hook: WebhookReceiver, **more: Any) -> dict[str, Any]:
    """The documented values a user with a signed webhook sets: the config with a [sinks.hook]
    table whose signing secret comes from their Secret."""
    config = agent_config(hook.url("/events"), extra='signing_secret = "${HOOK_SIGNING_SECRET}"\n')
    return {"config": config, "secrets": {"existingSecret": USER_SECRET, "optional": False}, **more}


async def _receiver(node: ContainerNode, namespace: str) -> WebhookReceiver:
    """A receiver verifying every request's signature, on the node's network (the host side of
    its veth), and the user's Secret holding the signing key in `namespace`."""
    await user_secret(node, namespace, HOOK_SIGNING_SECRET=SIGNING_SECRET)
    hook = WebhookReceiver(secret=SIGNING_SECRET)
    hook.host = node.host_ip
    return hook


@pytest_asyncio.fixture(loop_scope="module")
async def deployed(image_node: ContainerNode, tmp_path: Path) -> AsyncIterator[Deployed]:
    """The chart installed (release `prw`) on a container node, its one pod Ready, a webhook
    receiver on the node's network getting its events; uninstalled afterwards."""
    container_node = image_node
    release = Release(container_node.cluster, "prw", tmp_path / "helm")
    cleanups: list[Callable[[], Awaitable[None]]] = []
    async with await _receiver(container_node, release.namespace) as hook:
        await release.install(_values(hook))
        try:
            pod = await release.ready_pod()
            # Its start: nothing but the start (the node holds no pods yet).
            await hook.wait_for(1, timeout=30)
            yield Deployed(container_node, release, hook, pod, cleanups)
        finally:
            await release.uninstall()
            # The Secret is the user's, not the chart's: helm leaves it (and the namespace).
            await container_node.kubectl_async("delete", "secret", USER_SECRET, "-n", release.namespace)
    for cleanup in reversed(cleanups):
        await cleanup()
    await _forget_state(container_node)


async def _forget_state(node: ContainerNode) -> None:
    """The agent's state directory removed from the node (uninstalling leaves it, as documented):
    the next test's agent starts on a node it never saw."""
    await node.exec("rm", "-rf", STATE_DIR)


async def _empty(listing: Awaitable[Sized]) -> bool:
    found = await listing
    return len(found.strip() if isinstance(found, str) else found) == 0


async def _gpu_pod(deployed: Deployed, name: str) -> tuple[str, DevicePlugin, str]:
    """A plugin serving two GPUs and a pod holding one of them: (namespace, plugin, device); both
    gone again when the test ends."""
    node = deployed.node
    plugin = await node.add_plugin(GPU, GPUS)
    namespace = await node.namespace(f"{name}-{uuid.uuid4().hex[:6]}")

    async def undo() -> None:
        await node.kubectl_async("delete", "namespace", namespace, "--wait=true", "--timeout=120s")
        await plugin.stop()
        node.plugins.remove(plugin)

    deployed.cleanups.append(undo)
    await node.apply(node.pod(namespace, name, {GPU: 1}))
    pod = await node.wait_pod(namespace, name)
    (held,) = held_devices(pod)
    return namespace, plugin, held


async def test_the_chart_installs_a_ready_agent_that_reads_both_apis_through_its_mounts(
    deployed: Deployed,
) -> None:
    pod = deployed.pod["metadata"]["name"]
    # Ready = the kubelet's own readiness probe on /readyz passed; and /readyz itself, read from
    # the node's network as the kubelet reads it, says which sources it reads through which mounts.
    ready = json.loads(await deployed.node.http_get(deployed.pod["status"]["podIP"], 9108, "/readyz"))
    assert ready["ok"] is True, ready
    assert ready["pods_api"]["state"] == "watching", ready
    assert ready["watches"]["socket"]["state"] == "watching"
    assert ready["watches"]["socket"]["files"] == ["kubelet.sock"]
    assert ready["watches"]["pods-api"]["state"] == "watching"
    assert ready["watches"]["device-plugins"]["state"] == "watching"
    # kubectl logs (the API server's proxy to the kubelet, the runtime's log file): JSON, one
    # object per line, saying it started and that it watches the Pods API.
    # The shipped config's stdout sink writes the events to the same stream: one JSON object per
    # line either way, events carrying the schema.
    lines = json_logs(await deployed.release.logs(pod))
    said = [line["event"] for line in lines if "schema" not in line]
    assert "watcher starting" in said and "watching the Pods API" in said, said
    assert all(line.get("level") == "info" for line in lines if "schema" not in line), lines
    printed = [line["kind"] for line in lines if "schema" in line]
    assert printed == deployed.kinds() == ["watcher.started"], (printed, deployed.kinds())


async def test_a_gpu_failing_at_its_plugin_reaches_the_webhook_once_naming_the_pod(
    deployed: Deployed,
) -> None:
    node = deployed.node
    namespace, plugin, held = await _gpu_pod(deployed, "trainer")
    await deployed.hook.wait_for(lambda _: "allocation.added" in deployed.kinds(), timeout=60)
    mark = len(deployed.hook.accepted)
    await plugin.set_healthy(held, False)
    await deployed.hook.wait_for(lambda _: "device.removed" in deployed.kinds(mark), timeout=60)
    await plugin.set_healthy(held, True)
    await deployed.hook.wait_for(lambda _: "device.added" in deployed.kinds(mark), timeout=60)
    await quiet(deployed.hook)
    events = deployed.events(mark)
    assert [e["kind"] for e in events] == [
        "device.removed",
        "capacity.changed",
        "device.added",
        "capacity.changed",
    ], [e["kind"] for e in events]
    removed = events[0]
    assert removed["severity"] == "critical"
    assert removed["details"]["allocated_to"] == [f"{namespace}/trainer/main"]
    assert removed["node"] == node.name


async def test_the_pods_security_context_holds_on_the_real_runtime(deployed: Deployed) -> None:
    """What docs/deployment.md claims, as the kernel sees the agent's process: root without a
    single capability, no privilege escalation, seccomp on, a read-only root filesystem, and exactly
    the documented hostPaths."""
    volumes = deployed.pod["spec"]["volumes"]
    assert {v["hostPath"]["path"] for v in volumes if "hostPath" in v} == HOST_PATHS
    proc = agent_process(deployed.node)
    status = proc.status
    assert status["Uid"].split()[:2] == ["0", "0"] and status["Gid"].split()[:2] == ["0", "0"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # filter mode: RuntimeDefault
    mounts = proc.mounts  # mount point -> (options, source root inside its filesystem)
    assert "ro" in mounts["/"][0].split(","), mounts["/"]
    # Every mount from the node's own filesystem that the kubelet and the runtime do not make for
    # every pod (its volumes under /var/lib/kubelet/pods/, /etc/hosts, resolv.conf, hostname).
    node_dir = str(deployed.node.directory)
    made = (f"{node_dir}/var-lib/kubelet/pods/", f"{node_dir}/containerd/")
    host = {
        point: root
        for point, (_opts, root) in mounts.items()
        if root.startswith(node_dir) and not root.startswith(made)
    }
    assert set(host) == HOST_PATHS, mounts
    modes = {point: "ro" if "ro" in mounts[point][0].split(",") else "rw" for point in host}
    assert modes == {
        "/var/lib/kubelet/pod-resources": "rw",
        "/var/lib/kubelet/pods-api": "ro",
        "/var/lib/kubelet/device-plugins": "ro",
        "/var/lib/kubelet/plugins_registry": "ro",
        STATE_DIR: "rw",
    }


async def test_a_deleted_pod_a_rolling_update_and_a_kubelet_restart_lose_and_repeat_nothing(
    deployed: Deployed,
) -> None:
    """The state directory is on the node (its hostPath): an agent replaced by the DaemonSet, by a
    rolling update to a rebuilt image or left running while the kubelet restarts under it reports
    what changed while it was away, once, and nothing else: never a page."""
    node, release = deployed.node, deployed.release
    namespace, _plugin, _held = await _gpu_pod(deployed, "before")
    await deployed.hook.wait_for(lambda _: "allocation.added" in deployed.kinds(), timeout=60)

    # 1. The pod deleted: the DaemonSet makes a new one. Meanwhile a second pod takes the other GPU.
    mark = len(deployed.hook.accepted)
    first = deployed.pod["metadata"]
    # Gone (its containers stopped) before the workload changes: only the next agent may see it.
    await node.kubectl_async("delete", "pod", "-n", release.namespace, first["name"], "--wait=true")
    await node.apply(node.pod(namespace, "meanwhile", {GPU: 1}))
    await node.wait_pod(namespace, "meanwhile")
    second = await release.ready_pod(not_uid=first["uid"])
    await deployed.hook.wait_for(lambda _: "allocation.added" in deployed.kinds(mark), timeout=60)
    await quiet(deployed.hook)
    # The new agent: its start, then what changed while no agent ran, once.
    assert deployed.kinds(mark) == ["watcher.started", "allocation.added", "capacity.changed"]
    added = deployed.events(mark)[1]["details"]
    meanwhile = await node.get("pod", "-n", namespace, "meanwhile")
    # Named as every change is, though it came while no agent ran: its uid from the Pods API.
    assert (added["namespace"], added["pod"]) == (namespace, "meanwhile"), added
    assert added.get("pod_uid") == meanwhile["metadata"]["uid"], added

    # 2. A rolling update to a rebuilt image (`make image IMAGE_TAG=...`: another image id).
    mark = len(deployed.hook.accepted)
    rebuilt = await asyncio.to_thread(agent_image, "0.1.0-rebuilt")
    assert await node.import_image(rebuilt) == [IMAGE.replace("0.1.0", "0.1.0-rebuilt")]
    await release.upgrade(_values(deployed.hook, image={"tag": "0.1.0-rebuilt"}))
    third = await release.ready_pod(
        not_uid=second["metadata"]["uid"], image="pod-resources-watcher:0.1.0-rebuilt"
    )
    (before,), (after,) = second["status"]["containerStatuses"], third["status"]["containerStatuses"]
    assert after["imageID"] != before["imageID"]
    await quiet(deployed.hook)
    assert deployed.kinds(mark) == ["watcher.started"], deployed.kinds(mark)

    # 3. The kubelet restarts under the running pod: one kubelet.restarted, nothing else.
    mark = len(deployed.hook.accepted)
    await node.restart_kubelet()
    await deployed.hook.wait_for(lambda _: "kubelet.restarted" in deployed.kinds(mark), timeout=90)
    await quiet(deployed.hook, seconds=5)
    assert deployed.kinds(mark) == ["kubelet.restarted"], deployed.kinds(mark)
    # Across three agents: no page, and every seq once, in order, none skipped (the state
    # directory on the node carried it from one pod to the next).
    events = deployed.events()
    assert not [e for e in events if e["severity"] == "critical"]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert len({e["id"] for e in events}) == len(events)


async def test_helm_uninstall_leaves_nothing_but_the_state_directory(
    image_node: ContainerNode, tmp_path: Path
) -> None:
    container_node = image_node
    release = Release(container_node.cluster, "gone", tmp_path / "helm")
    async with await _receiver(container_node, release.namespace) as hook:
        # With reporting on: its cluster-wide RBAC and admission policy must go too.
        await release.install(_values(hook, kubernetesReporting={"enabled": True}))
        await release.ready_pod()
        await hook.wait_for(1, timeout=30)
        cluster_wide = await container_node.kubectl_async("get", CLUSTER_WIDE, "-l", GONE, "-o", "name")
        assert len(cluster_wide.split()) == 4, cluster_wide  # role, binding, policy, policy binding
        await release.uninstall()

    # The DaemonSet's pod goes after it (the garbage collector, as in any cluster), then nothing
    # labelled with the release is left in the API server.
    async def left() -> str:
        return await container_node.kubectl_async(
            "get", "all,configmaps,secrets,serviceaccounts,networkpolicies,resourcequotas",
            "-n", release.namespace, "-l", GONE, "-o", "name",
        )  # fmt: skip

    await wait_until(lambda: _empty(left()), timeout=60, interval=0.5, what="the release's objects gone")
    await wait_until(
        lambda: _empty(container_node.containers()), timeout=60, interval=0.5, what="no container left"
    )
    assert await container_node.kubectl_async("get", CLUSTER_WIDE, "-l", GONE, "-o", "name") == ""
    # The node: the state directory stays, as documented (a reinstall continues from it).
    assert (container_node.node_path(STATE_DIR) / "audit.jsonl").exists()
    await container_node.kubectl_async("delete", "secret", USER_SECRET, "-n", release.namespace)
    await _forget_state(container_node)
