"""Manifests put to a real API server (a `KubeTestCluster`) without persisting them: `dry_run` runs
`kubectl apply --server-side --dry-run=server --validate=strict`, `returned` reads back the objects
the server answered with, and `missing` says where such an object lost or changed a field that was
sent.

Two things the real server does to what it is sent, which `missing` forgives and nothing else:
- a field at its zero value (false, 0, "", an empty list or map) that the Go type omits when empty
  comes back absent (`hostNetwork: false`);
- a resource quantity comes back in its canonical form (`pods: "100000"` as `100k`).
"""

from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal
from typing import Any

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from testkit.kube_testcluster import KubeTestCluster

__all__ = ["FIELD_MANAGER", "as_yaml", "dry_run", "missing", "returned"]

FIELD_MANAGER = "prw-e2e-deploy"

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SCALE = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
_ZERO: tuple[Any, ...] = (False, 0, "", [], {})


def as_yaml(objs: list[dict[str, Any]]) -> str:
    return str(yaml.safe_dump_all(objs, sort_keys=False))


def dry_run(cluster: KubeTestCluster, text: str) -> subprocess.CompletedProcess[str]:
    """Server-side apply of the manifests in `text` (YAML or JSON), as the admin, dry-run, strict
    field validation, the objects printed back as JSON; kubectl's own result, exit code unchecked.

    --force-conflicts: where an object of that name already exists, made by another field manager
    (another test's `kubectl apply` of the shipped policy), the apply would fail on who owns a field,
    not on whether the manifest is valid; forcing takes the fields over in this dry-run only."""
    return cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "--validate=strict",
        f"--field-manager={FIELD_MANAGER}",
        "-o",
        "json",
        "-f",
        "-",
        input=text,
        check=False,
    )


def returned(stdout: str) -> list[dict[str, Any]]:
    """The objects of kubectl's `-o json` output: one JSON document per object, or a List."""
    decoder, at = json.JSONDecoder(), 0
    objs: list[dict[str, Any]] = []
    while stdout[at:].strip():
        at += len(stdout[at:]) - len(stdout[at:].lstrip())
        obj, at = decoder.raw_decode(stdout, at)
        objs.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    return objs


def _quantity(value: Any) -> Decimal | None:
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    return None if match is None else Decimal(match[1]) * _SCALE[match[2] or ""]


def missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Every path where `got` lacks or changed what `sent` holds (fields `got` adds are the server's
    defaults, not counted); empty when the server kept everything."""
    if isinstance(sent, dict) and isinstance(got, dict):
        return [p for k, v in sent.items() for p in missing(v, got.get(k), f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(got, list) and len(sent) == len(got):
        return [
            p for i, (s, g) in enumerate(zip(sent, got, strict=True)) for p in missing(s, g, f"{path}[{i}]")
        ]
    if sent == got or (got is None and any(sent == z and type(sent) is type(z) for z in _ZERO)):
        return []
    if _quantity(sent) is not None and _quantity(sent) == _quantity(got):
        return []
    return [f"{path}: sent {sent!r}, got {got!r}"]
