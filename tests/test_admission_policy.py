"""The reporting component's ValidatingAdmissionPolicy (deploy/kubernetes/reporting/admissionpolicy.yaml),
its CEL run as the API server runs it (testkit/admission_policy.py): the agent's ServiceAccount may
update only its own Node's status, and there only its own conditions (type ending in
DevicesUnavailable, message starting with its mark); nobody else is affected."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.admission_policy import POLICY_FILE, Policy, PolicyError, admit, load, review
from watcher.sinks.kubernetes.condition_plan import OWNER_MARK

AGENT = "system:serviceaccount:pod-resources-watcher:pod-resources-watcher"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE = "gpu-node-17"
OWN = "NvidiaGpuDevicesUnavailable"
KUBELET_TYPES = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
DENIED = "ValidatingAdmissionPolicy 'pod-resources-watcher-node-status' with binding "


def condition(kind: str, status: str = "False", reason: str = "KubeletHasSufficientMemory") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": f"{kind} is {status}",
        "lastHeartbeatTime": "2026-12-01T03:00:00Z",
        "lastTransitionTime": "2026-11-30T09:00:00Z",
    }


def node(name: str = NODE, extra_conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Node as the API server stores it, with the kubelet's conditions and a full status."""
    conditions = [condition(t, "True" if t == "Ready" else "False") for t in KUBELET_TYPES]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "0b5c2a4e-8d6f-4b1e-9f3a-1c2d3e4f5a6b",
            "resourceVersion": "81723",
            "creationTimestamp": "2026-11-30T09:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
        },
        "spec": {"podCIDR": "10.244.3.0/24"},
        "status": {
            "capacity": {"cpu": "96", "memory": "792Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "780Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": conditions + (extra_conditions or []),
            "addresses": [
                {"type": "InternalIP", "address": "10.0.3.17"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.32.4", "machineID": "ab12", "architecture": "amd64"},
            "images": [{"names": ["registry.example.invalid/cuda:12.4"], "sizeBytes": 4200000000}],
        },
    }


def status_update(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    user: str = AGENT,
    node_name: str | None = NODE,
    name: str | None = None,
) -> dict[str, Any]:
    """A PATCH of nodes/status as admission sees it (an UPDATE), from a pod-bound token on `node_name`."""
    extra = {"authentication.kubernetes.io/pod-name": ["pod-resources-watcher-x7k2p"]}
    if node_name is not None:
        extra[NODE_NAME_EXTRA] = [node_name]
    return {
        "operation": "UPDATE",
        "resource": "nodes",
        "subResource": "status",
        "name": name or new["metadata"]["name"],
        "namespace": "",
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra},
        "object": new,
        "oldObject": old,
    }


def with_conditions(base: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(base)
    new["status"]["conditions"] = change(new["status"]["conditions"])
    return new


def own(kind: str = OWN, status: str = "True") -> dict[str, Any]:
    """One of the agent's conditions: its message carries the agent's mark."""
    c = condition(kind, status, reason="DevicesUnhealthy")
    return dict(c, message=OWNER_MARK + c["message"])


# --- what the agent does: allowed --------------------------------------------------------------------


def test_the_agent_sets_its_own_condition_on_its_own_node() -> None:
    old = node()
    assert admit(status_update(old, with_conditions(old, lambda c: [*c, own()]))) is None


def test_the_agent_changes_and_removes_its_own_conditions() -> None:
    old = node(extra_conditions=[own(), own("AmdGpuDevicesUnavailable")])
    flipped = with_conditions(old, lambda c: [x if x["type"] != OWN else own(status="False") for x in c])
    assert admit(status_update(old, flipped)) is None
    # The cleanup command: `$patch: delete` of each of the agent's conditions.
    cleaned = with_conditions(old, lambda c: [x for x in c if not x["type"].endswith("DevicesUnavailable")])
    assert admit(status_update(old, cleaned)) is None


def test_a_patch_that_changes_nothing_is_allowed() -> None:
    old = node(extra_conditions=[own()])
    assert admit(status_update(old, copy.deepcopy(old))) is None


def test_the_server_s_own_metadata_bookkeeping_is_not_a_change() -> None:
    old = node()
    new = with_conditions(old, lambda c: [*c, own()])
    new["metadata"]["resourceVersion"] = "81724"
    new["metadata"]["managedFields"].append({"manager": "pod-resources-watcher", "operation": "Apply"})
    assert admit(status_update(old, new)) is None


# --- whose node ----------------------------------------------------------------------------------------


def test_another_node_is_denied() -> None:
    old = node("gpu-node-18")
    denial = review(status_update(old, with_conditions(old, lambda c: [*c, own()])))
    assert denial is not None and denial.reason == "Forbidden" and denial.code == 403
    assert denial.message == (
        f"the pod-resources-watcher agent on node {NODE} may update only the status of its own node, "
        "not of gpu-node-18"
    )
    assert str(denial).startswith(DENIED)


@pytest.mark.parametrize("extra", ["missing key", "no extra at all", "empty value"])
def test_a_token_without_the_node_name_is_denied(extra: str) -> None:
    old = node()
    request = status_update(old, with_conditions(old, lambda c: [*c, own()]), node_name=None)
    if extra == "no extra at all":
        del request["userInfo"]["extra"]
    elif extra == "empty value":
        request["userInfo"]["extra"][NODE_NAME_EXTRA] = []
    message = admit(request)
    assert message is not None and message.startswith(DENIED)
    assert "credentials name no node" in message and "ServiceAccountTokenPodNodeInfo" in message


# --- which conditions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kubelet_type", KUBELET_TYPES)
@pytest.mark.parametrize("how", ["change", "remove", "add"])
def test_the_kubelet_s_conditions_are_untouchable(kubelet_type: str, how: str) -> None:
    if how == "add":
        old = with_conditions(node(), lambda c: [x for x in c if x["type"] != kubelet_type])
        new = with_conditions(old, lambda c: [*c, condition(kubelet_type, "True"), own()])
    elif how == "remove":
        old = node()
        new = with_conditions(old, lambda c: [x for x in c if x["type"] != kubelet_type] + [own()])
    else:
        old = node()
        new = with_conditions(
            old, lambda c: [condition(x["type"], "Unknown") if x["type"] == kubelet_type else x for x in c]
        )
    message = admit(status_update(old, new))
    assert message == (
        DENIED
        + "'pod-resources-watcher-node-status' denied request: the pod-resources-watcher agent may set "
        "and remove only node conditions whose type ends in DevicesUnavailable or DevicesMissing or "
        "PodsRejected and whose message starts "
        f"with its mark; this update adds, changes or removes: {kubelet_type}"
    )


def test_a_heartbeat_alone_is_a_change() -> None:
    """Not only status: any field of another's condition, such as a timestamp the kubelet keeps."""
    old = node()
    new = with_conditions(old, lambda c: [dict(x, lastHeartbeatTime="2026-12-01T03:00:40Z") for x in c])
    message = admit(status_update(old, new))
    assert message is not None and message.endswith("adds, changes or removes: " + ", ".join(KUBELET_TYPES))


@pytest.mark.parametrize(
    "foreign",
    [
        "GpuDriverProblem",  # another agent's (node-problem-detector style)
        "example.com/DevicesUnavailable-ish",
        "DevicesUnavailableSoon",  # the suffix must END the type
        "NvidiaGpuDevicesunavailable",  # case counts
    ],
)
def test_another_agent_s_condition_types_are_untouchable(foreign: str) -> None:
    old = node()
    message = admit(status_update(old, with_conditions(old, lambda c: [*c, own(), own(foreign)])))
    assert message is not None and message.endswith(f"adds, changes or removes: {foreign}")
    # ...nor may the agent remove or change one that is there.
    old = node(extra_conditions=[own(foreign)])
    message = admit(status_update(old, with_conditions(old, lambda c: c[:-1])))
    assert message is not None and message.endswith(f"adds, changes or removes: {foreign}")


def test_another_writer_s_condition_of_our_suffix_is_untouchable() -> None:
    """A NIC operator's VendorNicDevicesUnavailable ends like ours but lacks our mark: the agent may
    not remove it, change it, take it over by writing its mark on it, nor add a suffix condition
    without the mark."""
    theirs = condition("VendorNicDevicesUnavailable", "True", reason="NicDown")
    old = node(extra_conditions=[theirs])
    for new_conditions in (
        lambda c: c[:-1],  # removed
        lambda c: [*c[:-1], dict(theirs, status="False")],  # cleared
        lambda c: [*c[:-1], dict(theirs, status="False", message=OWNER_MARK + "ours now")],  # taken over
    ):
        message = admit(status_update(old, with_conditions(old, new_conditions)))
        assert message is not None and message.endswith(
            "adds, changes or removes: VendorNicDevicesUnavailable"
        )
    # Our own next to it still passes; one of ours without the mark does not.
    assert admit(status_update(old, with_conditions(old, lambda c: [*c, own()]))) is None
    unmarked = dict(own(), message="1 nvidia.com/gpu device(s) failed")
    message = admit(status_update(old, with_conditions(old, lambda c: [*c, unmarked])))
    assert message is not None and message.endswith(f"adds, changes or removes: {OWN}")


def test_reordering_conditions_is_not_a_change() -> None:
    old = node(extra_conditions=[own()])
    assert admit(status_update(old, with_conditions(old, lambda c: list(reversed(c))))) is None


# --- the rest of the status, and metadata --------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("capacity", {"cpu": "96", "memory": "792Gi", "nvidia.com/gpu": "16", "pods": "110"}),
        ("allocatable", {"cpu": "95"}),
        ("addresses", [{"type": "InternalIP", "address": "10.0.3.99"}]),
        ("nodeInfo", {"kubeletVersion": "v1.99.0"}),
        ("daemonEndpoints", {"kubeletEndpoint": {"Port": 1}}),
        ("images", []),
        ("volumesAttached", [{"name": "kubernetes.io/csi/x", "devicePath": ""}]),  # a field not there before
        ("phase", "Running"),
    ],
)
def test_the_rest_of_the_status_is_untouchable(field: str, value: Any) -> None:
    old = node()
    new = with_conditions(old, lambda c: [*c, own()])
    new["status"][field] = value
    message = admit(status_update(old, new))
    assert message is not None and message.endswith(
        f"may change nothing in a node's status but its own conditions; this update changes status.{field}"
    )


def test_removing_a_status_field_is_a_change() -> None:
    old = node()
    new = copy.deepcopy(old)
    del new["status"]["images"]
    message = admit(status_update(old, new))
    assert message is not None and message.endswith("this update changes status.images")


@pytest.mark.parametrize("field", ["labels", "annotations", "finalizers", "ownerReferences"])
def test_metadata_through_the_status_subresource_is_untouchable(field: str) -> None:
    """nodes/status persists metadata changes (the status strategy resets only spec): without this the
    grant would let the agent relabel any node and steer workloads onto it."""
    old = node()
    new = copy.deepcopy(old)
    new["metadata"][field] = {"node-role.kubernetes.io/control-plane": ""} if field == "labels" else ["x"]
    if field == "annotations":
        new["metadata"][field] = {"example.com/x": "y"}
    message = admit(status_update(old, new))
    assert message is not None and message.endswith(
        f"may not change a node's metadata; this update changes metadata.{field}"
    )


# --- what else the agent may not do; who else is not affected ------------------------------------------


@pytest.mark.parametrize(
    ("operation", "sub_resource"), [("CREATE", ""), ("DELETE", ""), ("UPDATE", ""), ("DELETE", "status")]
)
def test_the_agent_may_not_create_update_or_delete_nodes(operation: str, sub_resource: str) -> None:
    """Matched though the RBAC grants none of it: should a broader grant ever reach the ServiceAccount.
    The expressions that read object or oldObject must not fail on the null one (CREATE, DELETE)."""
    old, new = node(), node()
    request = status_update(old, new)
    request.update(operation=operation, subResource=sub_resource)
    if operation == "CREATE":
        request["oldObject"] = None
    if operation == "DELETE":
        request["object"] = None
    denial = review(request)
    assert denial is not None and denial.reason == "Forbidden"
    assert denial.message == (
        "the pod-resources-watcher agent may only update a Node's status (nodes/status), never create, "
        "update or delete a Node"
    )


@pytest.mark.parametrize(
    "user",
    [
        f"system:node:{NODE}",  # the kubelet
        "system:serviceaccount:kube-system:node-controller",
        "system:serviceaccount:gpu-operator:nvidia-device-plugin",  # another agent
        "system:serviceaccount:other:pod-resources-watcher",  # same name, other namespace
    ],
)
def test_other_users_are_not_matched(user: str) -> None:
    """The policy is the agent's alone: whatever others do to Ready, capacity or foreign nodes passes."""
    old = node("gpu-node-18")
    new = with_conditions(old, lambda c: [condition(x["type"], "Unknown") for x in c])
    new["status"]["capacity"] = {}
    assert admit(status_update(old, new, user=user, node_name=None)) is None


@pytest.mark.parametrize(
    ("resource", "sub_resource", "obj"),
    [
        ("events", "", {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"}}),
        ("pods", "", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
        ("pods", "status", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
    ],
)
def test_the_agent_s_other_writes_are_not_matched(
    resource: str, sub_resource: str, obj: dict[str, Any]
) -> None:
    request = status_update(obj, obj, node_name=None)
    request.update(resource=resource, subResource=sub_resource, operation="CREATE", oldObject=None)
    assert admit(request) is None


def test_an_expression_that_fails_denies() -> None:
    """failurePolicy Fail: a condition without a type cannot be judged, so the write is refused."""
    old = node()
    new = with_conditions(old, lambda c: [*c, {"status": "True"}])
    message = admit(status_update(old, new))
    assert message is not None and message.startswith(DENIED) and "resulted in error" in message


@pytest.mark.slow  # 60 runs of the policy's CEL: seconds
@settings(max_examples=60, deadline=None)
@given(
    own_before=st.sets(st.sampled_from(["Nvidia", "Amd", "Intel", "SriovNic", "Fpga"]), max_size=4),
    own_after=st.sets(st.sampled_from(["Nvidia", "Amd", "Intel", "SriovNic", "Fpga"]), max_size=4),
    statuses=st.lists(st.sampled_from(["True", "False", "Unknown"]), min_size=5, max_size=5),
    touched=st.one_of(st.none(), st.sampled_from(KUBELET_TYPES)),
)
def test_only_changes_to_own_types_pass(
    own_before: set[str], own_after: set[str], statuses: list[str], touched: str | None
) -> None:
    """Any mix of the agent's conditions added, changed and removed passes; adding a change to any one
    of the kubelet's conditions to that same update makes it fail, naming that condition."""
    old = node(extra_conditions=[own(f"{p}GpuDevicesUnavailable", "True") for p in sorted(own_before)])
    after = [own(f"{p}GpuDevicesUnavailable", s) for p, s in zip(sorted(own_after), statuses, strict=False)]
    new = with_conditions(
        old,
        lambda c: (
            [x for x in c if not x["type"].endswith("DevicesUnavailable")]
            + after
            + ([] if touched is None else [condition(touched, "Unknown", reason="Forged")])
        ),
    )
    if touched is not None:
        new["status"]["conditions"] = [
            x for x in new["status"]["conditions"] if x["type"] != touched or x["reason"] == "Forged"
        ]
    message = admit(status_update(old, new))
    if touched is None:
        assert message is None
    else:
        assert message is not None and message.endswith(f"adds, changes or removes: {touched}")


# --- the evaluator itself --------------------------------------------------------------------------------


def _policy_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]


def test_the_shipped_file_has_one_policy_with_its_binding() -> None:
    (policy,) = load()
    assert policy.name == policy.binding == "pod-resources-watcher-node-status"
    assert policy.failure_policy == "Fail" and policy.deny


def test_the_evaluator_runs_the_file_s_expressions_not_its_own(tmp_path: Path) -> None:
    """Guards the guard: edit the policy's suffix and the same update is judged differently."""
    docs = _policy_docs()
    text = POLICY_FILE.read_text().replace("'DevicesUnavailable'", "'DevicesMissing'")
    assert text != POLICY_FILE.read_text()
    edited = tmp_path / "policy.yaml"
    edited.write_text(text)
    (policy,) = load(edited)
    old = node()
    request = status_update(old, with_conditions(old, lambda c: [*c, own()]))
    shipped = Policy(docs[0], docs[1]).review(request)
    assert shipped is None
    denial = policy.review(request)
    assert denial is not None and denial.message.endswith(f"adds, changes or removes: {OWN}")


def test_the_evaluator_refuses_what_it_does_not_implement() -> None:
    policy, binding = _policy_docs()
    with_params = copy.deepcopy(policy)
    with_params["spec"]["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    with pytest.raises(PolicyError, match="paramKind"):
        Policy(with_params, binding)
    bad = copy.deepcopy(policy)
    bad["spec"]["validations"][0]["expression"] = "variables.statusUpdate &&"
    with pytest.raises(PolicyError, match="does not compile"):
        Policy(bad, binding)
    selective = copy.deepcopy(binding)
    selective["spec"]["matchResources"] = {"namespaceSelector": {}}
    with pytest.raises(PolicyError, match="matchResources"):
        Policy(policy, selective)


def test_a_binding_that_only_warns_does_not_deny() -> None:
    policy, binding = _policy_docs()
    warn = copy.deepcopy(binding)
    warn["spec"]["validationActions"] = ["Warn", "Audit"]
    old = node("gpu-node-18")
    assert Policy(policy, warn).review(status_update(old, copy.deepcopy(old))) is None
    assert Policy(policy, binding).review(status_update(old, copy.deepcopy(old))) is not None
