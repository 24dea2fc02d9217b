"""kube-controllers (the Go test peer in peers/cmd/kube-controllers) against a kube-testcluster:
upstream's kube-scheduler, resourceclaim controller and Job controller in one process, so a test
can create Pods without spec.nodeName, Pods whose claims come from ResourceClaimTemplates, and
Jobs, and have them scheduled, allocated and created as on a cluster.

What a test must create for a Pod to be scheduled (no kubelet or node lifecycle controller runs)
is in peers/README.md, section kube-controllers.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.kube_testcluster import KubeTestCluster, read_ready_line, stop_process
from testkit.peers import peer

__all__ = ["NODE_CONTROLLERS", "KubeControllers", "start_kube_controllers"]

START_TIMEOUT_S = 60.0  # informers sync in well under a second; the slack is for a loaded machine


@dataclass(frozen=True)
class KubeControllers:
    """The running peer: its process id and its log (klog of all three, and its stderr)."""

    pid: int
    log: Path

    def log_tail(self, lines: int = 20) -> str:
        return _tail(self.log, lines)


def _tail(log: Path, lines: int) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


# What a DaemonSet on a container node needs besides the scheduler: its controller, the garbage
# collector (its pods go when it goes) and the kube-root-ca.crt publisher (projected tokens).
NODE_CONTROLLERS = (
    "resourceclaim",
    "job",
    "daemonset",
    "garbagecollector",
    "root-ca-cert-publisher",
    "namespace",
)


@contextmanager
def start_kube_controllers(
    cluster: KubeTestCluster,
    directory: Path,
    controllers: Sequence[str] | None = None,
    *,
    scheduler: bool = True,
) -> Iterator[KubeControllers]:
    """Run kube-controllers against `cluster` as its admin, logging to directory/kube-controllers.log;
    yields once every informer has synced, stops it (SIGTERM) when the block ends. `controllers`:
    which to run beside the scheduler (the peer's --controllers; None: its default, resourceclaim
    and job; NODE_CONTROLLERS for DaemonSets). `scheduler=False`: no kube-scheduler, for a second
    kube-controllers beside the session's (two schedulers would race for the same pods). The peer
    not built: a skip, or a failure under CI (testkit.peers)."""
    binary = peer("kube-controllers")
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "kube-controllers.log"
    args = [str(binary), "--kubeconfig", str(cluster.admin_kubeconfig), "--log-file", str(log)]
    if controllers is not None:
        args += ["--controllers", ",".join(controllers)]
    if not scheduler:
        args.append("--scheduler=false")
    # stderr to the log as well: what the peer writes there before it redirects itself (a bad
    # flag) or after (its own error line) lands next to klog's lines.
    with log.open("ab") as stderr:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = read_ready_line(proc, START_TIMEOUT_S)
        answer: dict[str, Any] = json.loads(line) if line.strip() else {}
        if not answer.get("ready"):
            problem = answer.get("error") or f"no ready line within {START_TIMEOUT_S:g} s"
            raise RuntimeError(f"kube-controllers did not start: {problem}\n{_tail(log, 20)}")
        yield KubeControllers(pid=int(answer["pid"]), log=log)
    finally:
        stop_process(proc)
