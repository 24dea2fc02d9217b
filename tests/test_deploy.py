"""deploy/: what a platform team applies to a thousand nodes, checked offline.

- Every manifest parses (duplicate keys rejected) and validates against the Kubernetes JSON schemas
  bundled in `kubernetes-validate` (strict: unknown fields fail), newest bundled version. The PodMonitor
  and the PrometheusRule are CRDs the package has no schema for: their required fields are checked by
  hand, and the PrometheusRule carries exactly the groups of deploy/prometheus/alerts.yaml.
- The kustomizations build. Two builders: real kustomize (`kubectl kustomize`, kustomize v5, where
  kubectl is installed; the machine image has it), and `build()` below, a small builder for the subset
  of kustomize these files use, which runs everywhere, fails on any field it does not implement and on
  any referenced file that is missing. Where both run they must produce the same objects.
- The DaemonSet mounts the socket's DIRECTORY (never a `.sock` path), device-plugins and
  plugins_registry read-only, `NODE_NAME` and `POD_IP` from the downward API, probes on /healthz
  and /readyz, the tight securityContext; the agent listens on the pod IP, and a NetworkPolicy
  admits only the monitoring namespace to that port.
- The config shipped in the ConfigMap passes `check-config`: as shipped without any secret (the Secret
  is optional), and with its secret-using sinks uncommented and the example Secret's variables set.
- The systemd unit is hardened; the Dockerfile is multi-stage on a pinned slim base.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils

from testkit.manifests import (
    BASE,
    DEPLOY,
    MONITORING,
    OVERLAYS,
    REPORTING,
    SCHEMA_VERSION,
    SELINUX,
    KustomizeError,
    apply_patch,
    build,
    env_file,
    kinds,
    load_yaml,
    load_yaml_docs,
    object_key,
    the,
)
from testkit.tools import ON_CI, find, missing_message, tool
from watcher.cli import main
from watcher.ops.http import BACKLOG, FD_OWN
from watcher.settings import HttpSettings
from watcher.sinks import registry
from watcher.sinks.http import HTTP_SINK_CONNECTIONS

ROOT = Path(__file__).resolve().parent.parent
UNIT = DEPLOY / "systemd" / "pod-resources-watcher.service"
DOCKERFILE = DEPLOY / "Dockerfile"

NAMESPACE = "pod-resources-watcher"
APP_LABEL = {"app.kubernetes.io/name": "pod-resources-watcher"}
BASE_KINDS = [
    "ConfigMap",
    "DaemonSet",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "Secret",
    "ServiceAccount",
]
MONITORING_KINDS = sorted([*BASE_KINDS, "PodMonitor", "PrometheusRule", "Service"])
REPORTING_KINDS = sorted(
    [
        *BASE_KINDS,
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
)
CONFIG_MAP = "pod-resources-watcher-config"
SECRET = "pod-resources-watcher-secrets"
SOCKET_DIR = "/var/lib/kubelet/pod-resources"
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"
STATE_DIR = "/var/lib/pod-resources-watcher"
CONFIG_DIR = "/etc/pod-resources-watcher"
HTTP_PORT = 9108
# Variables the config reads that the DaemonSet sets from the downward API, not from the Secret.
DOWNWARD_API = {"POD_IP": "status.podIP"}
MONITORING_NAMESPACE = "monitoring"
# Kinds kubernetes-validate has no schema for; each has a hand-written check below.
CRDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


# --- real kustomize -------------------------------------------------------------------------------

KUBECTL = find("kubectl")
# Off CI a missing kubectl skips (build() still runs); under CI it fails in kubectl_kustomize.
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None and not ON_CI, reason=missing_message("kubectl") + "; build() still runs"
)


def kubectl_kustomize(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return load_yaml_docs(result.stdout)


def without_name_hashes(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kustomize appends `-<10 chars>` to generated names and rewrites references to them; undo that."""
    hashed = {}
    for obj in objs:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("ConfigMap", "Secret") and re.fullmatch(r".+-[a-z0-9]{10}", name):
            hashed[name] = name[:-11]

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return hashed.get(node, node) if isinstance(node, str) else node

    return [walk(o) for o in objs]


# --- builds ---------------------------------------------------------------------------------------

VARIANTS = {"base": BASE, **OVERLAYS}


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {name: build(path) for name, path in VARIANTS.items()}


@pytest.fixture(scope="module")
def daemonset(built: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return the(built["base"], "DaemonSet")


@pytest.fixture(scope="module")
def container(daemonset: dict[str, Any]) -> dict[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["watcher"]
    return containers[0]


def privileged_variant() -> list[dict[str, Any]]:
    """The base with the selinux component's alternative patch (privileged.yaml) instead of spc_t."""
    objs = build(BASE)
    apply_patch(
        SELINUX,
        {"path": "privileged.yaml", "target": {"kind": "DaemonSet", "name": "pod-resources-watcher"}},
        objs,
    )
    return objs


def test_every_yaml_file_parses_without_duplicate_keys() -> None:
    # A Helm chart's templates are Go templates, not YAML: tests/test_helm.py parses what they render.
    templates = set(DEPLOY.glob("helm/*/templates/*"))
    files = sorted(set(DEPLOY.rglob("*.yaml")) - templates)
    assert len(files) >= 12
    for path in files:
        assert load_yaml_docs(path.read_text()), f"{path} is empty"


def test_base_builds_to_exactly_the_expected_objects(built: dict[str, list[dict[str, Any]]]) -> None:
    objs = built["base"]
    assert kinds(objs) == BASE_KINDS
    assert the(objs, "Namespace")["metadata"]["name"] == NAMESPACE
    for obj in objs:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE, object_key(obj)
    config_map = the(objs, "ConfigMap")
    assert config_map["metadata"]["name"] == CONFIG_MAP
    assert list(config_map["data"]) == ["config.toml"]
    assert the(objs, "Secret")["metadata"]["name"] == SECRET
    assert the(objs, "ServiceAccount")["automountServiceAccountToken"] is False


def test_overlays_add_their_component(built: dict[str, list[dict[str, Any]]]) -> None:
    assert kinds(built["selinux"]) == BASE_KINDS
    pod = the(built["selinux"], "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    # Only the label changes: the container stays unprivileged.
    assert pod["containers"][0]["securityContext"]["privileged"] is False
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False

    assert kinds(built["monitoring"]) == MONITORING_KINDS
    for kind in ("Service", "PodMonitor", "PrometheusRule"):
        assert the(built["monitoring"], kind)["metadata"]["namespace"] == NAMESPACE


def test_privileged_alternative_is_a_valid_privileged_container() -> None:
    sc = the(privileged_variant(), "DaemonSet")["spec"]["template"]["spec"]["containers"][0][
        "securityContext"
    ]
    assert sc["privileged"] is True
    # The API server rejects privileged with allowPrivilegeEscalation false.
    assert sc["allowPrivilegeEscalation"] is True


def test_builder_rejects_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: x-\n"
    )
    with pytest.raises(KustomizeError, match="namePrefix"):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [missing.yaml]\n"
    )
    with pytest.raises(KustomizeError, match="does not exist"):
        build(tmp_path)
    # A generator that merges into nothing is a mistake (kustomize refuses it too).
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "configMapGenerator: [{name: x, behavior: merge, literals: [a=b]}]\n"
    )
    with pytest.raises(KustomizeError, match="finds nothing to merge"):
        build(tmp_path)
    if KUBECTL is not None or ON_CI:
        result = subprocess.run(
            [tool("kubectl"), "kustomize", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode != 0


def test_every_file_in_the_kustomize_tree_is_used() -> None:
    """A file nobody references is a file that looks deployed but is not."""
    referenced = {BASE / "kustomization.yaml", SELINUX / "privileged.yaml"}  # the documented alternative
    for directory in (BASE, SELINUX, MONITORING, REPORTING):
        k = load_yaml(directory / "kustomization.yaml")
        referenced.add(directory / "kustomization.yaml")
        for ref in k.get("resources", []):
            referenced.add((directory / ref).resolve())
        for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
            for ref in gen.get("files", []) + gen.get("envs", []):
                referenced.add((directory / ref.rpartition("=")[2]).resolve())
        for patch in k.get("patches", []):
            if "path" in patch:
                referenced.add((directory / patch["path"]).resolve())
    present = {p.resolve() for p in BASE.rglob("*") if p.is_file()}
    assert present - referenced == set()


@needs_kubectl
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_real_kustomize_builds_the_same_objects(variant: str, built: dict[str, list[dict[str, Any]]]) -> None:
    real = without_name_hashes(kubectl_kustomize(VARIANTS[variant]))
    ours = built[variant]
    assert sorted(map(object_key, real)) == sorted(map(object_key, ours))
    by_key = {object_key(o): o for o in ours}
    for obj in real:
        assert obj == by_key[object_key(obj)], object_key(obj)


@needs_kubectl
def test_real_kustomize_hashes_generated_names_and_rewrites_references() -> None:
    objs = kubectl_kustomize(BASE)
    config_map, secret = the(objs, "ConfigMap")["metadata"]["name"], the(objs, "Secret")["metadata"]["name"]
    assert re.fullmatch(CONFIG_MAP + r"-[a-z0-9]{10}", config_map)
    assert re.fullmatch(SECRET + r"-[a-z0-9]{10}", secret)
    pod = the(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": config_map}} in pod["volumes"]
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": secret, "optional": True}}]


# --- schemas --------------------------------------------------------------------------------------


def _validate_all(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(
                f"{object_key(obj)} invalid against Kubernetes {SCHEMA_VERSION}: {where}: {err.message}"
            )


def test_schema_version_is_recent() -> None:
    assert tuple(int(p) for p in SCHEMA_VERSION.split(".")[:2]) >= (1, 30)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_built_objects_validate_against_kubernetes_schemas(
    variant: str, built: dict[str, list[dict[str, Any]]]
) -> None:
    _validate_all(built[variant])


def test_privileged_variant_validates() -> None:
    _validate_all(privileged_variant())


@needs_kubectl
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_real_kustomize_output_validates(variant: str) -> None:
    _validate_all(kubectl_kustomize(VARIANTS[variant]))


def test_the_validator_is_strict(daemonset: dict[str, Any]) -> None:
    """Guards the guard: a misspelt field must fail, not pass as an unknown extra."""
    bad = copy.deepcopy(daemonset)
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readonly"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readonly"):
        kubernetes_validate.validate(bad, SCHEMA_VERSION, strict=True)


def test_podmonitor_required_fields_by_hand(built: dict[str, list[dict[str, Any]]]) -> None:
    """kubernetes-validate bundles no CRD schemas; these are the fields the Prometheus Operator needs."""
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(the(built["monitoring"], "PodMonitor"), SCHEMA_VERSION, strict=True)
    pm = the(built["monitoring"], "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(pm) == {"apiVersion", "kind", "metadata", "spec"}
    assert pm["metadata"]["name"] and pm["metadata"]["namespace"] == NAMESPACE
    assert set(pm["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
    assert pm["spec"]["selector"] == {"matchLabels": APP_LABEL}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings", "scheme"}
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    for duration in (endpoint["interval"], endpoint["scrapeTimeout"]):
        assert re.fullmatch(r"\d+[smh]", duration)
    for relabel in endpoint["relabelings"]:
        assert set(relabel) <= {"sourceLabels", "targetLabel", "action", "regex", "replacement"}
        assert all(label.startswith("__meta_kubernetes_pod_") for label in relabel.get("sourceLabels", []))
    # The alerts find the agents by one job name, whatever the PodMonitor is called.
    assert {"targetLabel": "job", "replacement": "pod-resources-watcher", "action": "replace"} in endpoint[
        "relabelings"
    ]

    service = the(built["monitoring"], "Service")
    assert service["spec"]["selector"] == APP_LABEL
    assert service["spec"]["ports"] == [
        {"name": "http-metrics", "port": HTTP_PORT, "targetPort": "http-metrics", "protocol": "TCP"}
    ]


def test_prometheusrule_carries_the_alerts_file_by_hand(built: dict[str, list[dict[str, Any]]]) -> None:
    """A CRD like the PodMonitor: the fields the Prometheus Operator needs, checked by hand, and the
    same groups as deploy/prometheus/alerts.yaml (promtool checks and unit-tests that file,
    tests/test_alerts.py), so the two cannot drift."""
    rule = the(built["monitoring"], "PrometheusRule")
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(rule, SCHEMA_VERSION, strict=True)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["metadata"]["name"] and rule["metadata"]["namespace"] == NAMESPACE
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == load_yaml(DEPLOY / "prometheus" / "alerts.yaml")["groups"]
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


# --- the DaemonSet --------------------------------------------------------------------------------


def _volume(daemonset: dict[str, Any], name: str) -> dict[str, Any]:
    (volume,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return volume


def _mount(container: dict[str, Any], name: str) -> dict[str, Any]:
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == name]
    return mount


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def test_mounts_the_socket_directory_writable_never_the_socket(
    daemonset: dict[str, Any], container: dict[str, Any]
) -> None:
    volume = _volume(daemonset, "pod-resources")
    assert volume["hostPath"] == {"path": SOCKET_DIR, "type": "Directory"}
    mount = _mount(container, "pod-resources")
    assert mount["mountPath"] == SOCKET_DIR
    assert mount.get("readOnly", False) is False
    # No file path ending in .sock anywhere: not in a hostPath, not in a mount, not in a subPath.
    for volume in daemonset["spec"]["template"]["spec"]["volumes"]:
        if "hostPath" in volume:
            assert not volume["hostPath"]["path"].endswith(".sock")
            assert volume["hostPath"].get("type") in ("Directory", "DirectoryOrCreate"), volume
    for mount in container["volumeMounts"]:
        assert not mount["mountPath"].endswith(".sock")
        assert "subPath" not in mount and "subPathExpr" not in mount, "a subPath pins one file"
    assert not [s for s in _strings(daemonset) if s.endswith(".sock")]


def test_kubelet_directories_read_only_and_state_directory(
    daemonset: dict[str, Any], container: dict[str, Any]
) -> None:
    assert _volume(daemonset, "device-plugins")["hostPath"] == {"path": DEVICE_PLUGINS, "type": "Directory"}
    assert _mount(container, "device-plugins") == {
        "name": "device-plugins",
        "mountPath": DEVICE_PLUGINS,
        "readOnly": True,
    }
    # The DRA drivers' registrations (a driver restart is a reset, not a heal): only listed.
    assert _volume(daemonset, "plugins-registry")["hostPath"] == {
        "path": PLUGINS_REGISTRY,
        "type": "Directory",
    }
    assert _mount(container, "plugins-registry") == {
        "name": "plugins-registry",
        "mountPath": PLUGINS_REGISTRY,
        "readOnly": True,
    }
    assert _volume(daemonset, "state")["hostPath"] == {"path": STATE_DIR, "type": "DirectoryOrCreate"}
    assert _mount(container, "state")["mountPath"] == STATE_DIR
    assert _mount(container, "state").get("readOnly", False) is False
    assert _volume(daemonset, "config")["configMap"]["name"] == CONFIG_MAP
    assert _mount(container, "config") == {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}
    # Every mount has its volume and the other way round.
    volumes = {v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {m["name"] for m in container["volumeMounts"]}


def test_node_name_and_secrets_in_the_environment(container: dict[str, Any]) -> None:
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container[
        "env"
    ]
    assert container["envFrom"] == [{"secretRef": {"name": SECRET, "optional": True}}]


def test_command_probes_and_port(container: dict[str, Any]) -> None:
    assert container["args"] == ["run", "--config", f"{CONFIG_DIR}/config.toml"]
    assert "command" not in container, "the image's ENTRYPOINT is the console command"
    assert container["ports"] == [{"name": "http-metrics", "containerPort": HTTP_PORT, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    if "startupProbe" in container:
        assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}


def test_resources_are_set_and_documented(container: dict[str, Any]) -> None:
    resources = container["resources"]
    assert set(resources) == {"requests", "limits"}
    for section in resources.values():
        assert set(section) == {"cpu", "memory"}
    text = (BASE / "daemonset.yaml").read_text()
    # The measurement behind the numbers, with the command that produced it.
    assert "fake-kubelet --root" in text and "VmRSS" in text and "cputime" in text
    assert "MEASURED_" not in text


def test_security_context_is_as_tight_as_the_socket_allows(
    daemonset: dict[str, Any], container: dict[str, Any]
) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    sc = container["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False  # the socket is root-owned
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is False
    assert "seLinuxOptions" not in pod["securityContext"], "spc_t only in the selinux component"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert pod.get(key, False) is False
    assert pod["automountServiceAccountToken"] is False


def test_scheduling_and_rollout(daemonset: dict[str, Any]) -> None:
    spec = daemonset["spec"]
    pod = spec["template"]["spec"]
    assert {"operator": "Exists"} in pod["tolerations"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    rolling = spec["updateStrategy"]["rollingUpdate"]
    assert re.fullmatch(r"\d+%", str(rolling["maxUnavailable"])) and rolling["maxUnavailable"] != "0%"
    assert rolling.get("maxSurge", 0) in (0, "0%"), "two agents on one node would share the outbox"
    # A little above the agent's shutdown deadline.
    assert 10 <= pod["terminationGracePeriodSeconds"] <= 30
    if "priorityClassName" in pod:
        assert pod["priorityClassName"] == "system-node-critical"


def test_namespace_admits_hostpath_pods(built: dict[str, list[dict[str, Any]]]) -> None:
    labels = the(built["base"], "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    quota = the(built["base"], "ResourceQuota")
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert scope["scopeName"] == "PriorityClass" and scope["values"] == ["system-node-critical"]


# --- the config in the ConfigMap --------------------------------------------------------------------

SECRET_BLOCK = re.compile(
    r"^# --- BEGIN sinks that need the Secret -+\n(?P<body>.*?)^# --- END sinks that need the Secret -+$",
    re.S | re.M,
)


def _secret_env() -> dict[str, str]:
    return env_file(BASE / "secrets.env")


def _shipped_config(built: dict[str, list[dict[str, Any]]]) -> str:
    text: str = the(built["base"], "ConfigMap")["data"]["config.toml"]
    return text


def _with_secret_sinks(config: str) -> str:
    """The config with its commented secret-using sinks turned on, as the README tells a user to."""
    match = SECRET_BLOCK.search(config)
    assert match, "config.toml has no BEGIN/END block of secret-using sinks"
    body = "\n".join(
        line[2:] if re.match(r"# (\[|\w+ = )", line) else line for line in match["body"].splitlines()
    )
    enabled = config[: match.start()] + body + "\n" + config[match.end() :]
    assert {"slack", "pagerduty", "inventory"} <= set(tomllib.loads(enabled)["sinks"])
    return enabled


def test_shipped_config_passes_check_config_without_any_secret(
    built: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Secret is optional: the config as shipped must need none of its variables (only what
    the DaemonSet sets from the downward API)."""
    for name in _secret_env():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    monkeypatch.setenv("POD_IP", "10.244.3.17")
    path = tmp_path / "config.toml"
    path.write_text(_shipped_config(built))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    settings = json.loads(out.split("\n", 1)[1])
    assert settings["http"]["listen"] == f"10.244.3.17:{HTTP_PORT}"  # from POD_IP, the downward API
    assert settings["http"]["inventory"] is False
    assert settings["node"] == "gpu-node-17"  # from NODE_NAME, i.e. the downward API
    assert settings["state_dir"] == STATE_DIR
    assert settings["kubelet"]["socket"] == f"{SOCKET_DIR}/kubelet.sock"
    assert settings["kubelet"]["root_dir"] == "/var/lib/kubelet"
    for sink in settings["sinks"]:
        if sink.get("path"):
            assert sink["path"].startswith(STATE_DIR + "/"), "only the state dir is writable"


def test_config_with_secret_sinks_passes_check_config_with_the_secrets_variables(
    built: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secrets = _secret_env()
    path = tmp_path / "config.toml"
    path.write_text(_with_secret_sinks(_shipped_config(built)))
    monkeypatch.setenv("POD_IP", "10.244.3.17")
    for name in secrets:
        monkeypatch.delenv(name, raising=False)
    assert main(["check-config", str(path)]) == 2  # an unset ${NAME}: one line, exit 2
    err = capsys.readouterr().err
    assert "is not set" in err and len(err.strip().splitlines()) == 1

    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    for value in secrets.values():
        assert value not in out, "check-config must not print secrets"
    sinks = json.loads(out.split("\n", 1)[1])["sinks"]
    assert {s["name"] for s in sinks} >= {"console", "audit", "slack", "pagerduty", "inventory"}


def test_secret_keys_and_config_references_agree(built: dict[str, list[dict[str, Any]]]) -> None:
    config = _shipped_config(built)
    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", config)) - set(DOWNWARD_API)
    assert referenced == set(_secret_env())
    # ...and the generated Secret carries exactly those keys, base64 of the placeholders.
    secret = the(built["base"], "Secret")
    assert set(secret["data"]) == referenced


def test_example_secret_holds_placeholders_only() -> None:
    for name, value in _secret_env().items():
        assert re.search(r"REPLACE|example\.invalid", value), f"{name} does not look like a placeholder"


def test_the_agent_listens_on_the_pod_ip_where_the_probes_reach_it(
    built: dict[str, list[dict[str, Any]]], container: dict[str, Any]
) -> None:
    """The default listen address is loopback, which neither the kubelet's probes nor Prometheus
    can reach: the shipped config listens on the pod IP, which the DaemonSet passes in POD_IP."""
    for name, field_path in DOWNWARD_API.items():
        assert {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}} in container["env"]
    listen = tomllib.loads(_shipped_config(built))["http"]["listen"]
    assert listen == f"${{POD_IP}}:{HTTP_PORT}"
    # The probes dial the pod IP (an httpGet without `host`) on the port the agent listens on.
    (port,) = [p for p in container["ports"] if p["name"] == "http-metrics"]
    assert port["containerPort"] == HTTP_PORT
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert "host" not in get and get.get("scheme", "HTTP") == "HTTP", probe
        assert get["port"] == "http-metrics", probe


@pytest.mark.parametrize(
    ("pod_ip", "listen"),
    [("10.244.3.17", "10.244.3.17:9108"), ("fd00:10:244:3::17", "[fd00:10:244:3::17]:9108")],
)
def test_the_shipped_listen_address_takes_either_family_and_needs_pod_ip(
    pod_ip: str,
    listen: str,
    built: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(_shipped_config(built))
    monkeypatch.delenv("POD_IP", raising=False)
    assert main(["check-config", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("http.listen: environment variable POD_IP is not set")
    monkeypatch.setenv("POD_IP", pod_ip)
    assert main(["check-config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["http"]["listen"] == listen


def test_network_policy_admits_only_the_monitoring_namespace_to_the_http_port(
    built: dict[str, list[dict[str, Any]]], daemonset: dict[str, Any]
) -> None:
    for variant, objs in built.items():
        assert the(objs, "NetworkPolicy")["metadata"]["namespace"] == NAMESPACE, variant
    policy = the(built["base"], "NetworkPolicy")
    spec = policy["spec"]
    # It selects the agent's pods...
    assert spec["podSelector"] == {"matchLabels": APP_LABEL}
    assert APP_LABEL.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    # ...restricts what comes in, not what goes out (the sinks)...
    assert spec["policyTypes"] == ["Ingress"]
    # ...and lets in the monitoring namespace only, on the agent's port only.
    (rule,) = spec["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": HTTP_PORT}]


def test_the_documented_way_to_admit_another_namespace_works(tmp_path: Path) -> None:
    """networkpolicy.yaml's comment shows an overlay patch; it must apply (here and in kustomize)."""
    text = (BASE / "networkpolicy.yaml").read_text()
    match = re.search(r"^#   patches:\n((?:#  .*\n)+)", text, re.M)
    assert match, "networkpolicy.yaml no longer shows how to change the namespace"
    patches = "patches:\n" + "".join(line[3:] + "\n" for line in match[1].splitlines())
    shutil.copytree(BASE, tmp_path / "base")
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [base]\n" + patches
    )
    builds = [build(tmp_path)] + ([kubectl_kustomize(tmp_path)] if KUBECTL is not None or ON_CI else [])
    for objs in builds:
        selector = the(objs, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]["namespaceSelector"]
        assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}


# --- the reporting component (the `kubernetes` sink) ------------------------------------------------

SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:pod-resources-watcher"
# (API group, resource, verb): everything the sink needs, and everything the ClusterRole may grant.
REPORTING_GRANTS = {
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("", "nodes/status", "get"),
    ("", "nodes/status", "patch"),
    ("", "pods", "get"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "devicetaintrules", "list"),
}


def test_reporting_overlay_adds_rbac_and_the_admission_policy(built: dict[str, list[dict[str, Any]]]) -> None:
    objs = built["kubernetes-reporting"]
    assert kinds(objs) == REPORTING_KINDS
    for kind in (
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ):
        assert "namespace" not in the(objs, kind)["metadata"], f"{kind} is cluster-scoped"
    # The base and the other variants: no RBAC, no policy, no token.
    for variant in ("base", "selinux", "monitoring"):
        assert not {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"} & set(
            kinds(built[variant])
        )
        pod = the(built[variant], "DaemonSet")["spec"]["template"]["spec"]
        assert not [v for v in pod["volumes"] if "projected" in v], variant
        assert not [s for s in _strings(pod) if s.startswith("/var/run/secrets")], variant


def test_reporting_rbac_grants_exactly_what_the_sink_needs(built: dict[str, list[dict[str, Any]]]) -> None:
    objs = built["kubernetes-reporting"]
    role = the(objs, "ClusterRole")
    grants = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames, no nonResourceURLs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    grants.add((group, resource, verb))
    assert grants == REPORTING_GRANTS
    assert not [g for g in grants if "*" in g], "no wildcards"
    # Bound to the agent's own ServiceAccount, the one the DaemonSet runs as.
    binding = the(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = the(objs, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    pod = the(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert (
        f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
        == AGENT_USER
    )


def test_reporting_admission_policy_guards_the_agent_s_node_status_writes(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    objs = built["kubernetes-reporting"]
    policy = the(objs, "ValidatingAdmissionPolicy")
    binding = the(objs, "ValidatingAdmissionPolicyBinding")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    # It applies to the agent's user exactly (the ServiceAccount the RBAC binds)...
    (condition,) = spec["matchConditions"]
    assert re.fullmatch(
        rf"request\.userInfo\.username\s*==\s*'{re.escape(AGENT_USER)}'", condition["expression"]
    )
    # ...on every write to a Node it could be granted, nodes/status UPDATE (what PATCH is) included.
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["*"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    # Every write the RBAC allows on nodes is one the policy sees.
    rbac_node_writes = {r for _, r, verb in REPORTING_GRANTS if r.startswith("nodes") and verb != "get"}
    assert rbac_node_writes <= set(rule["resources"])
    # A denial says why: every validation has a message, and the ones that can name what changed do.
    for validation in spec["validations"]:
        assert validation.get("message") and "\n" not in validation["message"]
        assert validation.get("reason") == "Forbidden"


@pytest.mark.parametrize("version", [v for v in sorted(set(kv_utils.all_versions())) if v != SCHEMA_VERSION])
def test_reporting_objects_validate_from_kubernetes_1_30_on(
    version: str, built: dict[str, list[dict[str, Any]]]
) -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA in 1.30: every bundled schema
    from 1.30 on takes the objects (the newest is checked with the rest above), older ones know no such
    kind, which is why deploy/README.md says 1.30."""
    objs = [
        o
        for o in built["kubernetes-reporting"]
        if o["kind"]
        in (
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "DaemonSet",
        )
    ]
    if tuple(int(p) for p in version.split(".")[:2]) < (1, 30):
        with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
            kubernetes_validate.validate(the(objs, "ValidatingAdmissionPolicy"), version, strict=True)
        return
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{object_key(obj)} invalid against Kubernetes {version}: {err.message}")


def test_reporting_mounts_a_short_lived_pod_bound_token(built: dict[str, list[dict[str, Any]]]) -> None:
    objs = built["kubernetes-reporting"]
    pod = the(objs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SERVICE_ACCOUNT_PATH]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert token["path"] == "token"
    # At least the API's minimum (10 min), at most an hour; never 3607 s, the automounted token's
    # value, which the API server extends to a year.
    assert 600 <= token["expirationSeconds"] <= 3600
    assert "audience" not in token, "the API server's own audience, or it refuses the token"
    (ca,) = [s["configMap"] for s in sources if "configMap" in s]
    assert ca == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert volume["projected"]["defaultMode"] == 0o400
    # Automounting stays off: this volume is the only token, and the base's promise holds for the base.
    assert pod["automountServiceAccountToken"] is False
    assert the(objs, "ServiceAccount")["automountServiceAccountToken"] is False
    # Everything else about the pod is the base's.
    base = copy.deepcopy(the(built["base"], "DaemonSet")["spec"]["template"]["spec"])
    mine = copy.deepcopy(pod)
    mine["volumes"].remove(volume)
    mine["containers"][0]["volumeMounts"].remove(mount)
    assert mine == base


def _reporting_config(built: dict[str, list[dict[str, Any]]]) -> str:
    text: str = the(built["kubernetes-reporting"], "ConfigMap")["data"]["config.toml"]
    return text


def test_reporting_config_is_the_base_config_plus_the_kubernetes_sink(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    """The component replaces config.toml in the ConfigMap with its own copy: that copy must be the base's,
    word for word, with one table added, or the two drift apart."""
    base, reporting = _shipped_config(built), _reporting_config(built)
    assert reporting == (REPORTING / "config.toml").read_text()
    assert reporting.startswith(base), "reporting/config.toml must begin with the base's config.toml verbatim"
    added = tomllib.loads(reporting[len(base) :])
    assert added == {"sinks": {"kubernetes": {"type": "kubernetes"}}}
    # Only config.toml changes; the ConfigMap keeps its name and namespace (merged, not a second one).
    config_map = the(built["kubernetes-reporting"], "ConfigMap")
    assert list(config_map["data"]) == ["config.toml"]
    assert object_key(config_map) == ("ConfigMap", NAMESPACE, CONFIG_MAP)


def test_reporting_config_passes_check_config(
    built: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if registry.find("kubernetes") is None:
        pytest.skip("the `kubernetes` sink type is not in this tree yet; the config names it")
    for name in _secret_env():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    monkeypatch.setenv("POD_IP", "10.244.3.17")
    path = tmp_path / "config.toml"
    path.write_text(_reporting_config(built))
    assert main(["check-config", str(path)]) == 0
    sinks = json.loads(capsys.readouterr().out.split("\n", 1)[1])["sinks"]
    assert {s["name"]: s["type"] for s in sinks} == {
        "console": "stdout",
        "audit": "file",
        "kubernetes": "kubernetes",
    }


# --- systemd --------------------------------------------------------------------------------------


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (keys may repeat, e.g. Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line!r}"
        current.setdefault(key, []).append(value)
    return sections


def test_systemd_unit_is_hardened() -> None:
    unit = _unit(UNIT)
    service = unit["Service"]

    def one(key: str) -> str:
        (value,) = service[key]
        return value

    assert one("ProtectSystem") == "strict"
    assert one("ProtectHome") in ("true", "yes")
    assert one("PrivateTmp") in ("true", "yes")
    assert one("NoNewPrivileges") in ("true", "yes")
    assert one("StateDirectory") == "pod-resources-watcher"
    writable = {p.lstrip("-") for value in service["ReadWritePaths"] for p in value.split()}
    assert writable == {STATE_DIR, SOCKET_DIR}
    assert one("Restart") == "on-failure"
    assert re.fullmatch(r"\d+s?", one("RestartSec"))
    assert "NODE_NAME=%H" in service["Environment"]
    assert one("ExecStart").split() == [
        "/opt/pod-resources-watcher/bin/pod-resources-watcher",
        "run",
        "--config",
        f"{CONFIG_DIR}/config.toml",
    ]
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    # systemd holds reloads until the agent says READY=1 (tests/test_signals.py checks it does).
    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("CapabilityBoundingSet") == ""
    assert one("UMask") == "0077"  # what it creates is private even before the agent's own modes
    assert one("SystemCallFilter") == "@system-service"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # The fd budget: the HTTP cap plus a flood being accepted plus the agent's own, and eight
    # HTTP sinks' pools (the README's budget).
    budget = HttpSettings().max_connections + 3 * BACKLOG + FD_OWN + 8 * HTTP_SINK_CONNECTIONS
    assert budget < int(one("LimitNOFILE")) <= 4 * budget
    # The DaemonSet's config, used here too, listens on ${POD_IP}: loopback unless overridden.
    assert "POD_IP=127.0.0.1" in service["Environment"]


def test_systemd_analyze_verify_finds_nothing_but_the_missing_binary() -> None:
    result = subprocess.run(
        [tool("systemd-analyze"), "verify", "--man=no", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if UNIT.name in line]
    # The binary is not installed here; anything else (unknown key, bad value) is a mistake.
    problems = [line for line in lines if "is not executable" not in line]
    assert problems == []


# --- Dockerfile -----------------------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def _stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction, args in instructions:
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, args))
    return stages


def test_dockerfile_multi_stage_on_a_pinned_slim_base() -> None:
    instructions = _instructions(DOCKERFILE)
    args = dict(a.partition("=")[::2] for i, a in instructions if i == "ARG" and "=" in a)
    stages = _stages(instructions)
    assert len(stages) >= 2
    for stage in stages:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
        # An exact Python 3.11 patch release of a slim Debian image: never `latest`, `3`, `3.11`.
        assert re.fullmatch(r"python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", image), image
    assert stages[0][0][1].split()[-2:] == ["AS", "builder"]
    builder = " ".join(a for i, a in stages[0] if i == "RUN")
    assert "pip wheel" in builder and "venv" in builder


def test_dockerfile_final_stage_has_the_venv_and_no_build_tools() -> None:
    final = _stages(_instructions(DOCKERFILE))[-1]
    text = "\n".join(f"{i} {a}" for i, a in final)
    for builder in ("gcc", "g++", "build-essential", "apt-get install", "make ", "clang", "pip wheel"):
        assert builder not in text, builder
    copies = [a for i, a in final if i == "COPY" and a.startswith("--from=")]
    assert copies == ["--from=builder /opt/pod-resources-watcher /opt/pod-resources-watcher"]
    entrypoint = json.loads(dict(final)["ENTRYPOINT"])  # exec form: JSON, no shell
    assert entrypoint == ["/opt/pod-resources-watcher/bin/pod-resources-watcher"]
    assert json.loads(dict(final)["CMD"]) == ["run", "--config", f"{CONFIG_DIR}/config.toml"]
    assert dict(final)["EXPOSE"] == str(HTTP_PORT)


def test_dockerfile_copies_only_what_exists_and_is_in_the_context() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "the context starts empty"
    for instruction, args in _instructions(DOCKERFILE):
        if instruction != "COPY" or args.startswith("--from="):
            continue
        *sources, _ = args.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") in allowed, f"{source} is excluded by Dockerfile.dockerignore"
