"""A node with a real container runtime (testkit/container_node.py): upstream's kubelet on
containerd 1.6 and runc, pods on a CNI bridge, an API server of its own serving the node over a
veth, the DaemonSet controller, garbage collector and root-CA publisher beside the scheduler.
Pods run the pause image built here (testkit/pause_image.py); nothing is pulled. The last test
checks that a stopped node leaves nothing on the host."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.container_node import PAUSE_IMAGE, ContainerCluster, ContainerNode
from testkit.deployed import agent_image
from testkit.node_namespaces import KUBELET_SYSCTLS
from testkit.real_dra import add_dra_driver, allocated_device, claim_job, claim_of, job_pod
from testkit.waiting import wait_until

# A cluster and a whole node start in the first test; on a loaded 2-core machine that alone
# can take a minute.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]


def _pause_pod(namespace: str, name: str, node: ContainerNode, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            **spec,
        },
    }


async def _namespace(node: ContainerNode, prefix: str) -> str:
    return await node.namespace(f"{prefix}-{uuid.uuid4().hex[:6]}")


async def _tasks(node: ContainerNode) -> dict[str, tuple[str, str]]:
    """containerd's tasks in the node: container id -> (pid, status)."""
    return {c["id"]: (c["pid"], c["status"]) for c in await node.containers()}


async def test_the_node_runs_the_kubelet_on_containerd(container_node: ContainerNode) -> None:
    node = await container_node.get("node", container_node.name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6."), info
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == container_node.node_ip
    # containerd 1.6 has no RuntimeConfig call: the kubelet says it falls back, and runs.
    log = (container_node.directory / "kubelet.1.log").read_text(errors="replace")
    assert "Falling back to using cgroupDriver from kubelet config" in log


async def test_a_pause_pod_runs_with_an_address_of_the_pod_range(container_node: ContainerNode) -> None:
    namespace = await _namespace(container_node, "pause")
    await container_node.apply(_pause_pod(namespace, "idle", container_node))
    pod = await container_node.wait_pod(namespace, "idle", timeout=60)
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(container_node.pod_cidr)
    (status,) = pod["status"]["containerStatuses"]
    assert status["imageID"].startswith(("registry.k8s.io/pause@sha256:", "sha256:")), status
    container_id = status["containerID"].removeprefix("containerd://")
    # The container is a process: containerd's task runs the pause binary.
    assert (await _tasks(container_node))[container_id][1] == "RUNNING"


async def test_an_exec_readiness_probe_runs_in_the_container(container_node: ContainerNode) -> None:
    """The probe's command runs inside the container (CRI ExecSync, runc exec): `/pause -v`
    exits 0, a missing binary does not."""
    namespace = await _namespace(container_node, "probe")
    ready = {"readinessProbe": {"exec": {"command": ["/pause", "-v"]}, "periodSeconds": 1}}
    broken = {"readinessProbe": {"exec": {"command": ["/no-such-binary"]}, "periodSeconds": 1}}
    await container_node.apply(
        _pause_pod(namespace, "ready", container_node, container=ready),
        _pause_pod(namespace, "broken", container_node, container=broken),
    )
    await container_node.wait_pod(namespace, "ready", timeout=60)
    await container_node.wait_pod(namespace, "broken", timeout=60)

    async def readiness() -> dict[str, bool]:
        pods = await container_node.get("pods", "-n", namespace)
        return {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["ready"] for p in pods["items"]}

    async def settled() -> bool:
        return await readiness() == {"ready": True, "broken": False}

    await wait_until(settled, 60, interval=0.5, what="ready Ready, broken not")
    broken_pod = await container_node.get("pod", "-n", namespace, "broken")
    assert broken_pod["status"]["containerStatuses"][0]["state"].get("running"), broken_pod["status"]


async def test_logs_come_from_the_kubelet_through_the_api_server(container_node: ContainerNode) -> None:
    """With the pod's containers sharing one pid namespace the container's pause is not pid 1,
    and says so on stderr: `kubectl logs` reads that through the API server from the kubelet's
    server on the node's address."""
    namespace = await _namespace(container_node, "logs")
    await container_node.apply(_pause_pod(namespace, "talker", container_node, shareProcessNamespace=True))
    await container_node.wait_pod(namespace, "talker", timeout=60)

    async def logged() -> bool:
        result = await asyncio.to_thread(
            container_node.cluster.kubectl, "logs", "-n", namespace, "talker", check=False
        )
        return "Warning: pause should be the first process" in result.stdout

    await wait_until(logged, 30, interval=0.5, what="kubectl logs shows pause's warning")


async def test_a_daemonset_runs_on_the_node_and_its_pods_go_with_it(container_node: ContainerNode) -> None:
    namespace = await _namespace(container_node, "ds")
    labels = {"app": "tiny"}
    await container_node.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "tiny", "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": container_node.name},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                    },
                },
            },
        }
    )
    found: dict[str, Any] = {}

    async def running() -> bool:
        pods = await container_node.get("pods", "-n", namespace, "-l", "app=tiny")
        live = [p for p in pods["items"] if p["status"].get("phase") == "Running"]
        if live:
            found["pod"] = live[0]
        return bool(live)

    await wait_until(running, 60, interval=0.5, what="the DaemonSet's pod Running")
    pod = found["pod"]
    assert pod["spec"]["nodeName"] == container_node.name
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    # A projected service-account token (every pod has one) needs kube-root-ca.crt, which the
    # root-CA publisher wrote into this new namespace.
    assert any("projected" in v for v in pod["spec"]["volumes"])

    await asyncio.to_thread(
        container_node.kubectl, "delete", "daemonset", "tiny", "-n", namespace, "--wait=false"
    )

    async def gone() -> bool:
        pods = await container_node.get("pods", "-n", namespace, "-l", "app=tiny")
        return not pods["items"]

    # The garbage collector deletes the pods the DaemonSet owned; the kubelet stops them.
    await wait_until(gone, 60, interval=0.5, what="the DaemonSet's pod deleted")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_a_kubelet_restart_leaves_the_container_running(
    container_node: ContainerNode, how: signal.Signals
) -> None:
    namespace = await _namespace(container_node, "restart")
    await container_node.apply(_pause_pod(namespace, "survivor", container_node))
    pod = await container_node.wait_pod(namespace, "survivor", timeout=60)
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    task = (await _tasks(container_node))[container_id]
    old_kubelet = container_node.pid

    await container_node.restart_kubelet(how)

    assert container_node.pid != old_kubelet
    assert not Path(f"/proc/{old_kubelet}").exists()
    await container_node.wait_ready()
    assert (await _tasks(container_node))[container_id] == task  # the same process, still running
    after = await container_node.get("pod", "-n", namespace, "survivor")
    (status,) = after["status"]["containerStatuses"]
    assert status["containerID"] == pod["status"]["containerStatuses"][0]["containerID"]
    assert status["restartCount"] == 0 and status["state"].get("running")


async def test_a_device_plugins_allocation_reaches_the_container(container_node: ContainerNode) -> None:
    """The plugin runs on the host, registered at DIR/var-lib/kubelet/device-plugins, the node's
    /var/lib/kubelet: its Allocate answer (an environment variable naming the devices) is in the
    container containerd made."""
    assert container_node.node_path("/var/lib/kubelet/device-plugins") == container_node.plugin_dir
    await container_node.add_plugin("example.com/gpu", {"gpu0": (0,), "gpu1": (1,)})
    namespace = await _namespace(container_node, "gpu")
    pod = _pause_pod(namespace, "holder", container_node)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": 1}}
    await container_node.apply(pod)
    running = await container_node.wait_pod(namespace, "holder", timeout=60)
    container_id = running["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    spec = json.loads(await container_node.ctr("containers", "info", container_id))["Spec"]
    (env,) = [e for e in spec["process"]["env"] if e.startswith("EXAMPLE_COM_GPU_DEVICES=")]
    assert env.removeprefix("EXAMPLE_COM_GPU_DEVICES=") in ("gpu0", "gpu1")


async def test_a_dra_claim_is_prepared_for_a_jobs_pod(container_node: ContainerNode) -> None:
    """upstream's DRA test driver on the host, registered with the kubelet; a Job's pod takes a
    claim from a template: allocated by the scheduler, prepared by the driver, the pod runs.
    (containerd 1.6 knows no CDI: the container gets no device from the claim.)"""
    setup = await add_dra_driver(container_node, f"cn{uuid.uuid4().hex[:6]}")
    namespace = await _namespace(container_node, "dra")
    await claim_job(container_node, setup, namespace, "trainer")
    pod = await job_pod(container_node, namespace, "trainer", timeout=90)
    claim = await claim_of(container_node, pod)
    assert allocated_device(claim) in ("gpu-0", "gpu-1")
    prepared = (await setup.driver.state())["prepared"]
    assert [c["uid"] for c in prepared] == [claim["metadata"]["uid"]], prepared


async def test_the_agent_image_runs_and_an_http_probe_reaches_the_pod(container_node: ContainerNode) -> None:
    # make image's archive, built now if missing or stale: under CI a skip would hide the test.
    names = await container_node.import_image(await asyncio.to_thread(agent_image))
    (image,) = [n for n in names if not n.startswith("sha256:")]
    namespace = await _namespace(container_node, "agent")
    version = {"image": image, "command": ["pod-resources-watcher", "version"]}
    server = {
        "image": image,
        "command": ["python3", "-m", "http.server", "8080"],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }
    await container_node.apply(
        _pause_pod(namespace, "version", container_node, container=version, restartPolicy="Never"),
        _pause_pod(namespace, "web", container_node, container=server),
    )
    await container_node.wait_pod(namespace, "version", phase="Succeeded", timeout=90)
    logs = await asyncio.to_thread(container_node.kubectl, "logs", "-n", namespace, "version")
    assert re.search(r"\d+\.\d+\.\d+", logs), logs

    async def ready() -> bool:
        pod = await container_node.get("pod", "-n", namespace, "web")
        return bool(pod["status"].get("containerStatuses", [{}])[0].get("ready"))

    await wait_until(ready, 60, interval=0.5, what="the web pod Ready by its HTTP probe")
    pod = await container_node.get("pod", "-n", namespace, "web")
    # What the probe reached, from the node's network (the host has no route to pod addresses).
    assert "Directory listing" in await container_node.http_get(pod["status"]["podIP"], 8080, "/")


# What a pod runs to reach the host's side of the veth (where receivers listen) and the API
# server as an in-cluster client does: KUBERNETES_SERVICE_HOST, the projected token and CA.
REACH = """
import json, os, ssl, sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}/version"
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(sa + "token").read()})
context = ssl.create_default_context(cafile=sa + "ca.crt")
print(json.load(urllib.request.urlopen(request, context=context, timeout=10))["gitVersion"])
"""


async def test_a_pod_reaches_the_host_side_and_the_api_server(container_node: ContainerNode) -> None:
    # make image's archive, built now if missing or stale: under CI a skip would hide the test.
    names = await container_node.import_image(await asyncio.to_thread(agent_image))
    (image,) = [n for n in names if not n.startswith("sha256:")]
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readline())
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, container_node.host_ip, 0)
    try:
        port = server.sockets[0].getsockname()[1]
        namespace = await _namespace(container_node, "reach")
        client = {
            "image": image,
            "command": ["python3", "-c", REACH, f"http://{container_node.host_ip}:{port}/hi"],
        }
        await container_node.apply(
            _pause_pod(namespace, "client", container_node, container=client, restartPolicy="Never")
        )
        pod = await container_node.wait_pod(namespace, "client", phase="Succeeded", timeout=90)
    finally:
        server.close()
        await server.wait_closed()
    logs = await asyncio.to_thread(container_node.kubectl, "logs", "-n", namespace, "client")
    assert logs.split() == ["hello", "v1.37.2"], logs
    assert seen == [b"GET /hi HTTP/1.1\r\n"]
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(container_node.pod_cidr)


# --- nothing on the host ---

# The kubelet's six, and forwarding, which the node turns on in its own network namespace only.
SYSCTLS = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward")
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/lib/containerd"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/run/netns"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/opt/containerd"),
)


def _host_state() -> dict[str, Any]:
    """What a node could change on the host: sysctls, fixed paths, interfaces, mounts, cgroups."""
    state: dict[str, Any] = {s: Path("/proc/sys", s).read_text() for s in SYSCTLS}
    for path in HOST_PATHS:
        state[str(path)] = sorted(p.name for p in path.iterdir()) if path.exists() else None
    state["interfaces"] = sorted(os.listdir("/sys/class/net"))
    state["mounts"] = sorted(
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
    state["cgroups"] = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/**/prw-node-*"))
    return state


def _processes_in(mount_namespace: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "mnt") == mount_namespace:
                    found.append(f"{entry.name} {(entry / 'comm').read_text().strip()}")
            except OSError:
                continue
    return found


async def test_a_stopped_node_leaves_nothing_on_the_host(container_cluster: ContainerCluster) -> None:
    directory = Path("/tmp") / f"prw-cn-{uuid.uuid4().hex[:6]}"
    before = _host_state()
    try:
        async with container_cluster.node(directory, f"cnode-{uuid.uuid4().hex[:6]}") as node:
            namespace = await _namespace(node, "left")
            await node.apply(_pause_pod(namespace, "idle", node))
            await node.wait_pod(namespace, "idle", timeout=60)
            assert node.namespaces is not None
            mount_namespace = node.namespaces.mount_namespace
            inside = _processes_in(mount_namespace)
            # The positive control: while it runs, its processes, veth and cgroups are there.
            assert any("containerd" in p for p in inside) and any("kubelet" in p for p in inside), inside
            assert any(p.endswith(" pause") for p in inside), inside
            during = _host_state()
            assert node.namespaces.host_link in during["interfaces"]
            assert during["cgroups"] != before["cgroups"]
            assert {k: during[k] for k in SYSCTLS} == {k: before[k] for k in SYSCTLS}
        assert _processes_in(mount_namespace) == []
        after = _host_state()
        assert after == before, json.dumps(
            {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        )
        assert not [m for m in after["mounts"] if m.startswith(str(directory))]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
