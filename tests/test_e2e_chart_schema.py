"""The Helm chart's values.schema.json against the real API server (kube-testcluster): the values
tests/test_chart_hardening.py has the schema refuse as "what Kubernetes would", rendered with the
schema off and put to the server (server-side apply, dry-run, strict). Where the server refuses one,
the schema and Kubernetes agree, and the test holds the server's own message (the field it names and
why); where the server accepts one, the schema is the only guard against it (a digest no registry
serves, a namespace label no namespace carries), and the test says so by expecting acceptance.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.helm_chart import template
from testkit.kube_dry_run import dry_run
from testkit.kube_testcluster import KubeTestCluster

pytestmark = pytest.mark.e2e

RFC_1123 = "a lowercase RFC 1123 subdomain must consist of"
# case -> (values, what the server says; None: it accepts the render).
SCHEMA_REFUSES: dict[str, tuple[dict[str, Any], str | None]] = {
    "upper-case-fullname": (
        {"fullnameOverride": "Agent"},
        f'"Agent" is invalid: metadata.name: Invalid value: "Agent": {RFC_1123}',
    ),
    # 63 is a label's limit; object names may be subdomains (253), and a DaemonSet's pods are named
    # from a shortened prefix.
    "long-fullname": ({"fullnameOverride": "a" * 64}, None),
    "underscore-name": (
        {"nameOverride": "pod_watcher"},
        f'metadata.name: Invalid value: "pod-resources-watcher-pod_watcher": {RFC_1123}',
    ),
    # The server takes any image string: a bad digest fails only when the kubelet pulls it.
    "short-digest": ({"image": {"digest": "sha256:abc"}}, None),
    "upper-case-repository": ({"image": {"repository": "Registry/Image"}}, None),
    "label-value-with-space": (
        {"podLabels": {"tier": "a b"}},
        'spec.template.labels: Invalid value: "a b": a valid label must be',
    ),
    "node-selector-key-with-space": (
        {"nodeSelector": {"bad key": "x"}},
        'spec.template.spec.nodeSelector: Invalid value: "bad key": name part must consist of',
    ),
    "host-path-backsteps": (
        {"hostPaths": {"devicePlugins": "/var/lib/kubelet/../../etc"}},
        "hostPath.path: Invalid value: \"/var/lib/kubelet/../../etc\": must not contain '..'",
    ),
    "host-path-double-slash": ({"hostPaths": {"podResources": "/var/lib/kubelet//pod-resources"}}, None),
    "state-backsteps": (
        {"hostPaths": {"state": "/srv/../var/lib"}},
        "hostPath.path: Invalid value: \"/srv/../var/lib\": must not contain '..'",
    ),
    "toleration-equal-no-key": (
        {"tolerations": [{"operator": "Equal"}]},
        'tolerations[0].operator: Invalid value: "Equal": operator must be Exists when `key` is empty',
    ),
    # The server names the operator's field for the value it refuses.
    "toleration-exists-value": (
        {"tolerations": [{"operator": "Exists", "value": "x"}]},
        "tolerations[0].operator: Invalid value: \"x\": value must be empty when `operator` is 'Exists'",
    ),
    "toleration-seconds-no-effect": (
        {"tolerations": [{"key": "a", "tolerationSeconds": 5}]},
        'tolerations[0].effect: Invalid value: "": '
        "effect must be 'NoExecute' when `tolerationSeconds` is set",
    ),
    "toleration-bad-effect": (
        {"tolerations": [{"key": "a", "effect": "NoRun"}]},
        'tolerations[0].effect: Unsupported value: "NoRun"',
    ),
    "toleration-unknown-field": (
        {"tolerations": [{"keys": "a", "operator": "Exists"}]},
        ".spec.template.spec.tolerations[0].keys: field not declared in schema",
    ),
    # A label value may have capitals, a namespace name may not: the policy would admit nobody.
    "upper-case-namespace-label": ({"networkPolicy": {"namespaces": ["Monitoring"]}}, None),
    "priority-class-with-spaces": (
        {"priorityClassName": "System Node Critical"},
        f'spec.template.spec.priorityClassName: Invalid value: "System Node Critical": {RFC_1123}',
    ),
    "secret-name-underscore": (
        {"secrets": {"existingSecret": "Gpu_Alerts"}},
        f'envFrom[0].secretRef.name: Invalid value: "Gpu_Alerts": {RFC_1123}',
    ),
}


@pytest.fixture(scope="module")
def namespace(kube_cluster: KubeTestCluster) -> str:
    """A namespace of this module's own, for real: a dry-run cannot create the one its objects need."""
    name = f"prw-schema-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    return name


@pytest.mark.parametrize("case", sorted(SCHEMA_REFUSES))
def test_the_server_on_what_the_chart_schema_refuses(
    case: str, kube_cluster: KubeTestCluster, namespace: str, tmp_path: Path
) -> None:
    values, complaint = SCHEMA_REFUSES[case]
    refused = template(values, tmp_path, namespace=namespace)
    assert refused.returncode != 0 and refused.stdout == "", refused.stdout
    rendered = template(values, tmp_path, namespace=namespace, skip_schema=True)
    assert rendered.returncode == 0, rendered.stderr
    result = dry_run(kube_cluster, rendered.stdout)
    if complaint is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and complaint in result.stderr, result.stderr
