"""The Helm chart against hostile and malformed values (issue 26): a value changes its own field and
nothing else, the admission policy's match condition cannot be rewritten by a name, and
values.schema.json refuses what Kubernetes would refuse (or what would quietly weaken the pod).

The quoting is checked with the schema switched off (`--skip-schema-validation`), so each defence is
shown on its own: the templates alone keep a hostile string inside its field, and the schema alone
refuses it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from testkit.helm_chart import SCHEMA_ERROR, pod, render, template
from testkit.manifests import SCHEMA_VERSION, the
from watcher.files import SYSTEM_DIRS, SYSTEM_TREES

REPORTING = {"kubernetesReporting": {"enabled": True}}
# What an unquoted insertion let a values file add to the pod: the node's PIDs and a privileged,
# container, with a values file that passes `helm lint`.
BREAKOUT = (
    "\n      hostPID: true"
    "\n      initContainers: [{name: x, image: busybox, securityContext: {privileged: true}}]"
)


def _state_volume(spec: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in spec["volumes"] if v["name"] == "state"]
    return volume


def _set_priority(spec: dict[str, Any], value: str) -> None:
    spec["priorityClassName"] = value


def _set_state(spec: dict[str, Any], value: str) -> None:
    _state_volume(spec)["hostPath"]["path"] = value


def _set_secret(spec: dict[str, Any], value: str) -> None:
    spec["containers"][0]["envFrom"][0]["secretRef"]["name"] = value


def _set_tag(spec: dict[str, Any], value: str) -> None:
    spec["containers"][0]["image"] = f"pod-resources-watcher:{value}"


HOSTILE = {
    # system-*: the ResourceQuota for the class is rendered with it, as with the default.
    "priorityClassName": (
        {"priorityClassName": f"system-node-critical{BREAKOUT}"},
        f"system-node-critical{BREAKOUT}",
        _set_priority,
    ),
    "hostPaths.state": (
        {"hostPaths": {"state": f"/srv/x{BREAKOUT}"}},
        f"/srv/x{BREAKOUT}",
        _set_state,
    ),
    "secrets.existingSecret": (
        {"secrets": {"existingSecret": f"s\n          securityContext: {{privileged: true}}{BREAKOUT}"}},
        f"s\n          securityContext: {{privileged: true}}{BREAKOUT}",
        _set_secret,
    ),
    "image.tag": (
        {"image": {"tag": '1"\n          securityContext: {privileged: true}\n          x: "y'}},
        '1"\n          securityContext: {privileged: true}\n          x: "y',
        _set_tag,
    ),
}


@pytest.mark.parametrize("field", sorted(HOSTILE))
def test_a_hostile_string_changes_its_own_field_and_nothing_else(field: str, tmp_path: Path) -> None:
    values, value, apply = HOSTILE[field]
    default = render({}, tmp_path)
    hostile = render(values, tmp_path, skip_schema=True)
    assert sorted(o["kind"] for o in hostile) == sorted(o["kind"] for o in default)
    expected = copy.deepcopy(pod(default))
    apply(expected, value)
    # The whole pod spec: no hostPID, no init container, no securityContext of the value's making.
    assert pod(hostile) == expected
    # And the schema, on its own, refuses the value.
    refused = template(values, tmp_path)
    assert refused.returncode != 0 and SCHEMA_ERROR in refused.stderr, refused.stderr


def test_a_config_cannot_add_keys_to_its_config_map(tmp_path: Path) -> None:
    """A config whose first line is indented set the literal block's indentation; a later line with
    less ended the block and became data of its own."""
    config = "      # indented first line\n  log.level = 'debug'\nevil: 1\n"
    objs = render({"config": config}, tmp_path)
    assert the(objs, "ConfigMap")["data"] == {"config.toml": config}


@pytest.mark.parametrize(
    "namespace", ["x' || true || '", "ns' || request.userInfo.username != '", "Ns", "a\nb"]
)
def test_a_crafted_namespace_cannot_change_the_admission_policy(namespace: str, tmp_path: Path) -> None:
    """The namespace ends up in the policy's CEL: a quote in it made a condition that matched every
    user, so every node-status write in the cluster went through the agent's checks."""
    result = template(REPORTING, tmp_path, namespace=namespace)
    assert result.returncode != 0 and "is not a namespace name" in result.stderr, result.stdout[-2000:]


def test_a_crafted_name_cannot_change_the_admission_policy(tmp_path: Path) -> None:
    values = {**REPORTING, "fullnameOverride": "x' || true || 'y"}
    result = template(values, tmp_path, skip_schema=True)
    assert result.returncode != 0 and "is not a service account's user name" in result.stderr, result.stdout
    assert SCHEMA_ERROR in template(values, tmp_path).stderr


def test_the_match_condition_compares_the_user_and_nothing_else(tmp_path: Path) -> None:
    objs = render(REPORTING, tmp_path, release="gpu.a", namespace="node-agents")
    (condition,) = the(objs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    user = "system:serviceaccount:node-agents:gpu.a-pod-resources-watcher"
    assert condition == {"name": "the-agent", "expression": f"request.userInfo.username == '{user}'"}


# --- names Kubernetes refuses ---------------------------------------------------------------------

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_the_metrics_service_name_fits_with_the_longest_release_name(tmp_path: Path) -> None:
    release = "a" * 53  # helm's longest release name
    objs = render({"monitoring": {"service": True}}, tmp_path, release=release)
    name = the(objs, "Service")["metadata"]["name"]
    assert len(name) <= 63 and DNS_1035.match(name) and name.endswith("-metrics"), name
    assert the(objs, "DaemonSet")["metadata"]["name"] == f"{release}-pod-resources-watcher"[:63]
    result = template({"monitoring": {"service": True}}, tmp_path, release="1gpu")
    assert result.returncode != 0 and "is not a DNS-1035 label" in result.stderr


def test_an_image_can_be_pulled_by_digest(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    objs = render({"image": {"repository": "registry.example.invalid/prw", "digest": digest}}, tmp_path)
    assert pod(objs)["containers"][0]["image"] == f"registry.example.invalid/prw@{digest}"
    kubernetes_validate.validate(the(objs, "DaemonSet"), SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"fullnameOverride": "Agent"}, "/fullnameOverride'"),
        ({"fullnameOverride": "a" * 64}, "/fullnameOverride'"),
        ({"nameOverride": "pod_watcher"}, "/nameOverride'"),
        ({"image": {"digest": "sha256:abc"}}, "/image/digest'"),
        ({"image": {"repository": "Registry/Image"}}, "/image/repository'"),
        ({"resources": None}, "missing property 'resources'"),
        ({"resources": {"limits": None}}, "missing property 'limits'"),
        ({"resources": {"limits": {"memory": None}}}, "missing property 'memory'"),
        ({"tolerations": None}, "missing property 'tolerations'"),
        ({"podLabels": {"app.kubernetes.io/name": "other"}}, "invalid propertyName 'app.kubernetes.io/name'"),
        ({"podLabels": {"app.kubernetes.io/instance": "x"}}, "invalid propertyName"),
        ({"monitoring": {"labels": {"app.kubernetes.io/component": "x"}}}, "invalid propertyName"),
        ({"podLabels": {"tier": "a b"}}, "/podLabels/tier'"),
        ({"podAnnotations": {"checksum/config": "0"}}, "invalid propertyName 'checksum/config'"),
        ({"nodeSelector": {"bad key": "x"}}, "invalid propertyName 'bad key'"),
        ({"hostPaths": {"devicePlugins": "/var/lib/kubelet/../../etc"}}, "/hostPaths/devicePlugins'"),
        ({"hostPaths": {"podResources": "/var/lib/kubelet//pod-resources"}}, "/hostPaths/podResources'"),
        ({"hostPaths": {"state": "/srv/../var/lib"}}, "/hostPaths/state'"),
        ({"tolerations": [{"operator": "Equal"}]}, "/tolerations/0/operator': value must be 'Exists'"),
        ({"tolerations": [{"operator": "Exists", "value": "x"}]}, "/tolerations/0/value': value must be ''"),
        ({"tolerations": [{"key": "a", "tolerationSeconds": 5}]}, "missing property 'effect'"),
        ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, "/tolerations/0/effect'"),
        ({"tolerations": [{"keys": "a", "operator": "Exists"}]}, "additional properties 'keys' not allowed"),
        ({"networkPolicy": {"namespaces": ["Monitoring"]}}, "/networkPolicy/namespaces/0'"),
        ({"priorityClassName": "System Node Critical"}, "/priorityClassName'"),
        ({"secrets": {"existingSecret": "Gpu_Alerts"}}, "/secrets/existingSecret'"),
    ],
)
def test_the_schema_refuses_what_kubernetes_would(
    values: dict[str, Any], complaint: str, tmp_path: Path
) -> None:
    result = template(values, tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert SCHEMA_ERROR in result.stderr and complaint in result.stderr, result.stderr


def test_valid_tolerations_and_paths_still_pass(tmp_path: Path) -> None:
    tolerations = [
        {"operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "dedicated",
            "operator": "Equal",
            "value": "gpu",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },
    ]
    values = {"tolerations": tolerations, "hostPaths": {"state": "/var/lib/prw.d/state"}}
    spec = pod(render(values, tmp_path))
    assert spec["tolerations"] == tolerations
    assert _state_volume(spec)["hostPath"]["path"] == "/var/lib/prw.d/state"


def test_the_schema_refuses_the_system_directories_the_agent_refuses(tmp_path: Path) -> None:
    """The state directory is made 0700: the schema and the agent (watcher/files.py) refuse the
    same list, checked here entry by entry."""
    refused = sorted(SYSTEM_DIRS - {"/"}) + [f"{tree}/sub" for tree in SYSTEM_TREES] + list(SYSTEM_TREES)
    for path in [*refused, "/"]:
        result = template({"hostPaths": {"state": path}}, tmp_path)
        assert result.returncode != 0 and "/hostPaths/state'" in result.stderr, path
    for path in ["/var/lib/pod-resources-watcher", "/var/lib-x", "/srv/prw", "/etc/pod-resources-watcher"]:
        assert template({"hostPaths": {"state": path}}, tmp_path).returncode == 0, path
