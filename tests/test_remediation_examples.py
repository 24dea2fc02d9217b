"""The remediation examples in deploy/remediation/ (a medik8s NodeHealthCheck and a Node Readiness
Controller NodeReadinessRule): that they name exactly the Node conditions the agent writes, with
the agent's polarity (True is the problem), and that the real kube-apiserver accepts them under the
projects' own CRDs (vendored in tests/data/remediation/, unmodified).

The fast tests read the files; the e2e ones install the CRDs on kube-testcluster and apply the
examples with server-side apply, as an operator would. docs/remediation.md explains the examples.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.kube_reporting import Placement, install_reporting, place_agent
from testkit.kube_testcluster import KubeTestCluster, stop_process
from testkit.waiting import wait_until
from watcher.sim.fake_node import FakeContainer, FakeDevice, FakeNode, FakePod
from watcher.sim.fake_pod_objects import rejected
from watcher.sinks.kubernetes import KubernetesSinkSettings
from watcher.sinks.kubernetes.condition_plan import (
    CONDITION_SUFFIX,
    MISSING_SUFFIX,
    REJECTING_SUFFIX,
    check_condition_type,
    condition_type,
)
from watcher.sinks.kubernetes.episodes import MISSING, REJECTING
from watcher.sources.expected_settings import ExpectedSettings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "remediation"
NHC_FILE = EXAMPLES / "nodehealthcheck.yaml"
RULE_FILE = EXAMPLES / "nodereadinessrule.yaml"
CRDS = ROOT / "tests" / "data" / "remediation"
NHC_CRD = CRDS / "remediation.medik8s.io_nodehealthchecks.yaml"
RULE_CRD = CRDS / "readiness.node.x-k8s.io_nodereadinessrules.yaml"
SINK_CODE = ROOT / "watcher" / "sinks" / "kubernetes"

# The examples are for this resource: GPU feature discovery's label selects its nodes.
GPU = "nvidia.com/gpu"
# Every kind of Node condition the agent owns, by the ending of its type (the sink's constants).
SUFFIXES = (CONDITION_SUFFIX, MISSING_SUFFIX, REJECTING_SUFFIX)
# The kubelet's own condition, kept in the NodeHealthCheck: listing ours replaces the default.
KUBELET_TYPES = {"Ready"}


def _load(path: Path) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert len(documents) == 1, f"{path.name}: one object per file, found {len(documents)}"
    found: dict[str, Any] = documents[0]
    return found


def agent_types(resource: str) -> set[str]:
    """The condition types the agent writes for `resource`, as the sink's code derives them (so a
    rename in the code changes these)."""
    return {condition_type(resource), MISSING.type_of(resource), REJECTING.type_of(resource)}


def _suffix_constants() -> set[str]:
    """The values of every module-level `*_SUFFIX` string constant in the kubernetes sink: where a
    new kind of owned condition gets its ending."""
    found: set[str] = set()
    for module in sorted(SINK_CODE.glob("*.py")):
        for node in ast.parse(module.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            value = node.value if isinstance(node, ast.Assign) else None
            if isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            named = any(isinstance(t, ast.Name) and t.id.endswith("_SUFFIX") for t in targets)
            if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(value.value)
    return found


def _schema_of(crd_file: Path, version: str) -> dict[str, Any]:
    crd = _load(crd_file)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
    return schema


def _unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields of `value` its structural schema does not define (a typo the API server would prune
    in silence rather than refuse), and enum values outside their enum."""
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} not one of {schema['enum']}")
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                problems.append(f"{where}.{key}: not in the schema")
            else:
                problems += _unknown_fields(item, schema["properties"][key], f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += _unknown_fields(item, schema["items"], f"{where}[{i}]")
    return problems


# --- fast: the files against the code ---


@pytest.mark.parametrize(
    ("example", "crd_file"), [(NHC_FILE, NHC_CRD), (RULE_FILE, RULE_CRD)], ids=["nhc", "rule"]
)
def test_each_example_is_an_object_of_its_vendored_crd(example: Path, crd_file: Path) -> None:
    obj, crd = _load(example), _load(crd_file)
    group, version = obj["apiVersion"].split("/")
    assert crd["kind"] == "CustomResourceDefinition"
    assert (group, obj["kind"]) == (crd["spec"]["group"], crd["spec"]["names"]["kind"])
    assert crd["spec"]["scope"] == "Cluster" and "namespace" not in obj["metadata"]
    schema = _schema_of(crd_file, version)
    assert _unknown_fields(obj, schema) == []
    assert set(schema["properties"]["spec"].get("required", [])) <= set(obj["spec"])


def test_the_schema_walk_finds_a_misspelt_field() -> None:
    # The check above would pass on anything if the walk found nothing: a typo must show.
    rule = _load(RULE_FILE)
    rule["spec"]["conditions"][0]["requiredStaus"] = "False"
    rule["spec"]["enforcementMode"] = "always"
    problems = _unknown_fields(rule, _schema_of(RULE_CRD, "v1alpha1"))
    assert problems == [
        ".spec.enforcementMode: 'always' not one of ['bootstrap-only', 'continuous']",
        ".spec.conditions[0].requiredStaus: not in the schema",
    ]


def test_the_health_check_names_exactly_the_agents_conditions_true_is_unhealthy() -> None:
    conditions = _load(NHC_FILE)["spec"]["unhealthyConditions"]
    ours = [c for c in conditions if c["type"] not in KUBELET_TYPES]
    assert {c["type"] for c in ours} == agent_types(GPU)
    assert len(ours) == len(agent_types(GPU))  # each once: the list's key is (type, status)
    assert {c["status"] for c in ours} == {"True"}
    # The operator's default, which a list of our own replaces, is kept.
    kept = {(c["type"], c["status"], c["duration"]) for c in conditions if c["type"] in KUBELET_TYPES}
    assert kept == {("Ready", "False", "300s"), ("Ready", "Unknown", "300s")}


def test_the_readiness_rule_names_exactly_the_agents_conditions_false_is_ready() -> None:
    spec = _load(RULE_FILE)["spec"]
    assert {c["type"] for c in spec["conditions"]} == agent_types(GPU)
    for condition in spec["conditions"]:
        # Untainted only while False; a node without the condition (not written yet) counts as False.
        assert (condition["requiredStatus"], condition["defaultStatus"]) == ("False", "False")
    assert spec.get("conditionPolicy", "allOf") == "allOf"  # any one True keeps the taint
    assert spec["enforcementMode"] == "continuous"  # bootstrap-only would ignore failures after boot
    assert spec["taint"]["effect"] == "NoSchedule" and spec["dryRun"] is True


def test_the_examples_types_are_valid_and_the_unavailable_one_is_what_the_code_derives() -> None:
    assert condition_type(GPU) == "NvidiaGpuDevicesUnavailable"
    for ctype in agent_types(GPU):
        assert ctype.startswith("NvidiaGpu"), ctype
    assert check_condition_type(condition_type(GPU)) is None


def test_every_owned_condition_ending_in_the_sink_is_in_the_examples() -> None:
    # A new kind of owned condition (or a renamed ending) must reach the examples and the doc.
    constants = _suffix_constants()
    assert CONDITION_SUFFIX in constants
    assert constants <= set(SUFFIXES), f"not in the examples: {sorted(constants - set(SUFFIXES))}"


def test_the_remediation_doc_names_every_condition_of_the_examples() -> None:
    doc = (ROOT / "docs" / "remediation.md").read_text(encoding="utf-8")
    for ctype in sorted(agent_types(GPU)):
        assert ctype in doc, ctype
    for example in (NHC_FILE, RULE_FILE):
        assert f"deploy/remediation/{example.name}" in doc


# --- e2e: the real kube-apiserver, the real CRDs ---


FIELD_MANAGER = "remediation-examples-test"
CRD_NAMES = ("nodehealthchecks.remediation.medik8s.io", "nodereadinessrules.readiness.node.x-k8s.io")


def _server_side_apply(cluster: KubeTestCluster, path: Path, *, check: bool = True) -> Any:
    return cluster.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(path), check=check
    )


@pytest.fixture(scope="module")
def with_crds(kube_cluster: KubeTestCluster) -> Iterator[KubeTestCluster]:
    """The session's cluster with both vendored CRDs installed and established; removed after."""
    for crd_file in (NHC_CRD, RULE_CRD):
        _server_side_apply(kube_cluster, crd_file)
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES)
    )
    yield kube_cluster
    kube_cluster.kubectl("delete", "crd", "--ignore-not-found", "--wait=false", *CRD_NAMES)


def _variant(tmp_path: Path, example: Path, name: str, change: dict[str, Any]) -> Path:
    """The example as a new file named `name`, its spec's keys in `change` replaced."""
    obj = _load(example)
    obj["metadata"]["name"] = name
    obj["spec"].update(change)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("example", "resource"),
    [(NHC_FILE, "nodehealthcheck"), (RULE_FILE, "nodereadinessrule")],
    ids=["nhc", "rule"],
)
def test_the_example_is_applied_server_side_and_kept_as_written(
    with_crds: KubeTestCluster, example: Path, resource: str
) -> None:
    written = _load(example)
    name = written["metadata"]["name"]
    try:
        _server_side_apply(with_crds, example)
        stored = with_crds.get(resource, name)
        # Nothing pruned or defaulted away: what the server keeps is what the file says.
        assert {k: stored["spec"][k] for k in written["spec"]} == written["spec"]
        ours = [
            c["type"] for c in stored["spec"].get("unhealthyConditions", stored["spec"].get("conditions"))
        ]
        assert set(ours) - KUBELET_TYPES == agent_types(GPU)
        # Applied again unchanged: no conflict, no new generation.
        _server_side_apply(with_crds, example)
        assert with_crds.get(resource, name)["metadata"]["generation"] == stored["metadata"]["generation"]
    finally:
        with_crds.kubectl("delete", resource, name, "--ignore-not-found")


BAD_TAINT = {"key": "example.com/gpu", "effect": "NoSchedule"}
BAD_DURATION = [{"type": condition_type(GPU), "status": "True", "duration": "ten minutes"}]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("example", "change", "says"),
    [
        (RULE_FILE, {"taint": BAD_TAINT}, "taint key must start with 'readiness.k8s.io/'"),
        (RULE_FILE, {"enforcementMode": "always"}, 'Unsupported value: "always"'),
        (NHC_FILE, {"minHealthy": "150%"}, "spec.minHealthy"),
        (NHC_FILE, {"unhealthyConditions": BAD_DURATION}, "spec.unhealthyConditions[0].duration"),
    ],
    ids=["rule-taint-key", "rule-mode", "nhc-min-healthy", "nhc-duration"],
)
def test_the_server_enforces_the_projects_schemas_on_a_broken_variant(
    with_crds: KubeTestCluster, tmp_path: Path, example: Path, change: dict[str, Any], says: str
) -> None:
    # The CRDs are the projects' real ones, validations included: a broken copy is refused.
    result = _server_side_apply(with_crds, _variant(tmp_path, example, "broken-variant", change), check=False)
    assert result.returncode != 0, result.stdout
    assert says in result.stderr, result.stderr


# --- e2e: the Node Readiness Controller itself, when its binary is at hand ---


def _controller_binary() -> Path:
    """The Node Readiness Controller built from its source (docs/remediation.md says why it is not
    a `make peers` peer: its module is not served by the Go module proxy)."""
    found = Path(
        os.environ.get("NODE_READINESS_CONTROLLER", ROOT / ".peers" / "bin" / "node-readiness-controller")
    )
    if not (found.is_file() and os.access(found, os.X_OK)):
        pytest.skip(f"no Node Readiness Controller binary at {found} (docs/remediation.md: how to build it)")
    return found


@pytest.fixture
def readiness_controller(with_crds: KubeTestCluster, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    binary = _controller_binary()
    log = (tmp_path / "node-readiness-controller.log").open("w")
    args = [
        str(binary),
        f"--kubeconfig={with_crds.admin_kubeconfig}",
        "--health-probe-bind-address=0",
        "--metrics-bind-address=0",
    ]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        stop_process(proc)
        log.close()


def _taints(cluster: KubeTestCluster, node: str) -> list[dict[str, Any]]:
    taints: list[dict[str, Any]] = cluster.get("node", node)["spec"].get("taints", [])
    return [t for t in taints if t["key"].startswith("readiness.k8s.io/")]


HELD, SPARE = "GPU-held", "GPU-spare"


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """A Node of the real API server labelled as a GPU node (the examples' selector), with the
    agent's identity bound to it, and the agent's settings for it (kubernetes sink included)."""

    cluster: KubeTestCluster
    placed: Placement
    settings: Any

    @classmethod
    async def make(cls, cluster: KubeTestCluster, short_tmp: Path) -> GpuNode:
        await install_reporting(cluster)
        placed = place_agent(cluster, "remediation")
        cluster.kubectl("label", "node", placed.node, "nvidia.com/gpu.present=true")
        settings = make_settings(short_tmp)
        sink = KubernetesSinkSettings(name="k8s", kubeconfig=placed.kubeconfig, api_rate=50.0)
        return cls(
            cluster, placed, dataclasses.replace(settings, node=placed.node, sinks=(*settings.sinks, sink))
        )

    def fake_node(self) -> FakeNode:
        """Two GPUs, one held by a pod of the workload namespace."""
        node = FakeNode()
        node.cpu_ids = {0, 1}
        node.add_device(FakeDevice(GPU, HELD, (0,)))
        node.add_device(FakeDevice(GPU, SPARE, (0,)))
        node.add_pod(
            FakePod(self.placed.namespace, "trainer", [FakeContainer("main", devices={GPU: [HELD]})])
        )
        return node

    async def node(self) -> dict[str, Any]:
        found: dict[str, Any] = await asyncio.to_thread(self.cluster.get, "node", self.placed.node)
        return found

    async def condition(self) -> dict[str, Any] | None:
        """The agent's DevicesUnavailable condition for the GPUs, as the server has it."""
        found = [
            c for c in (await self.node())["status"].get("conditions", []) if c["type"] == condition_type(GPU)
        ]
        return found[0] if found else None

    async def until_status(self, status: str) -> dict[str, Any]:
        async def has() -> bool:
            return ((await self.condition()) or {}).get("status") == status

        await wait_until(has, timeout=20, interval=0.2, what=f"{condition_type(GPU)} {status}")
        found = await self.condition()
        assert found is not None
        return found

    async def taints(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(_taints, self.cluster, self.placed.node)


async def _restarted_quietly(gpu_node: GpuNode, fake: Any) -> None:
    """An agent run on the same state that reconciles at its start (its first delivery to the
    sink) and one more re-query, then stops."""
    async with running_agent(gpu_node.settings, fake) as run:
        await run.recorder.until(
            lambda: run.agent.metrics.value("deliveries_total", sink="k8s", result="delivered") > 0, 20
        )
        await run.quiet_cycle()


@pytest.mark.e2e
async def test_an_agent_restart_leaves_true_conditions_as_they_are_on_the_real_server(
    kube_cluster: KubeTestCluster, short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    # What both examples count on: a restart is no heal. The Node is written by no one but the
    # agent here (no kubelet), so an unchanged resourceVersion means the restart wrote nothing.
    gpu_node = await GpuNode.make(kube_cluster, short_tmp)
    # Three GPUs expected, two known (the capacity a kubelet would post): DevicesMissing as well.
    capacity = json.dumps({"status": {"capacity": {GPU: "2"}}})
    kube_cluster.kubectl("patch", "node", gpu_node.placed.node, "--subresource=status", "-p", capacity)
    expected = ExpectedSettings(devices={GPU: 3}, interval=1.0)
    gpu_node = dataclasses.replace(
        gpu_node, settings=dataclasses.replace(gpu_node.settings, expected=expected)
    )
    fake = await start_kubelet(gpu_node.fake_node())

    async def ours() -> dict[str, dict[str, Any]]:
        conditions = (await gpu_node.node())["status"].get("conditions", [])
        return {c["type"]: c for c in conditions if c["type"] in agent_types(GPU)}

    async def all_true() -> bool:
        found = await ours()
        return all(found.get(t, {}).get("status") == "True" for t in agent_types(GPU))

    async with running_agent(gpu_node.settings, fake) as run:
        await run.pods_watching()
        await gpu_node.until_status("False")
        fake.make_unhealthy(GPU, HELD)
        # And PodsRejected: three GPU pods failed at admission within the window (3 in 300 s).
        for n in range(3):
            fake.add_pod(rejected(fake.node, FakePod(gpu_node.placed.namespace, f"rejected-{n}"), GPU, 8))
        await wait_until(all_true, timeout=30, interval=0.2, what="all three conditions True")
    before_restart = await ours()
    before = (await gpu_node.node())["metadata"]["resourceVersion"]
    await _restarted_quietly(gpu_node, fake)
    assert await ours() == before_restart
    assert (await gpu_node.node())["metadata"]["resourceVersion"] == before


@pytest.mark.e2e
async def test_the_agents_condition_becomes_the_controllers_taint_and_its_end_lifts_it(
    with_crds: KubeTestCluster,
    readiness_controller: subprocess.Popen[str],
    short_tmp: Path,
    start_kubelet: StartKubelet,
    tmp_path: Path,
) -> None:
    """The agent (fake kubelet, kubernetes sink with the shipped RBAC and admission policy) on a
    GPU node of the real API server, the controller beside it, the shipped rule in dry run and
    then for real; an agent restart in between."""
    gpu_node = await GpuNode.make(with_crds, short_tmp)
    rule = _load(RULE_FILE)
    taint = rule["spec"]["taint"]
    name = f"{rule['metadata']['name']}-{gpu_node.placed.node}"
    # The shipped selector, narrowed to this test's node: other tests leave GPU nodes behind.
    selector = {"matchLabels": {**rule["spec"]["nodeSelector"]["matchLabels"], "test-node": name}}
    with_crds.kubectl("label", "node", gpu_node.placed.node, f"test-node={name}")
    fake = await start_kubelet(gpu_node.fake_node())

    async def rule_status() -> dict[str, Any]:
        found: dict[str, Any] = (await asyncio.to_thread(with_crds.get, "nodereadinessrule", name)).get(
            "status", {}
        )
        return found

    async def would_add_one() -> bool:
        return bool((await rule_status()).get("dryRunResults", {}).get("taintsToAdd") == 1)

    async def tainted_once() -> bool:
        return len(await gpu_node.taints()) == 1

    try:
        async with running_agent(gpu_node.settings, fake):
            await gpu_node.until_status("False")
            fake.make_unhealthy(GPU, HELD)
            await gpu_node.until_status("True")
            # Dry run: the controller says it would taint this node (the only one with the label)
            # and taints nothing.
            await asyncio.to_thread(
                _server_side_apply, with_crds, _variant(tmp_path, RULE_FILE, name, {"nodeSelector": selector})
            )
            await wait_until(would_add_one, timeout=30, interval=0.3, what="the dry run's would-add")
            assert await gpu_node.taints() == []
            # For real: the condition becomes the rule's taint.
            real = _variant(tmp_path, RULE_FILE, name, {"nodeSelector": selector, "dryRun": False})
            await asyncio.to_thread(_server_side_apply, with_crds, real)
            await wait_until(tainted_once, timeout=30, interval=0.3, what="the rule's taint")
            (seen,) = await gpu_node.taints()
            assert (seen["key"], seen.get("value"), seen["effect"]) == (
                taint["key"],
                taint["value"],
                taint["effect"],
            )
        # The agent restarted while the GPU is still failed: the taint stays.
        await _restarted_quietly(gpu_node, fake)
        assert [t["key"] for t in await gpu_node.taints()] == [taint["key"]]
        async with running_agent(gpu_node.settings, fake):
            # The GPU back (the condition False) lifts it.
            fake.heal(GPU, HELD)
            await gpu_node.until_status("False")

            async def lifted() -> bool:
                return await gpu_node.taints() == []

            await wait_until(lifted, timeout=30, interval=0.3, what="the taint lifted")
    finally:
        with_crds.kubectl("delete", "nodereadinessrule", name, "--ignore-not-found")
