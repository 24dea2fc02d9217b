"""node-feature-discovery's nfd-topology-updater (built by `make peers` from its Go module,
peers/nfd/) run without publishing, and what it prints read back.

With `-no-publish` it still scans on every event (a kubelet state file rewritten, seen through
fsnotify in `-kubelet-state-dir`, or its `-sleep-interval` timer): pod-resources List, then a Pods
Get from the API server for each pod listed (a pod it cannot read fails the scan), and the
NodeResourceTopology zones it would publish are logged at -v=1 as one klog record
("aggregated resources identified", the zones as YAML). GetAllocatableResources is read once, at
start. Its metrics and gRPC health servers listen on every interface, so both are turned off
(`-metrics=0 -grpc-health=0`): the benchmarks use loopback and unix sockets only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from testkit.peers import PEERS_BIN

__all__ = ["NFD", "NfdOutput", "kubelet_config", "nfd_argv", "outputs", "scan_errors"]

NFD = PEERS_BIN / "nfd-topology-updater"
_RECORD = '"aggregated resources identified"'


def kubelet_config(path: Path) -> str:
    """A KubeletConfiguration file (what `-kubelet-config-uri file://` reads, for the topology
    manager's policy and scope, when publishing); the URI to pass."""
    path.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "topologyManagerPolicy: none\ntopologyManagerScope: container\n"
    )
    return f"file://{path}"


def nfd_argv(
    kubelet_root: Path, kubeconfig: Path, config_uri: str, sleep_interval: float, binary: Path = NFD
) -> list[str]:
    """The updater against the kubelet under `kubelet_root`, publishing nothing."""
    return [
        str(binary),
        "-no-publish",
        "-v=1",
        "-metrics=0",
        "-grpc-health=0",
        "-config=",
        f"-sleep-interval={sleep_interval:g}s",
        f"-kubeconfig={kubeconfig}",
        f"-kubelet-config-uri={config_uri}",
        f"-kubelet-state-dir={kubelet_root}",
        f"-podresources-socket={kubelet_root / 'pod-resources' / 'kubelet.sock'}",
    ]


@dataclass(frozen=True)
class NfdOutput:
    """One scan's zones as it would publish them: zone -> resource -> available."""

    at: float
    zones: dict[str, dict[str, str]]


def outputs(lines: Sequence[tuple[float, str]]) -> list[NfdOutput]:
    """Every complete "aggregated resources identified" record among stamped stderr lines. klog
    writes a multi-line value as `key=<`, the lines tab-indented, then ` >`, in one write."""
    found: list[NfdOutput] = []
    i = 0
    while i < len(lines):
        at, line = lines[i]
        i += 1
        if _RECORD not in line:
            continue
        body: list[str] = []
        while i < len(lines) and lines[i][1] != " >":
            body.append(lines[i][1].removeprefix("\t"))
            i += 1
        if i == len(lines):
            break  # not complete yet
        i += 1
        zones: dict[str, dict[str, str]] = {}
        for zone in yaml.safe_load("\n".join(body)) or []:
            resources = {r["name"]: str(r["available"]) for r in zone.get("resources") or []}
            zones[str(zone["name"])] = resources
        found.append(NfdOutput(at, zones))
    return found


def scan_errors(lines: Sequence[tuple[float, str]]) -> list[str]:
    """Its error lines (klog severity E): a scan that failed, a kubelet it cannot reach."""
    return [line for _, line in lines if line.startswith("E")]
