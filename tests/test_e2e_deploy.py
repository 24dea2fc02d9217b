"""deploy/ against the real API server (kube-testcluster): what tests/test_deploy.py and
tests/test_helm.py check offline against JSON schemas, the server itself decides here.

- Every kustomization (the base, each overlay) built by the real `kubectl kustomize`, and every
  documented Helm values set rendered by the real helm, is applied as admin with `kubectl apply
  --server-side --dry-run=server --validate=strict`: the server accepts every object, reports each one
  back, keeps every field sent (testkit/kube_dry_run.py), and warns about nothing. The SELinux
  component's privileged alternative is refused for one reason only: this server, like kube-apiserver
  by default, does not allow privileged containers.
- The Prometheus Operator's CRDs are installed first, for real, from testkit/prometheus_crds.py (an
  open schema: their objects' own fields are the one thing not checked here), and are Established;
  the namespace is created for real, since a dry-run cannot create the namespace its objects need.
- The reporting objects (ClusterRole and binding, ValidatingAdmissionPolicy and binding) are created for
  real, from kustomize and from the chart, read back, and the authorizer is asked what they grant
  (the fake API server's RBAC must answer the same).
- Negative controls, one per kind of check, so that "accepted" means something: an unknown field, an
  invalid value, a custom resource field outside the open schema, an admission policy whose CEL does
  not compile; the server refuses each with its own message. tests/test_e2e_chart_schema.py does the
  same for the chart's values schema.
"""

from __future__ import annotations

import copy
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from testkit.helm_chart import VALUES_SETS, template
from testkit.kube_dry_run import FIELD_MANAGER, as_yaml, dry_run, missing, returned
from testkit.kube_testcluster import KubeTestCluster
from testkit.manifests import (
    BASE,
    OVERLAYS,
    REPORTING,
    SELINUX,
    kustomize,
    load_yaml,
    load_yaml_docs,
    object_key,
    the,
)
from testkit.prometheus_crds import crds
from testkit.waiting import wait_until
from watcher.sim.apiserver.rbac import Attributes, allows, grants_for

pytestmark = pytest.mark.e2e

NAMESPACE = load_yaml(BASE / "namespace.yaml")["metadata"]["name"]
REPORTING_KINDS = (
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


# --- the cluster, the CRDs, the namespace ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(kube_cluster: KubeTestCluster) -> KubeTestCluster:
    """The session's API server with the CRDs installed and Established, and the manifests' namespace
    created for real (a dry-run creates nothing, so a namespaced object in a namespace that only the
    same dry-run creates is refused: the namespace must exist, as the chart's README says for helm)."""
    kube_cluster.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-", input=as_yaml(crds())
    )
    names = [f"crd/{c['metadata']['name']}" for c in crds()]
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    kube_cluster.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(BASE / "namespace.yaml")
    )
    return kube_cluster


def assert_accepted(cluster: KubeTestCluster, text: str) -> list[dict[str, Any]]:
    """The server accepts every object of `text`, reports each back, keeps every field, warns of none."""
    sent = load_yaml_docs(text)
    assert sent, "nothing to apply"
    result = dry_run(cluster, text)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    got = returned(result.stdout)
    assert sorted(map(object_key, got)) == sorted(map(object_key, sent))
    by_key = {object_key(o): o for o in got}
    for obj in sent:
        assert missing(obj, by_key[object_key(obj)]) == [], object_key(obj)
    return got


def assert_refused(cluster: KubeTestCluster, objs: list[dict[str, Any]], *messages: str) -> str:
    result = dry_run(cluster, as_yaml(objs))
    assert result.returncode != 0, result.stdout
    for message in messages:
        assert message in result.stderr, result.stderr
    return result.stderr


# --- the kustomizations ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def privileged_overlay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SELinux component's documented alternative (privileged.yaml) as an overlay of the base;
    kustomize reads a patch only from inside the overlay, so it is copied there."""
    directory = tmp_path_factory.mktemp("privileged")
    shutil.copy(SELINUX / "privileged.yaml", directory)
    target = {"group": "apps", "version": "v1", "kind": "DaemonSet", "name": "pod-resources-watcher"}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, directory)],  # kustomize refuses an absolute one
        "patches": [{"path": "privileged.yaml", "target": target}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


KUSTOMIZATIONS = {"base": BASE, **OVERLAYS}


@pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))
def test_kustomization_is_accepted_by_the_server(variant: str, cluster: KubeTestCluster) -> None:
    assert_accepted(cluster, kustomize(KUSTOMIZATIONS[variant]))


def test_the_privileged_alternative_is_accepted_by_the_server(
    cluster: KubeTestCluster, privileged_overlay: Path
) -> None:
    """The SELinux component's documented alternative, privileged: valid on a cluster that allows
    privileged containers (kube-testcluster runs with --allow-privileged=true, as kubeadm and kind do)."""
    objs = load_yaml_docs(kustomize(privileged_overlay))
    sc = the(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["privileged"] is True and sc["allowPrivilegeEscalation"] is True
    assert_accepted(cluster, as_yaml(objs))


# --- the chart ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_helm_values_set_is_accepted_by_the_server(
    name: str, cluster: KubeTestCluster, tmp_path: Path
) -> None:
    result = template(VALUES_SETS[name], tmp_path, namespace=NAMESPACE)
    assert result.returncode == 0, result.stderr
    assert_accepted(cluster, result.stdout)


# --- the CRDs -------------------------------------------------------------------------------------


def test_the_crds_are_established_and_serve_their_kinds(cluster: KubeTestCluster) -> None:
    for crd in crds():
        got = cluster.get("crd", crd["metadata"]["name"])
        conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
        assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True", conditions
    listed = cluster.kubectl(
        "api-resources", "--api-group=monitoring.coreos.com", "-o", "name"
    ).stdout.split()
    assert sorted(listed) == sorted(f"{c['spec']['names']['plural']}.monitoring.coreos.com" for c in crds())


# --- the reporting objects, for real ----------------------------------------------------------------

# (verb, API group, resource, subresource) -> whether the reporting ClusterRole grants it the agent.
ASKED = {
    ("create", "events.k8s.io", "events", ""): True,
    ("patch", "events.k8s.io", "events", ""): True,
    ("get", "", "nodes", "status"): True,
    ("patch", "", "nodes", "status"): True,
    ("get", "", "pods", ""): True,
    ("update", "", "nodes", "status"): False,
    ("patch", "", "nodes", ""): False,
    ("get", "", "nodes", ""): False,
    ("list", "", "pods", ""): False,
    ("watch", "", "pods", ""): False,
    ("create", "", "events", ""): False,
    ("delete", "events.k8s.io", "events", ""): False,
    ("list", "events.k8s.io", "events", ""): False,
    ("get", "", "secrets", ""): False,
}

PATCH_STATUS = ("patch", "", "nodes", "status")


# The defaults the server fills in on the admission policy (on the RBAC objects: none), besides the
# empty namespace and object selectors (zero values, which `missing` does not count). matchPolicy
# Equivalent: the policy also meets a request for nodes through any other version of the API.
SERVER_DEFAULTS = {
    "ValidatingAdmissionPolicy": [
        ".spec.matchConstraints.matchPolicy",
        ".spec.matchConstraints.resourceRules[0].scope",
    ]
}


def _kustomize_reporting(suffix: str) -> list[dict[str, Any]]:
    """The reporting overlay's cluster-scoped objects, made this test's own: each name gets `suffix`,
    and the agent they are for is a service account of a namespace of that name, so that nothing else
    running against the same server (the sink's end-to-end tests create the shipped objects) meets
    them. Only names change; every rule, expression and message is the shipped one."""
    objs = [
        o for o in load_yaml_docs(kustomize(OVERLAYS["kubernetes-reporting"])) if o["kind"] in REPORTING_KINDS
    ]
    shipped_user = f"system:serviceaccount:{NAMESPACE}:pod-resources-watcher"
    for obj in objs:
        obj["metadata"]["name"] += f"-{suffix}"
    binding = the(objs, "ClusterRoleBinding")
    binding["roleRef"]["name"] += f"-{suffix}"
    (subject,) = binding["subjects"]
    subject["namespace"] = f"prw-{suffix}"
    the(objs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] += f"-{suffix}"
    (condition,) = the(objs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert shipped_user in condition["expression"]
    condition["expression"] = condition["expression"].replace(
        shipped_user, f"system:serviceaccount:prw-{suffix}:pod-resources-watcher"
    )
    return objs


def _helm_reporting(suffix: str, tmp: Path) -> list[dict[str, Any]]:
    """The chart's, for a release and namespace of this test's own: the chart names them itself."""
    result = template(VALUES_SETS["reporting"], tmp, release=f"prw-{suffix}", namespace=f"prw-{suffix}")
    assert result.returncode == 0, result.stderr
    return [o for o in load_yaml_docs(result.stdout) if o["kind"] in REPORTING_KINDS]


def can_i(cluster: KubeTestCluster, user: str, verb: str, group: str, resource: str, sub: str) -> bool:
    """The real authorizer's answer (a SubjectAccessReview as `user`, by impersonation)."""
    qualified = f"{resource}.{group}" if group else resource
    subresource = [f"--subresource={sub}"] if sub else []
    result = cluster.kubectl("auth", "can-i", verb, qualified, *subresource, f"--as={user}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


@pytest.fixture
def created(cluster: KubeTestCluster) -> Iterator[list[list[dict[str, Any]]]]:
    """What a test creates for real, deleted again after it."""
    batches: list[list[dict[str, Any]]] = []
    yield batches
    for objs in batches:
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=as_yaml(objs))


@pytest.mark.parametrize("source", ["kustomize", "helm"])
async def test_reporting_objects_are_created_read_back_and_grant_exactly_the_role(
    source: str, cluster: KubeTestCluster, created: list[list[dict[str, Any]]], tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    objs = _kustomize_reporting(suffix) if source == "kustomize" else _helm_reporting(suffix, tmp_path)
    assert sorted(o["kind"] for o in objs) == sorted(REPORTING_KINDS)
    (subject,) = the(objs, "ClusterRoleBinding")["subjects"]
    user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    # Before: the agent's service account may do nothing at all.
    assert not can_i(cluster, user, *PATCH_STATUS)

    created.append(objs)
    made = returned(cluster.kubectl("create", "-o", "json", "-f", "-", input=as_yaml(objs)).stdout)
    assert sorted(map(object_key, made)) == sorted(map(object_key, objs))
    for obj in objs:
        kind, _, name = object_key(obj)
        got = cluster.get(kind, name)
        assert missing(obj, got) == [], (kind, name)
        # What the server added of its own, besides metadata (and an empty status: the type-checking
        # controller that fills a policy's status runs in kube-controller-manager, not here).
        added = missing({k: v for k, v in got.items() if k not in ("metadata", "status")}, obj)
        assert [a.partition(":")[0] for a in added] == SERVER_DEFAULTS.get(kind, []), added
    policy = the(objs, "ValidatingAdmissionPolicy")
    assert the(objs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]

    # The authorizer learns of the new binding from its cache: wait for the first grant, then ask all.
    await wait_until(lambda: can_i(cluster, user, *PATCH_STATUS), timeout=30, what="the RBAC grant")
    real = {asked: can_i(cluster, user, *asked) for asked in ASKED}
    assert real == ASKED
    # The fake API server's RBAC (watcher/sim/apiserver) answers the same of the same objects.
    grants = grants_for(objs, service_account=subject["name"], namespace=subject["namespace"])
    fake = {asked: allows(grants, Attributes(*asked, namespace="default", name="")) for asked in ASKED}
    assert fake == real


# --- negative controls: the server really checks ----------------------------------------------------


@pytest.fixture(scope="module")
def base_objects() -> list[dict[str, Any]]:
    return load_yaml_docs(kustomize(BASE))


def test_the_dry_run_refuses_an_unknown_field(
    cluster: KubeTestCluster, base_objects: list[dict[str, Any]]
) -> None:
    """Server-side apply refuses a field the type lacks whatever the field validation (it cannot build
    the typed patch); a plain create refuses it only under fieldValidation=Strict, and else accepts
    it, dropping the field with at most a warning."""
    daemonset = copy.deepcopy(the(base_objects, "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readonly"] = True
    mount = '.volumeMounts[mountPath="/var/lib/kubelet/pod-resources"].readonly: field not declared in schema'
    assert_refused(cluster, [daemonset], 'spec.containers[name="watcher"]' + mount)
    apply = ["apply", "--server-side", "--dry-run=server", "-f", "-"]
    ignoring = cluster.kubectl(*apply, "--validate=ignore", input=as_yaml([daemonset]), check=False)
    assert ignoring.returncode != 0 and mount in ignoring.stderr, ignoring.stderr
    create = ["create", "--dry-run=server", "-f", "-"]
    strict = cluster.kubectl(*create, "--validate=strict", input=as_yaml([daemonset]), check=False)
    assert strict.returncode != 0
    where = "spec.template.spec.containers[0].volumeMounts[0].readonly"
    assert f'strict decoding error: unknown field "{where}"' in strict.stderr, strict.stderr
    lax = cluster.kubectl(*create, "--validate=ignore", input=as_yaml([daemonset]), check=False)
    assert lax.returncode == 0 and "created (server dry run)" in lax.stdout, lax.stderr


def _mount_of_no_volume(pod: dict[str, Any]) -> None:
    pod["containers"][0]["volumeMounts"][0]["name"] = "no-such-volume"


def _privileged_without_escalation(pod: dict[str, Any]) -> None:
    # Why the SELinux component's privileged.yaml changes both fields.
    pod["containers"][0]["securityContext"]["privileged"] = True


INVALID_VALUES = {
    "mount-of-no-volume": (_mount_of_no_volume, 'volumeMounts[0].name: Not found: "no-such-volume"'),
    "privileged-without-escalation": (
        _privileged_without_escalation,
        "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_VALUES))
def test_the_dry_run_refuses_an_invalid_value(
    case: str, cluster: KubeTestCluster, base_objects: list[dict[str, Any]]
) -> None:
    """Well-formed against the schema, refused by the server's validation."""
    change, complaint = INVALID_VALUES[case]
    daemonset = copy.deepcopy(the(base_objects, "DaemonSet"))
    change(daemonset["spec"]["template"]["spec"])
    assert_refused(cluster, [daemonset], complaint)


def test_the_dry_run_refuses_a_selector_that_misses_the_pods(
    cluster: KubeTestCluster, base_objects: list[dict[str, Any]]
) -> None:
    daemonset = copy.deepcopy(the(base_objects, "DaemonSet"))
    daemonset["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "another-agent"
    assert_refused(cluster, [daemonset], "`selector` does not match template `labels`")


def test_the_dry_run_refuses_a_custom_resource_outside_its_crd(cluster: KubeTestCluster) -> None:
    monitor = load_yaml(BASE / "monitoring" / "podmonitor.yaml")
    """The CRDs' open schema ends at `spec`: a field beside it is refused as for a built-in kind. A
    kind no CRD serves is refused by kubectl itself, from the server's discovery."""
    outside = {**copy.deepcopy(monitor), "endpoints": []}
    assert_refused(cluster, [outside], "Kind=PodMonitor): .endpoints: field not declared in schema")
    probe = {**copy.deepcopy(monitor), "kind": "Probe"}  # a Prometheus Operator kind not installed
    assert_refused(cluster, [probe], 'no matches for kind "Probe" in version "monitoring.coreos.com/v1"')


def test_a_dry_run_cannot_create_the_namespace_its_objects_need(
    cluster: KubeTestCluster, base_objects: list[dict[str, Any]]
) -> None:
    """Why the `cluster` fixture creates the namespace for real: a dry-run persists nothing, so the
    base applied to a cluster without its namespace is refused (`kubectl apply --dry-run=server -k`
    fails there, where the real apply succeeds)."""
    namespace = f"prw-{uuid.uuid4().hex[:8]}"
    objs = [copy.deepcopy(the(base_objects, "Namespace")), copy.deepcopy(the(base_objects, "ConfigMap"))]
    objs[0]["metadata"]["name"] = objs[1]["metadata"]["namespace"] = namespace
    assert_refused(cluster, objs, f'namespaces "{namespace}" not found')


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("variables.nodeNam != ''", "undefined field 'nodeNam'"),
        ("variables.nodeName == 1", "found no matching overload for '_==_'"),
        ("variables.statusUpdate &&", "Syntax error"),
    ],
    ids=["undefined-variable", "type-error", "syntax-error"],
)
def test_the_dry_run_refuses_an_admission_policy_whose_cel_does_not_compile(
    expression: str, complaint: str, cluster: KubeTestCluster
) -> None:
    policy = copy.deepcopy(
        the(load_yaml_docs((REPORTING / "admissionpolicy.yaml").read_text()), "ValidatingAdmissionPolicy")
    )
    policy["metadata"]["name"] += f"-{uuid.uuid4().hex[:8]}"
    policy["spec"]["validations"][1]["expression"] = expression
    assert_refused(cluster, [policy], "spec.validations[1].expression", "compilation failed", complaint)
