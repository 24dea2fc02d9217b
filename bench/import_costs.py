"""What each part of the agent adds to its RSS when imported, in a fresh interpreter: the groups
below imported one after another (a module another group already imported costs nothing again),
each group's VmRSS and RssAnon growth printed as JSON. Run by the memory section in the runtime venv
(bench/runtime_venv.py); the order is the agent's own, outside in.

    python bench/import_costs.py
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["GROUPS", "costs"]

# (what, the modules it is): the agent's dependencies first, then its own parts.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("grpc (grpc.aio, its C core)", ("grpc", "grpc.aio")),
    ("protobuf runtime (upb)", ("google.protobuf.message", "google.protobuf.internal.builder")),
    ("structlog", ("structlog",)),
    ("aiohttp client (the HTTP sinks)", ("aiohttp",)),
    ("aiohttp.web (the HTTP server, on by default)", ("aiohttp.web",)),
    ("prometheus_client", ("prometheus_client",)),
    ("watchfiles", ("watchfiles",)),
    ("sqlite3, ssl, tomllib", ("sqlite3", "ssl", "tomllib")),
    (
        "the v1 API's generated code and views",
        (
            "watcher.kubeletapi.v1.api_pb2_grpc",
            "watcher.kubeletapi.v1.views_pb2",
            "watcher.kubeletapi.v1.lenient_pb2",
        ),
    ),
    (
        "model/ (the pure core)",
        (
            "watcher.model.diff",
            "watcher.model.devicehealth.affected",
            "watcher.model.devicehealth.verdicts",
            "watcher.model.flapping",
            "watcher.model.incidents",
        ),
    ),
    (
        "kubelet/ (the List path)",
        (
            "watcher.kubelet.client",
            "watcher.kubelet.decoding",
            "watcher.kubelet.repair",
            "watcher.kubelet.watching",
        ),
    ),
    (
        "the Pods API (k8s and v1alpha1 generated code, sources/pods_api/)",
        (
            "watcher.kubeletapi.k8s.core_v1_pb2",
            "watcher.kubeletapi.v1alpha1.pods_pb2_grpc",
            "watcher.sources.pods_api.watch",
        ),
    ),
    ("store/ (the outbox)", ("watcher.store.store",)),
    (
        "sinks: base, http, registry, stdout",
        ("watcher.sinks.registry", "watcher.sinks.http", "watcher.sinks.stdout"),
    ),
    ("ops/, delivery/, settings, cycle/, app", ("watcher.app",)),
    (
        "not imported unless configured: the other sink types (slack ... nats)",
        (
            "watcher.sinks.slack",
            "watcher.sinks.pagerduty",
            "watcher.sinks.webhook",
            "watcher.sinks.alertmanager",
            "watcher.sinks.file",
        ),
    ),
    (
        "... the kubernetes sink and ResourceSlices (lightkube itself not yet)",
        ("watcher.sinks.kubernetes", "watcher.sources.resource_slices"),
    ),
    ("... the nats sink (nats-py itself not yet)", ("watcher.sinks.nats",)),
    ("... lightkube (when the kubernetes sink connects)", ("lightkube", "lightkube.resources.core_v1")),
    ("... nats-py (when the nats sink connects)", ("nats", "nats.js")),
)


def _mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def costs() -> dict[str, object]:
    """The interpreter's own RSS, then each group's growth (MiB) and module count."""
    out: dict[str, object] = {"interpreter": _mib("VmRSS"), "interpreter_anon": _mib("RssAnon")}
    rows = []
    for label, modules in GROUPS:
        rss, anon, count = _mib("VmRSS"), _mib("RssAnon"), len(sys.modules)
        for name in modules:
            importlib.import_module(name)
        rows.append([label, _mib("VmRSS") - rss, _mib("RssAnon") - anon, len(sys.modules) - count])
    out["groups"] = rows
    return out


if __name__ == "__main__":
    print(json.dumps(costs()))
