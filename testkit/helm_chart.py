"""The Helm chart rendered by the real helm (v4, from `testkit.tools`): `template` runs it on a values
dict and returns what helm printed; `render` returns the objects, `pod` the DaemonSet's pod spec.
`VALUES_SETS` are the documented values sets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from testkit.manifests import DEPLOY, load_yaml_docs, the
from testkit.tools import tool

__all__ = [
    "CHART",
    "NAMESPACE",
    "RELEASE",
    "SCHEMA_ERROR",
    "VALUES_SETS",
    "helm",
    "pod",
    "render",
    "template",
]

CHART = DEPLOY / "helm" / "pod-resources-watcher"
RELEASE = "pod-resources-watcher"
NAMESPACE = "pod-resources-watcher"
# What helm says when values.schema.json refuses a values file.
SCHEMA_ERROR = "values don't meet the specifications of the schema"

# The documented values sets (deploy/README.md, "Helm"): tests/test_helm.py renders and checks each
# offline, tests/test_e2e_deploy.py has the real API server accept what each renders.
VALUES_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "podmonitor": {"monitoring": {"monitor": "PodMonitor", "service": True, "prometheusRule": True}},
    "servicemonitor": {
        "monitoring": {"monitor": "ServiceMonitor", "labels": {"release": "kube-prometheus-stack"}}
    },
    "reporting": {"kubernetesReporting": {"enabled": True}},
    "placement": {
        "nodeSelector": {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "controlPlaneNodes": True,
    },
    "existing-secret": {
        "secrets": {"existingSecret": "gpu-alerts", "optional": False},
        "image": {"repository": "registry.example.invalid/pod-resources-watcher", "tag": "0.1.0-rc1"},
    },
    # Every other value of the README's table, away from its default.
    "every-option": {
        "image": {"tag": "0.1.0", "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "other-node-agent"}},
                        },
                    }
                ]
            }
        },
        "resources": {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "hostPaths": {
            "podResources": "/var/lib/k0s/kubelet/pod-resources",
            "podsApi": "/var/lib/k0s/kubelet/pods-api",
            "devicePlugins": "/var/lib/k0s/kubelet/device-plugins",
            "pluginsRegistry": "/var/lib/k0s/kubelet/plugins_registry",
            "state": "/var/lib/k0s/pod-resources-watcher",
        },
        # The chart's own config with one change: a config of the operator's, in full.
        "config": (CHART / "files" / "config.toml").read_text().replace('level = "info"', 'level = "debug"'),
        "priorityClassName": "",
        "resourceQuota": {"enabled": False},
        "updateStrategy": {"maxUnavailable": 2},
        "terminationGracePeriodSeconds": 30,
        "podAnnotations": {"example.com/team": "gpu-platform"},
        "podLabels": {"team": "gpu-platform"},
        "networkPolicy": {"namespaces": ["monitoring", "observability"]},
        "monitoring": {
            "monitor": "PodMonitor",
            "interval": "1m",
            "scrapeTimeout": "15s",
            "labels": {"release": "prom"},
        },
        "kubernetesReporting": {"enabled": True, "tokenExpirationSeconds": 600},
        "fullnameOverride": "gpu-watcher",
    },
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=60, check=False)


def template(
    values: dict[str, Any],
    tmp: Path,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    *,
    skip_schema: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with `values` (written to a new file in `tmp`). `skip_schema`
    renders what the schema would refuse: what the templates alone make of a value."""
    path = tmp / f"values-{len(list(tmp.iterdir()))}.json"
    path.write_text(json.dumps(values))
    flags = ["--skip-schema-validation"] if skip_schema else []
    return helm("template", release, str(CHART), "--namespace", namespace, "--values", str(path), *flags)


def render(values: dict[str, Any], tmp: Path, **kw: Any) -> list[dict[str, Any]]:
    result = template(values, tmp, **kw)
    assert result.returncode == 0, result.stderr
    return load_yaml_docs(result.stdout)


def pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = the(objs, "DaemonSet")["spec"]["template"]["spec"]
    return spec
