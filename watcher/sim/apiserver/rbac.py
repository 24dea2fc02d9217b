"""RBAC for the fake API server: which rules a service account is bound to, and what they allow.
The shipped ClusterRole and its binding come as package data (`shipped_rbac`).

The matching follows the real authorizer (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac):
`*` matches any group, resource or verb; a resource is matched with its subresource
(`nodes/status`), or by `*/status`; `resourceNames` restricts by the name in the URL, so a create
(whose URL has no name) is never granted by a rule with resourceNames. A ClusterRoleBinding grants
everywhere, a RoleBinding only in its own namespace (also when it points at a ClusterRole).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from watcher.sim.apiserver.values import Json

__all__ = ["SHIPPED_RBAC", "Attributes", "Grant", "allows", "forbidden_message", "grants_for", "shipped_rbac"]

# Package data beside this module, generated from the manifest (python -m testkit.kube_rbac).
SHIPPED_RBAC = "shipped_rbac.json"


@dataclasses.dataclass(frozen=True)
class Grant:
    """One PolicyRule and where it applies: everywhere (`namespace` None) or in one namespace."""

    rule: Mapping[str, Any]
    namespace: str | None = None


@dataclasses.dataclass(frozen=True)
class Attributes:
    """What a resource request asks for, as the authorizer sees it."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


def _rule_matches(rule: Mapping[str, Any], a: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and a.group not in groups:
        return False
    combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    resources = rule.get("resources") or []
    if not any(r in ("*", combined) or (a.subresource and r == f"*/{a.subresource}") for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


def allows(grants: Iterable[Grant | Mapping[str, Any]], a: Attributes) -> bool:
    """Whether any grant allows the request; a bare rule (a dict) applies everywhere."""
    for grant in grants:
        g = grant if isinstance(grant, Grant) else Grant(grant)
        # A cluster-scoped request, or a list across all namespaces, needs a cluster-wide grant.
        if g.namespace is not None and g.namespace != a.namespace:
            continue
        if _rule_matches(g.rule, a):
            return True
    return False


def forbidden_message(username: str, a: Attributes) -> str:
    """The real server's 403 message, word for word."""
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    subject = f'{qualified} "{a.name}"' if a.name else qualified
    why = f'User "{username}" cannot {a.verb} resource "{resource}" in API group "{a.group}"'
    where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    return f"{subject} is forbidden: {why} {where}"


def shipped_rbac() -> list[Json]:
    """The RBAC objects of deploy/kubernetes/reporting/rbac.yaml (the shipped ClusterRole and its
    binding), from the package data generated from it: an installed package has no deploy/."""
    text = resources.files("watcher.sim.apiserver").joinpath(SHIPPED_RBAC).read_text(encoding="utf-8")
    docs: list[Json] = json.loads(text)
    return docs


def grants_for(
    documents: Iterable[Mapping[str, Any]], *, service_account: str, namespace: str
) -> list[Grant]:
    """The grants the ClusterRoles/Roles and their bindings among these objects give one service
    account (bound by name, or through the groups every service account is in)."""
    docs = [d for d in documents if isinstance(d, Mapping)]
    cluster_roles = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ClusterRole"}
    roles = {
        (d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d
        for d in docs
        if d.get("kind") == "Role"
    }
    groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}

    def bound(binding: Mapping[str, Any], binding_ns: str | None) -> bool:
        for s in binding.get("subjects") or []:
            is_sa = s.get("kind") == "ServiceAccount" and s.get("name") == service_account
            if is_sa and s.get("namespace", binding_ns) == namespace:
                return True
            if s.get("kind") == "Group" and s.get("name") in groups:
                return True
        return False

    grants: list[Grant] = []
    for d in docs:
        kind = d.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        binding_ns = d["metadata"].get("namespace", "default") if kind == "RoleBinding" else None
        if not bound(d, binding_ns):
            continue
        ref = d.get("roleRef") or {}
        role: Mapping[str, Any] | None
        if ref.get("kind") == "ClusterRole":
            role = cluster_roles.get(ref.get("name", ""))
        elif binding_ns is not None:
            role = roles.get((binding_ns, ref.get("name", "")))
        else:
            role = None  # a ClusterRoleBinding cannot point at a Role: the real server refuses it
        rules: Sequence[Mapping[str, Any]] = (role or {}).get("rules") or []
        grants.extend(Grant(rule, binding_ns) for rule in rules if not rule.get("nonResourceURLs"))
    return grants
