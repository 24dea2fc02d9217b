"""A whole node with a real container runtime: upstream's kubelet (peers/cmd/kubelet, v1.37.2) on
containerd and runc, pods on a CNI bridge, in namespaces of its own so that nothing is left on
the host once it stops (testkit/node_namespaces.py has the how).

    with start_container_cluster(directory / "cluster") as running:   # API server, controllers
        async with running.node(directory / "node", "node-a") as node:
            await node.import_image(Path(".build/image/pod-resources-watcher-0.1.0.oci.tar"))
            await node.apply(pod)                          # as the cluster's admin
            await node.wait_pod("default", "web")
            await node.restart_kubelet(signal.SIGKILL)     # containers keep running
            print((await node.exec("ls", "/var/lib/pod-resources-watcher")).stdout)

`ContainerNode` is a `RealNode` (testkit/real_node.py): `apply`, `get`, `kubectl`, `wait_pod`,
`namespace`, `restart(how)`, `add_plugin` (device plugins), `add_dra_driver(node, ...)`
(testkit/real_dra.py) all work on it. Plugins and drivers run on the host, as on a RealNode:
their sockets are under DIR/var-lib/kubelet, which is the node's /var/lib/kubelet.

The API server must serve beyond 127.0.0.1 (`start_kube_testcluster(..., listen_ip=host_ip(index))`:
it then listens on every address, its certificate naming that one): the kubelet, and pods,
reach it at the node's host-side address (a second node of the cluster checks the certificate
as `localhost`). Pods reach it as in-cluster clients too: in the node's network namespace the
`kubernetes` Service's ClusterIP:443 is DNATed to it (there is no kube-proxy), and its
certificate names that ClusterIP.

Layout of DIR (the node's /var/lib, /var/log and /run are DIR/var-lib, DIR/var-log, DIR/run):
    containerd.toml, containerd.sock, containerd/ (its root), containerd.log
    cni/net.d/10-prw.conflist        bridge prw-br<index>, host-local pod_cidr, masquerade
    kubelet.kubeconfig, kubelet.<n>.log (one per kubelet start), holder.log
    var-lib/kubelet/                 the kubelet's root dir (RealNode.root)
    var-log/pods/, var-log/containers/   container logs
    sysctl/                          the six sysctl files bound over /proc/sys inside
The node's containerd state is /run/containerd-prw inside (DIR/run/containerd-prw).

Images: the pause image (testkit/pause_image.py) is imported at start, and tagged as well under
the names the fake-runtime tests use (`STAND_INS`), so `RealNode.pod` and `claim_job` pods run
the pause binary here. Other images: `import_image(path)` (an OCI or docker archive); nothing is
ever pulled (no registry is reachable).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testkit.container_runtime import cni_config, containerd_config
from testkit.kube_controllers import NODE_CONTROLLERS, KubeControllers, start_kube_controllers
from testkit.kube_testcluster import KubeTestCluster, start_kube_testcluster
from testkit.node_namespaces import NodeNamespaces, child_pid, free_node_index, host_ip, node_ip, pod_cidr
from testkit.pause_image import PAUSE_IMAGE, build_pause_image, pause_binary
from testkit.peer_process import PeerProcess
from testkit.peers import peer, require_root
from testkit.real_node import START_TIMEOUT_S, RealNode
from testkit.tools import tool
from testkit.waiting import wait_until

__all__ = [
    "ContainerCluster",
    "ContainerNode",
    "PAUSE_IMAGE",
    "STAND_INS",
    "free_node_index",
    "host_ip",
    "node_ip",
    "pod_cidr",
    "start_container_cluster",
]

# The image names RealNode.pod, RealNode.admit and testkit.real_dra.claim_job give their
# containers: the pause image under those names too.
STAND_INS = ("registry.test/job:1", "registry.test/trainer:1")
CTR_NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace
STOP_GRACE_S = 10.0


class _Entered(PeerProcess):
    """A PeerProcess started through `nsenter --pid`, which forks: the program is nsenter's child.
    Signals go to that child; nsenter exits with it."""

    def program_pid(self) -> int | None:
        return None if self._proc is None else child_pid(self._proc.pid)

    def _signal(self, how: signal.Signals) -> None:
        pid = self.program_pid()
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, how)

    async def _ended(self, how: signal.Signals) -> None:
        """Signal the program, then let nsenter reap it and exit: killed first, nsenter would
        leave it a zombie of the host's init (the reaper of nsenter's pid namespace)."""
        if self._proc is None:
            return
        self._signal(how)
        try:
            await asyncio.wait_for(self._proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            self._signal(signal.SIGKILL)
            await asyncio.wait_for(self._proc.wait(), STOP_GRACE_S)

    async def kill(self) -> None:
        await self._ended(signal.SIGKILL)
        await super().kill()

    async def stop(self) -> None:
        await self._ended(signal.SIGTERM)
        await super().stop()


class ContainerNode(RealNode):
    """Node `name` of `cluster` with containerd and runc, its network number `index` (see the
    module doc). Async context manager: on entry the node is up and its Node Ready and
    schedulable; on exit everything it started is gone and the Node and its pods are deleted.

    - `host_ip`: the host side of the node's veth (the API server and test receivers listen
      there; pods reach it); `node_ip`: the Node's InternalIP; `pod_cidr`: the pods' addresses.
    - `start()`/`close()` (or the context manager); `restart_kubelet(signal)`.
    - `import_image(path)`, `exec(*argv)`: a command inside the node's namespaces; `ctr(*args)`,
      `containers()`: containerd's view; `http_get(ip, port, path)`: from the node's network
      (pod addresses route only there); `node_path(path)`: a node path's place on the host.
    - `admin_kubeconfig`, `kubectl_async`, and RealNode's `kubectl`, `apply`, `get`, `wait_pod`.
    """

    def __init__(
        self,
        cluster: KubeTestCluster,
        directory: Path,
        name: str,
        *,
        index: int,
        cpus: int = 4,
        numa_nodes: int = 2,
    ) -> None:
        super().__init__(cluster, directory, name, cpus=cpus, numa_nodes=numa_nodes)
        self.index = index
        self.host_ip = host_ip(index)
        self.node_ip = node_ip(index)
        self.pod_cidr = pod_cidr(index)
        self.cri_socket = directory / "containerd.sock"
        self.kubelet_kubeconfig = directory / "kubelet.kubeconfig"
        self.namespaces: NodeNamespaces | None = None
        self.containerd: _Entered | None = None
        self.kubelet: _Entered | None = None
        self.timings: dict[str, float] = {}  # seconds: "node" (namespaces to containerd ready), "kubelet"

    @property
    def admin_kubeconfig(self) -> Path:
        """The cluster admin's kubeconfig (https://127.0.0.1:PORT, for use on the host)."""
        return self.cluster.admin_kubeconfig

    # -- processes --

    async def start(self) -> None:
        """The node's namespaces, containerd and its images (if not up yet), then a new kubelet
        process; returns once its pod-resources and Pods API sockets accept."""
        require_root("a container node makes namespaces, a veth pair and cgroups")
        for name in ("containerd", "runc", "cni-plugins", "iptables", "gcc", "umoci"):
            tool(name)
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.namespaces is None:
            await self._start_node()
        assert self.namespaces is not None
        began = time.monotonic()
        self.starts += 1
        argv = [
            str(peer("kubelet")),
            "--node-namespaces",
            "--dir",
            str(self.directory),
            "--kubeconfig",
            str(self.kubelet_kubeconfig),
            "--node-name",
            self.name,
            "--node-ip",
            self.node_ip,
            "--cri-socket",
            str(self.cri_socket),
            "--cpus",
            str(self.cpus),
            "--numa-nodes",
            str(self.numa_nodes),
        ]
        self.kubelet = _Entered(self.namespaces.entered(argv), self.directory / f"kubelet.{self.starts}.log")
        self.process = self.kubelet
        await self.kubelet.start()
        await self.kubelet.until(
            lambda lines: any(line.startswith("kubelet ready") for line in lines), START_TIMEOUT_S
        )
        self.timings["kubelet"] = time.monotonic() - began

    async def _start_node(self) -> None:
        began = time.monotonic()
        listen = self.cluster.listen_server
        if listen is None:
            raise RuntimeError(
                "the cluster must serve beyond 127.0.0.1: start_kube_testcluster(..., listen_ip=...)"
            )
        # It listens on every address: this node's host side too, which may not be the one its
        # certificate names (a second node of the cluster).
        server = f"https://{self.host_ip}:{urlsplit(listen).port}"
        archive = await asyncio.to_thread(build_pause_image)
        d = self.directory
        (d / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (d / "cni" / "net.d" / "10-prw.conflist").write_text(json.dumps(cni_config(self.index), indent=1))
        (d / "containerd.toml").write_text(containerd_config(d))
        self._write_kubeconfig(server, verify_as=None if server == listen else "localhost")
        self.namespaces = NodeNamespaces(d, self.index, await asyncio.to_thread(pause_binary))
        await self.namespaces.start()
        self.containerd = _Entered(
            self.namespaces.entered(["containerd", "--config", str(d / "containerd.toml")]),
            d / "containerd.log",
        )
        await self.containerd.start()

        async def accepts() -> bool:
            try:
                _, writer = await asyncio.open_unix_connection(str(self.cri_socket))
            except OSError:
                return False
            writer.close()
            await writer.wait_closed()
            return True

        await wait_until(accepts, START_TIMEOUT_S, interval=0.05, what="containerd's socket accepting")
        await self.import_image(archive)
        for name in STAND_INS:
            await self.ctr("images", "tag", "--force", PAUSE_IMAGE, name)
        await self._route_kubernetes_service(server)
        self.timings["node"] = time.monotonic() - began

    def _write_kubeconfig(self, server: str, verify_as: str | None) -> None:
        """The admin's kubeconfig, pointing at the API server's address on the node's veth;
        `verify_as`: the name to check its certificate against instead (one it holds)."""
        view = ["config", "view", "--raw", "-o", "json", "--kubeconfig", str(self.cluster.admin_kubeconfig)]
        out = subprocess.run([tool("kubectl"), *view], capture_output=True, text=True, check=True).stdout
        config = json.loads(out)
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = server
            if verify_as is not None:
                cluster["cluster"]["tls-server-name"] = verify_as
        self.kubelet_kubeconfig.write_text(json.dumps(config, indent=1))
        self.kubelet_kubeconfig.chmod(0o600)

    async def _route_kubernetes_service(self, server: str) -> None:
        """In-cluster clients dial the `kubernetes` Service (KUBERNETES_SERVICE_HOST:443): in the
        node's network namespace that address is the API server's, by DNAT (for pods: PREROUTING;
        for hostNetwork pods and the node's own processes: OUTPUT)."""
        service = await self.get("service", "kubernetes", "-n", "default")
        cluster_ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
        target = f"{self.host_ip}:{urlsplit(server).port}"
        for chain in ("PREROUTING", "OUTPUT"):
            await self.exec(
                "iptables", "-t", "nat", "-A", chain, "-d", f"{cluster_ip}/32", "-p", "tcp",
                "--dport", str(port), "-j", "DNAT", "--to-destination", target,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        """The running kubelet's process id, as the host sees it."""
        assert self.kubelet is not None
        pid = self.kubelet.program_pid()
        assert pid is not None, "the kubelet is not running"
        return pid

    async def restart_kubelet(self, how: signal.Signals = signal.SIGTERM) -> None:
        """Stop the kubelet with `how` (SIGTERM, or SIGKILL: no chance to clean up) and start a new
        one on the same root dir; containerd and the pods' containers keep running."""
        await self.restart(how)

    async def __aenter__(self) -> ContainerNode:
        await super().__aenter__()
        return self

    async def close(self) -> None:
        """Plugins, drivers and the kubelet stopped, the Node and its pods deleted from the API
        server (RealNode.close), then the node's namespaces killed: containerd, shims and
        containers with them; its cgroups removed."""
        try:
            await super().close()
        finally:
            if self.namespaces is not None:
                await self.namespaces.stop()
            if self.containerd is not None:
                await self.containerd.kill()  # already dead with the pid namespace: reaped

    # -- inside the node --

    async def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the node: its mount, network, pid and cgroup namespaces (paths are the
        node's: /var/lib is DIR/var-lib). `check`: a non-zero exit raises with its stderr."""
        assert self.namespaces is not None, "the node is not started"
        enter = [
            "nsenter",
            "--target",
            str(self.namespaces.pid),
            "--mount",
            "--net",
            "--pid",
            "--cgroup",
            "--",
        ]
        return await self.namespaces.run([*enter, *argv], check=check)

    async def ctr(self, *args: str) -> str:
        """`ctr` against the node's containerd, in its CRI namespace, run inside the node (ctr
        makes fifos under /run/containerd of the mount namespace it runs in)."""
        result = await self.exec("ctr", "--address", str(self.cri_socket), "-n", CTR_NAMESPACE, *args)
        return result.stdout

    def node_path(self, path: str | Path) -> Path:
        """Where a path of the node (as its pods' hostPath volumes name it) is on the host:
        /var/lib/X is DIR/var-lib/X, /var/log/X DIR/var-log/X, /run/X DIR/run/X; any other path
        is the host's own."""
        inside = Path(path)
        for prefix, sub in (("/var/lib", "var-lib"), ("/var/log", "var-log"), ("/run", "run")):
            if inside.is_relative_to(prefix):
                return self.directory / sub / inside.relative_to(prefix)
        return inside

    async def kubectl_async(self, *args: str, check: bool = True) -> str:
        """`kubectl ARGS` as the cluster's admin, off the event loop; its stdout."""
        result = await asyncio.to_thread(self.cluster.kubectl, *args, check=check)
        return result.stdout

    async def containers(self) -> list[dict[str, str]]:
        """containerd's tasks on the node (pod sandboxes and containers alike, running or not):
        [{"id", "pid", "status"}]. Empty once no pod runs here."""
        out = await self.ctr("tasks", "ls")
        rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
        return [{"id": row[0], "pid": row[1], "status": row[2]} for row in rows]

    async def http_get(self, host: str, port: int, path: str = "/", timeout: float = 10.0) -> str:
        """GET http://HOST:PORT/PATH from the node's network namespace, where pod addresses route
        (the host has no route to them); the body. An HTTP error or no answer raises."""
        assert self.namespaces is not None, "the node is not started"
        script = (
            "import sys, urllib.request; "
            "answer = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])); "
            "sys.stdout.write(answer.read().decode())"
        )
        url = f"http://{host}:{port}{path}"
        enter = ["nsenter", "--target", str(self.namespaces.pid), "--net", "--"]
        result = await self.namespaces.run([*enter, "python3", "-c", script, url, str(timeout)])
        return result.stdout

    async def import_image(self, archive: Path) -> list[str]:
        """Import an image archive (OCI layout or docker save tar; a path the node sees: not under
        /var/lib, /var/log or /run) into the node's containerd for its pods; the image names."""
        out = await self.ctr("images", "import", str(archive.resolve()))
        return re.findall(r"unpacking (\S+) \(sha256:", out)


@dataclass
class ContainerCluster:
    """An API server serving beyond 127.0.0.1 and kube-controllers with what DaemonSets need
    (NODE_CONTROLLERS and the scheduler), for container nodes."""

    cluster: KubeTestCluster
    controllers: KubeControllers
    first_index: int  # the index whose host address the certificate names
    _handed_first: bool = field(default=False)

    def node(self, directory: Path, name: str, **options: Any) -> ContainerNode:
        """A ContainerNode of this cluster (not started: `async with` it) with a fresh index."""
        index = free_node_index() if self._handed_first else self.first_index
        self._handed_first = True
        return ContainerNode(self.cluster, directory, name, index=index, **options)


@contextmanager
def start_container_cluster(directory: Path) -> Iterator[ContainerCluster]:
    """kube-testcluster listening on all addresses (its certificate for the first node's host
    address) and kube-controllers with NODE_CONTROLLERS, files under `directory`."""
    index = free_node_index()
    with (
        start_kube_testcluster(directory / "cluster", listen_ip=host_ip(index)) as cluster,
        start_kube_controllers(cluster, directory / "controllers", NODE_CONTROLLERS) as controllers,
    ):
        yield ContainerCluster(cluster, controllers, index)
