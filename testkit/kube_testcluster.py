"""The real Kubernetes API server as a test peer: `kube-testcluster` (peers/cmd/kube-testcluster),
an embedded etcd and upstream's kube-apiserver in one process, started for a block of tests.

`start_kube_testcluster(directory, identities)` runs it and yields a `KubeTestCluster`: where the
server is, the admin's and each static-token identity's kubeconfig, the real kubectl against it,
and kubeconfigs holding pod-bound service-account tokens from TokenRequest (what the Helm chart's
projected token is).
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.peers import peer
from testkit.tools import tool

__all__ = ["KubeTestCluster", "read_ready_line", "start_kube_testcluster", "stop_process"]

# Its measured start is ~4 s on an idle 2-core machine; a busy one (other builds) takes longer.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
KUBECTL_TIMEOUT_S = 60.0
# The chart's projected token lives an hour (deploy/kubernetes/reporting/token.yaml).
TOKEN_SECONDS = 3600
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class KubeTestCluster:
    """A running kube-testcluster: its URL, CA, the admin's kubeconfig and one per identity."""

    server: str
    ca_file: Path
    admin_kubeconfig: Path
    directory: Path
    kubeconfigs: Mapping[str, Path]
    # With listen_ip: https://LISTEN_IP:PORT, where a container node's kubelet and pods reach it.
    listen_server: str | None = None

    def kubeconfig(self, identity: str) -> Path:
        """The kubeconfig of a static-token identity named at the start (or "admin")."""
        return self.kubeconfigs[identity]

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl with `args`, as the admin unless `kubeconfig` is given; `check`: an
        exit other than 0 raises AssertionError with kubectl's own stderr."""
        config = self.admin_kubeconfig if kubeconfig is None else kubeconfig
        result = subprocess.run(
            [tool("kubectl"), "--kubeconfig", str(config), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            command = " ".join(args)
            raise AssertionError(f"kubectl {command} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def apply(self, *objects: Mapping[str, Any]) -> None:
        """`kubectl apply` of objects given as dicts, as the admin."""
        listed = {"apiVersion": "v1", "kind": "List", "items": objects}
        self.kubectl("apply", "-f", "-", input=json.dumps(listed))

    def get(self, *args: str, kubeconfig: Path | None = None) -> Any:
        """`kubectl get ARGS -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig).stdout)

    def service_account_token(self, namespace: str, service_account: str, pod: str | None) -> str:
        """A TokenRequest for the service account, bound to `pod` (as a projected token is) unless
        None: then unbound, so it carries no node name."""
        bound = [] if pod is None else ["--bound-object-kind", "Pod", "--bound-object-name", pod]
        result = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={TOKEN_SECONDS}s", *bound
        )
        return result.stdout.strip()

    def service_account_kubeconfig(self, namespace: str, service_account: str, pod: str | None) -> Path:
        """A kubeconfig holding `service_account_token(...)`, written in the cluster's directory."""
        token = self.service_account_token(namespace, service_account, pod)
        name = _SAFE.sub("_", f"sa-{namespace}-{service_account}-{pod or 'unbound'}")
        path = self.directory / f"{name}.kubeconfig"
        cluster = {"server": self.server, "certificate-authority": str(self.ca_file)}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
            "current-context": name,
        }
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML: kubectl and lightkube read it
        path.chmod(0o600)
        return path


def read_ready_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The peer's one stdout line, or '' if it exits or says nothing within `timeout` s."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if readable:
            return proc.stdout.readline()
    return ""


def _log_tail(directory: Path, lines: int = 20) -> str:
    log = directory / "kube-apiserver.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def stop_process(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, SIGKILL if it lingers, reaped; its pipes closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@contextmanager
def start_kube_testcluster(
    directory: Path, identities: Mapping[str, Sequence[str]] | None = None, *, listen_ip: str | None = None
) -> Iterator[KubeTestCluster]:
    """Run kube-testcluster with its files in `directory` and a static-token user per identity
    (name -> groups); yields once it is ready, stops it (SIGTERM, then etcd) when the block ends.
    `listen_ip`: serve on all addresses, with a certificate for that one too (a container node's
    host side, testkit.container_node.host_ip); the kubeconfigs still name 127.0.0.1.
    The peer not built: a skip, or a failure under CI (testkit.peers)."""
    binary = peer("kube-testcluster")
    args = [str(binary), "--dir", str(directory)]
    if listen_ip is not None:
        args += ["--listen-ip", listen_ip]
    for name, groups in (identities or {}).items():
        args += ["--identity", f"{name}:{','.join(groups)}" if groups else name]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = read_ready_line(proc, START_TIMEOUT_S)
        answer: dict[str, Any] = json.loads(line) if line.strip() else {}
        if not answer.get("ready"):
            problem = answer.get("error") or f"no ready line within {START_TIMEOUT_S:g} s"
            raise RuntimeError(f"kube-testcluster did not start: {problem}\n{_log_tail(directory)}")
        yield KubeTestCluster(
            server=answer["server"],
            ca_file=Path(answer["ca"]),
            admin_kubeconfig=Path(answer["admin_kubeconfig"]),
            directory=directory,
            kubeconfigs={name: Path(path) for name, path in answer["kubeconfigs"].items()},
            listen_server=answer.get("listen_server"),
        )
    finally:
        stop_process(proc)
