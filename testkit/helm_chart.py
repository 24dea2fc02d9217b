"""The Helm chart rendered by the real helm (v4, from `testkit.tools`): `template` runs it on a values
dict and returns what helm printed; `render` returns the objects, `pod` the DaemonSet's pod spec."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from testkit.manifests import DEPLOY, load_yaml_docs, the
from testkit.tools import tool

__all__ = ["CHART", "NAMESPACE", "RELEASE", "SCHEMA_ERROR", "helm", "pod", "render", "template"]

CHART = DEPLOY / "helm" / "pod-resources-watcher"
RELEASE = "pod-resources-watcher"
NAMESPACE = "pod-resources-watcher"
# What helm says when values.schema.json refuses a values file.
SCHEMA_ERROR = "values don't meet the specifications of the schema"


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
