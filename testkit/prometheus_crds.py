"""The Prometheus Operator's CustomResourceDefinitions the deploy manifests use (PodMonitor,
ServiceMonitor, PrometheusRule), in the smallest form a real API server accepts, so that the
end-to-end tests can install them without the network.

They carry only the group, version, kind and scope, and an open schema: `spec` keeps whatever it is
given (x-kubernetes-preserve-unknown-fields). A server-side dry-run against them therefore checks
everything about these objects (the kind exists, apiVersion, metadata, namespace, that nothing but
`spec` sits at the top level) except the fields inside their `spec`, which the operator's own,
much larger schemas would check; tests/test_deploy.py and tests/test_helm.py check those by hand.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GROUP", "KINDS", "VERSION", "crd", "crds"]

GROUP = "monitoring.coreos.com"
VERSION = "v1"
# kind -> plural, as the operator names them.
KINDS = {
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
}


def crd(kind: str) -> dict[str, Any]:
    """The minimal structural CRD for one of KINDS: namespaced, one served and stored version."""
    plural = KINDS[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


def crds() -> list[dict[str, Any]]:
    return [crd(kind) for kind in KINDS]
