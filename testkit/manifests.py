"""The deploy/ manifests as the tests read them: strict YAML (duplicate keys rejected), and `build()`,
a small builder for the subset of kustomize these files use, which runs everywhere and fails on any
field it does not implement and on any referenced file that is missing; `kustomize()`, what the real
kustomize prints. `SCHEMA_VERSION` is the newest Kubernetes version whose schemas `kubernetes-validate`
bundles."""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

try:
    from kubernetes_validate import utils as kv_utils  # type: ignore[import-untyped]
except ImportError as err:  # pragma: no cover - a missing test dependency
    raise ImportError(
        'testkit/manifests.py needs kubernetes-validate: add "kubernetes-validate>=1.30" to the test extra'
    ) from err

from testkit.tools import tool

__all__ = [
    "BASE",
    "CLUSTER_SCOPED",
    "DEPLOY",
    "MONITORING",
    "OVERLAYS",
    "REPORTING",
    "SCHEMA_VERSION",
    "SELINUX",
    "KustomizeError",
    "apply_patch",
    "build",
    "env_file",
    "kinds",
    "kustomize",
    "load_yaml",
    "load_yaml_docs",
    "object_key",
    "the",
]

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kubernetes"
SELINUX = BASE / "selinux"
MONITORING = BASE / "monitoring"
REPORTING = BASE / "reporting"
OVERLAYS = {
    "selinux": DEPLOY / "overlays" / "selinux",
    "monitoring": DEPLOY / "overlays" / "monitoring",
    "kubernetes-reporting": DEPLOY / "overlays" / "kubernetes-reporting",
}

# Kinds that are not namespaced (the namespace transformer leaves them alone).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}

SCHEMA_VERSION = kv_utils.latest_version()


# --- YAML -----------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last one silently)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml_docs(text: str) -> list[Any]:
    return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]


def load_yaml(path: Path) -> Any:
    (doc,) = load_yaml_docs(path.read_text())
    return doc


# --- a small kustomize ----------------------------------------------------------------------------

KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "components",
    "configMapGenerator",
    "secretGenerator",
    "patches",
}
GENERATOR_KEYS = {"name", "files", "literals", "envs", "type", "namespace", "behavior"}


class KustomizeError(AssertionError):
    pass


def _existing(directory: Path, ref: str, what: str) -> Path:
    path = (directory / ref).resolve()
    if not path.exists():
        raise KustomizeError(f"{directory}/kustomization.yaml: {what} {ref!r} does not exist")
    return path


def _read_kustomization(directory: Path, kind: str) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    k: dict[str, Any] = load_yaml(path)
    unsupported = set(k) - KUSTOMIZATION_KEYS
    if unsupported:
        raise KustomizeError(f"{path}: fields this builder does not implement: {sorted(unsupported)}")
    want_api = (
        "kustomize.config.k8s.io/v1alpha1" if kind == "Component" else "kustomize.config.k8s.io/v1beta1"
    )
    if k.get("kind") != kind or k.get("apiVersion") != want_api:
        raise KustomizeError(f"{path}: expected {want_api} {kind}, got {k.get('apiVersion')} {k.get('kind')}")
    return k


def env_file(path: Path) -> dict[str, str]:
    """kustomize's env-file format: KEY=VALUE lines; blank lines and # comments skipped."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise KustomizeError(f"{path}:{n}: not KEY=VALUE")
        out[key.strip()] = value
    return out


def _generate(directory: Path, spec: dict[str, Any], kind: str) -> dict[str, Any]:
    unsupported = set(spec) - GENERATOR_KEYS
    if unsupported:
        raise KustomizeError(f"{directory}: generator fields not implemented: {sorted(unsupported)}")
    data: dict[str, str] = {}
    for ref in spec.get("files", []):
        key, _, file = ref.rpartition("=")
        path = _existing(directory, file, "file")
        data[key or path.name] = path.read_text()
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for ref in spec.get("envs", []):
        data.update(env_file(_existing(directory, ref, "env file")))
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}}
    if kind == "Secret":
        obj["type"] = spec.get("type", "Opaque")
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    if "namespace" in spec:
        obj["metadata"]["namespace"] = spec["namespace"]
    return obj


def _add_generated(objs: list[dict[str, Any]], spec: dict[str, Any], obj: dict[str, Any]) -> None:
    """behavior create (the default) adds the object; merge and replace change the one of that kind,
    name and namespace already built (a component's way to change the base's generated ConfigMap)."""
    behavior = spec.get("behavior", "create")
    if behavior == "create":
        objs.append(obj)
        return
    if behavior not in ("merge", "replace"):
        raise KustomizeError(f"generator behavior {behavior!r} not implemented")
    namespace = obj["metadata"].get("namespace", "")
    hits = [o for o in objs if object_key(o) == (obj["kind"], namespace, obj["metadata"]["name"])]
    if not hits:
        raise KustomizeError(f"generator {spec['name']}: behavior {behavior} finds nothing to {behavior}")
    (existing,) = hits
    if behavior == "merge":
        existing["data"].update(obj["data"])
    else:
        existing["data"] = obj["data"]


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"not a JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """RFC 6902 add / replace / remove, as kustomize applies a JSON 6902 patch."""
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        kind = op["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                node[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[index]
            else:
                raise KustomizeError(f"JSON patch op {kind!r} not implemented")
        elif kind == "add":
            node[last] = copy.deepcopy(op["value"])
        elif kind in ("replace", "remove"):
            if last not in node:
                raise KustomizeError(f"{kind} {op['path']}: no such path")
            if kind == "remove":
                del node[last]
            else:
                node[last] = copy.deepcopy(op["value"])
        else:
            raise KustomizeError(f"JSON patch op {kind!r} not implemented")


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    have = {"group": group, "version": version, "kind": obj["kind"], "name": obj["metadata"]["name"]}
    unsupported = set(target) - set(have)
    if unsupported:
        raise KustomizeError(f"patch target fields not implemented: {sorted(unsupported)}")
    return all(have[k] == v for k, v in target.items())


def apply_patch(directory: Path, patch: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    if set(patch) - {"path", "patch", "target"} or "target" not in patch:
        raise KustomizeError(f"{directory}: only JSON 6902 patches with a target are implemented: {patch}")
    text = _existing(directory, patch["path"], "patch").read_text() if "path" in patch else patch["patch"]
    ops = load_yaml_docs(text)
    if len(ops) != 1 or not isinstance(ops[0], list):
        raise KustomizeError(f"{directory}: patch {patch} is not a JSON 6902 list (strategic merge?)")
    hits = [o for o in objs if _matches(o, patch["target"])]
    if not hits:
        raise KustomizeError(f"{directory}: patch target {patch['target']} matches nothing")
    for obj in hits:
        _json_patch(obj, ops[0])


def _run(directory: Path, kind: str, accumulated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    k = _read_kustomization(directory, kind)
    objs = list(accumulated)
    for ref in k.get("resources", []):
        path = _existing(directory, ref, "resource")
        objs += build(path) if path.is_dir() else copy.deepcopy(load_yaml_docs(path.read_text()))
    for ref in k.get("components", []):
        objs = _run(_existing(directory, ref, "component"), "Component", objs)
    for kind, generators in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for spec in k.get(generators, []):
            _add_generated(objs, spec, _generate(directory, spec, kind))
    for patch in k.get("patches", []):
        apply_patch(directory, patch, objs)
    if "namespace" in k:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    return objs


def build(directory: Path) -> list[dict[str, Any]]:
    """Build a kustomization directory: resources (files and directories), components, config map and
    secret generators (without the name hash; behavior create, merge or replace), JSON 6902 patches,
    namespace."""
    objs = _run(directory.resolve(), "Kustomization", [])
    keys = [object_key(o) for o in objs]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise KustomizeError(f"{directory}: the same object twice: {sorted(duplicates)}")
    return objs


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def kinds(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def the(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def kustomize(directory: Path) -> str:
    """What the real kustomize (`kubectl kustomize`, from testkit.tools) prints for `directory`."""
    command = [tool("kubectl"), "kustomize", str(directory)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout
