"""RBAC from YAML manifests for the fake API server (pyyaml is a test dependency), and the
generator of the package data that carries the shipped ClusterRole to the demo.

    .venv/bin/python -m testkit.kube_rbac    # rewrites watcher/sim/apiserver/shipped_rbac.json
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from watcher.sim.apiserver import Grant, grants_for
from watcher.sim.apiserver.rbac import SHIPPED_RBAC

__all__ = [
    "SHIPPED_MANIFEST",
    "SHIPPED_PACKAGE_DATA",
    "manifest_objects",
    "rules_from_manifests",
    "shipped_json",
]

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_MANIFEST = ROOT / "deploy" / "kubernetes" / "reporting" / "rbac.yaml"
SHIPPED_PACKAGE_DATA = ROOT / "watcher" / "sim" / "apiserver" / SHIPPED_RBAC


def manifest_objects(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every object in these YAML files, in order."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict))
    return docs


def rules_from_manifests(paths: Iterable[str | Path], *, service_account: str, namespace: str) -> list[Grant]:
    """The grants the ClusterRoles/Roles and their bindings in these YAML files give one service
    account (bound by name, or through the groups every service account is in)."""
    return grants_for(manifest_objects(paths), service_account=service_account, namespace=namespace)


def shipped_json() -> str:
    """What the package data must hold: the shipped manifest's objects, as JSON."""
    return json.dumps(manifest_objects([SHIPPED_MANIFEST]), indent=2) + "\n"


if __name__ == "__main__":
    SHIPPED_PACKAGE_DATA.write_text(shipped_json())
    print(f"wrote {SHIPPED_PACKAGE_DATA.relative_to(ROOT)} from {SHIPPED_MANIFEST.relative_to(ROOT)}")
