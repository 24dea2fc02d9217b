"""The agent installed as users install it: the Helm chart (`helm install`) or the kustomize base and
its overlays (`kubectl apply -k`), on a cluster whose node runs a real container runtime
(testkit.container_node). What the tests read back is what an operator would: the DaemonSet's pod,
its conditions, `kubectl logs`, the events at a receiver.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.container_node import ContainerNode
from testkit.kube_testcluster import KubeTestCluster
from testkit.receiver import Receiver
from testkit.tools import tool
from testkit.waiting import wait_until

__all__ = [
    "BASE_CONFIG",
    "CHART",
    "IMAGE",
    "NAMESPACE",
    "AgentProcess",
    "Release",
    "agent_config",
    "agent_image",
    "agent_process",
    "json_logs",
    "quiet",
    "user_secret",
]

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "pod-resources-watcher"
BASE_CONFIG = ROOT / "deploy" / "kubernetes" / "config.toml"
NAMESPACE = "pod-resources-watcher"
# A pod's first start pulls nothing (the image is imported) but the kubelet's probes decide: the
# startup probe every 2 s, readiness every 10 s.
READY_TIMEOUT_S = 120.0
HELM_TIMEOUT_S = 180.0
IMAGE_DIR = ROOT / ".build" / "image"
# What the chart's default image (repository pod-resources-watcher, tag = appVersion) resolves to.
VERSION = "0.1.0"
IMAGE = f"docker.io/library/pod-resources-watcher:{VERSION}"
# What the image is built from: a change here since the archive's revision makes it stale.
IMAGE_SOURCES = (
    "watcher",
    "pyproject.toml",
    "deploy/kubernetes/config.toml",
    "deploy/image-requirements.txt",
)
IMAGE_BUILD_TIMEOUT_S = 900.0


def _revision(archive: Path) -> str:
    """The git revision an image archive was built from (its org.opencontainers.image.revision)."""
    with tarfile.open(archive) as tar:

        def read(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None, name
            return json.load(member)

        index = read("index.json")
        manifest = read("blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:"))
        config = read("blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
    return str(config["config"]["Labels"]["org.opencontainers.image.revision"])


def _stale(archive: Path) -> bool:
    if not archive.exists():
        return True
    changed = subprocess.run(
        ["git", "diff", "--quiet", _revision(archive), "HEAD", "--", *IMAGE_SOURCES],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    return changed.returncode != 0  # 1: changed; 128: a revision git does not know


def agent_image(tag: str = VERSION) -> Path:
    """The agent's image archive as `make image` builds it (.build/image/), built now if it is
    missing or older than the code it holds (CI's `make e2e` builds the default tag first). Another
    `tag` is a rebuild of the same commit: the tag is one of its labels, so another image id."""
    archive = IMAGE_DIR / f"pod-resources-watcher-{tag}.oci.tar"
    if _stale(archive):
        build = [sys.executable, str(ROOT / "testkit" / "build_image.py"), "--out", str(IMAGE_DIR)]
        subprocess.run([*build, "--tag", tag], check=True, timeout=IMAGE_BUILD_TIMEOUT_S)
    return archive


@dataclass(frozen=True)
class AgentProcess:
    """The agent's process as the kernel sees it: /proc/PID/status and its mounts."""

    pid: int
    status: dict[str, str]
    mounts: dict[str, tuple[str, str]]  # mount point -> (mount options, root within its filesystem)


def agent_process(node: ContainerNode) -> AgentProcess:
    """The one agent process running in `node` (found from the host's /proc: its containers have
    pid namespaces of their own, inside the node's cgroup)."""
    assert node.namespaces is not None, "the node is not started"
    cgroup = f"/{node.namespaces.label}/"
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            groups = (entry / "cgroup").read_text()
        except OSError:
            continue  # ended meanwhile
        if cgroup in groups and b"/opt/pod-resources-watcher/bin/pod-resources-watcher" in argv:
            found.append(int(entry.name))
    assert len(found) == 1, f"agent processes in the node: {found}"
    (pid,) = found
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    mounts = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        mounts[fields[4]] = (fields[5], fields[3])
    return AgentProcess(pid, status, mounts)


async def quiet(receiver: Receiver, seconds: float = 3.0, timeout: float = 60.0) -> None:
    """Until `receiver` got nothing new for `seconds`: the deployed agent's cycles cannot be
    observed from outside, so "nothing more comes" is a quiet window, bounded by `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen, since = len(receiver.requests), loop.time()
    while loop.time() - since < seconds:
        if loop.time() > deadline:
            raise AssertionError(f"{receiver.__class__.__name__} never went quiet for {seconds:g} s")
        await asyncio.sleep(0.2)
        if len(receiver.requests) != seen:
            seen, since = len(receiver.requests), loop.time()


def agent_config(webhook_url: str, *, extra: str = "") -> str:
    """The shipped config.toml (what the chart uses by default) plus a webhook sink to `webhook_url`
    and `extra` TOML: a user's config as deploy/README.md tells them to write one."""
    return (
        BASE_CONFIG.read_text()
        + f'\n[sinks.hook]\ntype = "webhook"\nurl = "{webhook_url}"\nformat = "json"\n'
        + extra
    )


# The Secret users hand the agent's sink credentials in (`secrets.existingSecret`): each key an
# environment variable of the pod, read by the config as ${NAME}.
USER_SECRET = "prw-sink-secrets"


async def user_secret(node: ContainerNode, namespace: str, **keys: str) -> str:
    """The user's Secret `USER_SECRET` in `namespace` (made if missing), holding exactly `keys`:
    its name, for the chart's `secrets.existingSecret`. helm never deletes it: the caller does."""
    await node.kubectl_async("create", "namespace", namespace, check=False)
    await node.kubectl_async("delete", "secret", USER_SECRET, "-n", namespace, "--ignore-not-found")
    literals = [f"--from-literal={name}={value}" for name, value in keys.items()]
    await node.kubectl_async("create", "secret", "generic", USER_SECRET, "-n", namespace, *literals)
    return USER_SECRET


def json_logs(text: str) -> list[dict[str, Any]]:
    """The agent's structured log lines (one JSON object per line); anything else fails the test:
    the shipped config logs JSON only."""
    lines: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise AssertionError(f"a log line is not JSON: {line!r}") from err
    return lines


class Release:
    """One Helm release of the chart on `cluster` (helm v4 with the admin's kubeconfig). The async
    methods run helm and kubectl in a thread: the test's receivers answer on the event loop."""

    def __init__(self, cluster: KubeTestCluster, name: str, directory: Path, namespace: str = NAMESPACE):
        self.cluster = cluster
        self.name = name
        self.namespace = namespace
        self.directory = directory
        self._values = 0

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [tool("helm"), "--kubeconfig", str(self.cluster.admin_kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=HELM_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    async def _helm(self, *args: str) -> None:
        await asyncio.to_thread(self.helm, *args)

    def _values_file(self, values: Mapping[str, Any]) -> Path:
        self._values += 1
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"values.{self._values}.json"  # JSON is YAML
        path.write_text(json.dumps(values, indent=1))
        return path

    async def install(self, values: Mapping[str, Any]) -> None:
        """`helm install` (the namespace made by helm) with `values`."""
        await self._helm(
            "install", self.name, str(CHART), "--namespace", self.namespace, "--create-namespace",
            "--values", str(self._values_file(values)),
        )  # fmt: skip

    async def upgrade(self, values: Mapping[str, Any]) -> None:
        await self._helm(
            "upgrade", self.name, str(CHART), "--namespace", self.namespace,
            "--values", str(self._values_file(values)),
        )  # fmt: skip

    async def uninstall(self) -> None:
        await self._helm("uninstall", self.name, "--namespace", self.namespace, "--wait")

    @property
    def daemonset(self) -> str:
        return self.name if "pod-resources-watcher" in self.name else f"{self.name}-pod-resources-watcher"

    async def pods(self) -> list[dict[str, Any]]:
        """The DaemonSet's pods, oldest first."""
        answer = await asyncio.to_thread(
            self.cluster.get,
            "pods",
            "-n",
            self.namespace,
            "-l",
            "app.kubernetes.io/name=pod-resources-watcher",
        )
        items: list[dict[str, Any]] = answer["items"]
        return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])

    async def ready_pod(self, *, not_uid: str | None = None, image: str | None = None) -> dict[str, Any]:
        """Wait for the one pod of the DaemonSet to be Ready (its readiness probe on /readyz passed);
        `not_uid`: another pod than that one (a recreated pod), `image`: running that image."""

        found: list[dict[str, Any]] = []

        async def ready() -> bool:
            for pod in await self.pods():
                if pod["metadata"]["uid"] == not_uid or pod["metadata"].get("deletionTimestamp"):
                    continue
                if image is not None and pod["spec"]["containers"][0]["image"] != image:
                    continue
                conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
                if conditions.get("Ready") == "True":
                    found.append(pod)
                    return True
            return False

        try:
            await wait_until(ready, READY_TIMEOUT_S, interval=0.5)
        except AssertionError:
            raise AssertionError(f"no Ready agent pod: {await self._describe()}") from None
        return found[0]

    async def logs(self, pod: str, *, previous: bool = False) -> str:
        """`kubectl logs` of the agent's container: through the API server's proxy to the kubelet."""
        args = ["logs", "-n", self.namespace, pod, "-c", "watcher"] + (["--previous"] if previous else [])
        return (await asyncio.to_thread(self.cluster.kubectl, *args)).stdout

    async def _describe(self) -> str:
        pods = await self.pods()
        ds = await asyncio.to_thread(self.cluster.get, "daemonsets", "-n", self.namespace)
        sets = "; ".join(
            f"DaemonSet {d['metadata']['name']} generation {d['metadata'].get('generation')} "
            f"image {d['spec']['template']['spec']['containers'][0]['image']} "
            f"status {json.dumps(d.get('status', {}))}"
            for d in ds["items"]
        )
        if not pods:
            return f"no pod at all; {sets}"
        return (
            sets
            + "; "
            + "; ".join(
                f"{p['metadata']['name']} {p.get('status', {}).get('phase')} "
                f"{json.dumps(p.get('status', {}).get('containerStatuses', []))[:600]}"
                for p in pods
            )
        )


if __name__ == "__main__":  # `make e2e`: the image the tests import, built only when stale
    print(f"agent image: {agent_image()}")
