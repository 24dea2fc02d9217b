"""deploy/helm/pod-resources-watcher: the Helm chart, rendered by the real helm and checked offline.

- `helm lint` passes; `helm template` renders every documented values set, and every object it renders
  validates against the Kubernetes JSON schemas (kubernetes-validate, strict); the Prometheus Operator's
  CRDs (PodMonitor, ServiceMonitor, PrometheusRule) are checked by hand.
- values.schema.json rejects wrong types, unknown keys and bad enum values, with helm's own error.
- The chart and the kustomize base do not drift: with the defaults the DaemonSet's pod is the base's
  (the one difference, the control-plane exclusion, is asserted exactly), and with kubernetesReporting
  on, the RBAC rules, the admission policy, the token volume and the config are the reporting overlay's.
- The chart's files/ copies (alerts, config, admission policy) equal the files they were copied from:
  helm cannot read outside the chart.

helm comes from PATH, or .ci/bin where `.ci/run` installs it; without it these tests fail.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from testkit.helm_chart import CHART, NAMESPACE, SCHEMA_ERROR, VALUES_SETS, helm, pod, render, template
from testkit.manifests import (
    DEPLOY,
    OVERLAYS,
    REPORTING,
    SCHEMA_VERSION,
    build,
    load_yaml,
    the,
)

ROOT = Path(__file__).resolve().parent.parent
FILES = CHART / "files"
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
CONTROL_PLANE_EXCLUSION = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
                    ]
                }
            ]
        }
    }
}
BASE_KINDS = ["ConfigMap", "DaemonSet", "NetworkPolicy", "ResourceQuota", "ServiceAccount"]
REPORTING_KINDS = [
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
]

EXPECTED_KINDS = {
    "defaults": BASE_KINDS,
    "podmonitor": sorted([*BASE_KINDS, "PodMonitor", "PrometheusRule", "Service"]),
    "servicemonitor": sorted([*BASE_KINDS, "Service", "ServiceMonitor"]),
    "reporting": sorted(BASE_KINDS + REPORTING_KINDS),
    "placement": BASE_KINDS,
    "existing-secret": BASE_KINDS,
    # resourceQuota off, a PodMonitor without the Service, reporting on.
    "every-option": sorted(
        [k for k in BASE_KINDS if k != "ResourceQuota"] + ["PodMonitor", *REPORTING_KINDS]
    ),
}


def kinds(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objs)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("values")
    return {name: render(values, tmp) for name, values in VALUES_SETS.items()}


@pytest.fixture(scope="module")
def kustomized() -> dict[str, list[dict[str, Any]]]:
    return {"base": build(DEPLOY / "kubernetes"), "reporting": build(OVERLAYS["kubernetes-reporting"])}


# --- lint and render --------------------------------------------------------------------------------


def test_helm_is_v4_and_lint_passes(tmp_path: Path) -> None:
    version = helm("version", "--short")
    assert version.returncode == 0 and version.stdout.startswith("v4."), version.stdout + version.stderr
    for values in ({}, VALUES_SETS["reporting"], VALUES_SETS["podmonitor"]):
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        result = helm("lint", "--strict", str(CHART), "--values", str(path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_each_values_set_renders_the_expected_objects_and_they_validate(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objs = rendered[name]
    assert kinds(objs) == EXPECTED_KINDS[name]
    for obj in objs:
        cluster_scoped = obj["kind"] in REPORTING_KINDS
        assert ("namespace" in obj["metadata"]) is not cluster_scoped, obj["kind"]
        if not cluster_scoped:
            assert obj["metadata"]["namespace"] == NAMESPACE
        if obj["kind"] in CRD_KINDS:
            continue  # checked by hand below
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']} invalid against Kubernetes {SCHEMA_VERSION}: {where}: {err.message}")


def _selects_the_agent(selector: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    labels = the(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selector["matchLabels"] and selector["matchLabels"].items() <= labels.items()


def test_podmonitor_service_and_prometheusrule_by_hand(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["podmonitor"]
    pm = the(objs, "PodMonitor")
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(pm, SCHEMA_VERSION, strict=True)
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and set(pm) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    }
    assert set(pm["spec"]) == {"selector", "podMetricsEndpoints"}
    _selects_the_agent(pm["spec"]["selector"], objs)
    kustomize_pm = load_yaml(DEPLOY / "kubernetes" / "monitoring" / "podmonitor.yaml")
    assert pm["spec"]["podMetricsEndpoints"] == kustomize_pm["spec"]["podMetricsEndpoints"]
    service = the(objs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == pm["spec"]["selector"]["matchLabels"]
    assert (
        service["spec"]["ports"] == load_yaml(DEPLOY / "kubernetes/monitoring/service.yaml")["spec"]["ports"]
    )
    rule = the(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == load_yaml(DEPLOY / "prometheus" / "alerts.yaml")["groups"]


def test_servicemonitor_by_hand(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["servicemonitor"]
    sm = the(objs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and set(sm) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    }
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert set(sm["spec"]) == {"selector", "endpoints"}
    service = the(objs, "Service")
    # It selects the Service (by its labels), and the Service selects the agent's pods.
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    _selects_the_agent({"matchLabels": service["spec"]["selector"]}, objs)
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "30s" and endpoint["scrapeTimeout"] == "10s"
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
        # One job name whatever the release is called: the alerts match on it.
        {"targetLabel": "job", "replacement": "pod-resources-watcher", "action": "replace"},
    ]


# --- the schema ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"monitoring": {"monitor": "Podmonitor"}}, "/monitoring/monitor': value must be one of"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy': value must be one of"),
        (
            {"kubernetesReporting": {"enabled": "yes"}},
            "/kubernetesReporting/enabled': got string, want boolean",
        ),
        ({"resources": {"limits": {"cpu": True}}}, "/resources/limits/cpu'"),
        ({"tolerations": {"operator": "Exists"}}, "/tolerations': got object, want array"),
        ({"nodeSelectr": {"a": "b"}}, "additional properties 'nodeSelectr' not allowed"),
        ({"monitoring": {"podMonitor": True}}, "additional properties 'podMonitor' not allowed"),
        ({"networkPolicy": {"namespaces": []}}, "/networkPolicy/namespaces': minItems"),
        ({"hostPaths": {"podResources": "var/lib/kubelet/pod-resources"}}, "/hostPaths/podResources'"),
        (
            {"kubernetesReporting": {"tokenExpirationSeconds": 3607}},
            "/kubernetesReporting/tokenExpirationSeconds'",
        ),
    ],
)
def test_schema_rejects_invalid_values(values: dict[str, Any], complaint: str, tmp_path: Path) -> None:
    result = template(values, tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert SCHEMA_ERROR in result.stderr and complaint in result.stderr, result.stderr


# --- chart = kustomize -------------------------------------------------------------------------------


def test_files_are_copies_of_what_they_mirror() -> None:
    """helm reads nothing outside the chart: these copies must stay equal to their originals."""
    assert (FILES / "alerts.yaml").read_text() == (DEPLOY / "prometheus" / "alerts.yaml").read_text()
    assert (FILES / "config.toml").read_text() == (DEPLOY / "kubernetes" / "config.toml").read_text()
    assert (FILES / "admissionpolicy.yaml").read_text() == (REPORTING / "admissionpolicy.yaml").read_text()
    base, reporting = (FILES / "config.toml").read_text(), (REPORTING / "config.toml").read_text()
    assert base + (FILES / "kubernetes-sink.toml").read_text() == reporting


def test_default_daemonset_is_the_kustomize_base_s(
    rendered: dict[str, list[dict[str, Any]]], kustomized: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    base_ds, chart_ds = the(kustomized["base"], "DaemonSet"), the(rendered["defaults"], "DaemonSet")
    base_pod, chart_pod = base_ds["spec"]["template"]["spec"], copy.deepcopy(pod(rendered["defaults"]))
    # The container whole: image, args, env (NODE_NAME, POD_IP), envFrom, ports, probes, resources,
    # securityContext, mounts.
    assert chart_pod["containers"] == base_pod["containers"]
    # The one documented difference: the chart keeps off control-plane nodes unless told otherwise.
    assert chart_pod.pop("affinity") == CONTROL_PLANE_EXCLUSION
    assert "affinity" not in base_pod
    # Everything else about the pod: volumes, tolerations, nodeSelector, securityContext, automount,
    # priority, grace period, service account.
    assert chart_pod == base_pod
    assert pod(render({"controlPlaneNodes": True}, tmp_path)) == base_pod
    assert chart_ds["spec"]["updateStrategy"] == base_ds["spec"]["updateStrategy"]
    chart, base = rendered["defaults"], kustomized["base"]
    assert the(chart, "ServiceAccount")["automountServiceAccountToken"] is False
    assert the(chart, "ResourceQuota")["spec"] == the(base, "ResourceQuota")["spec"]
    assert the(rendered["defaults"], "ConfigMap")["data"] == the(kustomized["base"], "ConfigMap")["data"]
    chart_np, base_np = (
        the(rendered["defaults"], "NetworkPolicy")["spec"],
        the(kustomized["base"], "NetworkPolicy")["spec"],
    )
    assert chart_np["ingress"] == base_np["ingress"] and chart_np["policyTypes"] == base_np["policyTypes"]
    _selects_the_agent(chart_np["podSelector"], rendered["defaults"])


def test_reporting_is_the_kustomize_reporting_overlay_s(
    rendered: dict[str, list[dict[str, Any]]], kustomized: dict[str, list[dict[str, Any]]]
) -> None:
    chart, overlay = rendered["reporting"], kustomized["reporting"]
    assert the(chart, "ClusterRole")["rules"] == the(overlay, "ClusterRole")["rules"]
    assert the(chart, "ClusterRoleBinding")["subjects"] == the(overlay, "ClusterRoleBinding")["subjects"]
    assert (
        the(chart, "ClusterRoleBinding")["roleRef"]["name"] == the(chart, "ClusterRole")["metadata"]["name"]
    )
    assert (
        the(chart, "ValidatingAdmissionPolicy")["spec"] == the(overlay, "ValidatingAdmissionPolicy")["spec"]
    )
    assert (
        the(chart, "ValidatingAdmissionPolicyBinding")["spec"]
        == the(overlay, "ValidatingAdmissionPolicyBinding")["spec"]
    )
    # The pod: the overlay's, token volume and mount included (less the default control-plane exclusion).
    chart_pod = copy.deepcopy(pod(chart))
    chart_pod.pop("affinity")
    assert chart_pod == the(overlay, "DaemonSet")["spec"]["template"]["spec"]
    assert the(chart, "ConfigMap")["data"] == the(overlay, "ConfigMap")["data"]
    assert the(chart, "ConfigMap")["data"]["config.toml"] == (REPORTING / "config.toml").read_text()


def test_reporting_names_this_release_s_service_account(tmp_path: Path) -> None:
    """Another namespace and release: the policy's user and the binding's subject follow, so the policy
    keeps applying to the agent (a stale user would leave its node-status writes unguarded)."""
    objs = render(VALUES_SETS["reporting"], tmp_path, release="gpu", namespace="node-agents")
    account = the(objs, "ServiceAccount")["metadata"]
    assert account == {**account, "name": "gpu-pod-resources-watcher", "namespace": "node-agents"}
    assert pod(objs)["serviceAccountName"] == account["name"]
    user = f"system:serviceaccount:node-agents:{account['name']}"
    (condition,) = the(objs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    assert the(objs, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": "node-agents"}
    ]
    policy = the(objs, "ValidatingAdmissionPolicy")["metadata"]["name"]
    assert the(objs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy
    role = the(objs, "ClusterRole")["metadata"]["name"]
    assert the(objs, "ClusterRoleBinding")["roleRef"]["name"] == role
    # Cluster-scoped names carry the release, so two releases do not fight over one object.
    assert role.startswith("gpu-") and policy.startswith("gpu-")


# --- values that change the pod -----------------------------------------------------------------------


def test_custom_placement(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    spec = pod(rendered["placement"])
    assert spec["nodeSelector"] == VALUES_SETS["placement"]["nodeSelector"]
    assert spec["tolerations"] == VALUES_SETS["placement"]["tolerations"]
    assert "affinity" not in spec  # controlPlaneNodes: true
    # An affinity of one's own: a nodeAffinity replaces the exclusion, anything else is added to it.
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                ]
            }
        }
    }
    assert pod(render({"affinity": own}, tmp_path))["affinity"] == own
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    assert pod(render({"affinity": anti}, tmp_path))["affinity"] == {**anti, **CONTROL_PLANE_EXCLUSION}


def test_existing_secret_and_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (container,) = pod(rendered["existing-secret"])["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "gpu-alerts", "optional": False}}]
    assert container["image"] == "registry.example.invalid/pod-resources-watcher:0.1.0-rc1"
    assert not [o for o in rendered["existing-secret"] if o["kind"] == "Secret"], (
        "the chart creates no Secret"
    )


def test_host_paths_move_only_the_host_side(tmp_path: Path) -> None:
    root = "/var/lib/k0s/kubelet"
    objs = render(
        {
            "hostPaths": {
                "podResources": f"{root}/pod-resources",
                "devicePlugins": f"{root}/device-plugins",
                "pluginsRegistry": f"{root}/plugins_registry",
                "state": "/var/lib/pod-resources-watcher",
            }
        },
        tmp_path,
    )
    volumes = {v["name"]: v for v in pod(objs)["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {"path": f"{root}/pod-resources", "type": "Directory"}
    assert volumes["device-plugins"]["hostPath"] == {"path": f"{root}/device-plugins", "type": "Directory"}
    assert volumes["plugins-registry"]["hostPath"] == {
        "path": f"{root}/plugins_registry",
        "type": "Directory",
    }
    mounts = {m["name"]: m["mountPath"] for m in pod(objs)["containers"][0]["volumeMounts"]}
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"  # the config's path, unchanged
    # The agent reads the drivers' registrations under its kubelet root, whatever the host's is.
    assert mounts["plugins-registry"] == "/var/lib/kubelet/plugins_registry"


def test_a_config_change_rolls_the_pods(tmp_path: Path) -> None:
    def checksum(values: dict[str, Any]) -> str:
        ds = the(render(values, tmp_path), "DaemonSet")
        value: str = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    default = checksum({})
    assert checksum({}) == default
    assert checksum({"config": "state_dir = '/var/lib/pod-resources-watcher'\n"}) != default
    assert checksum(VALUES_SETS["reporting"]) != default
