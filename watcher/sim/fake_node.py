"""The state a fake kubelet serves: devices, CPUs, memory and pods, plus a built-in node.

Plain mutable data, scripted by tests, the demo and the benchmarks through
`watcher.sim.fake_kubelet.FakeKubelet`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

__all__ = [
    "FakeDevice",
    "FakeMemory",
    "FakeClaimDevice",
    "FakeClaim",
    "FakeContainer",
    "FakeOwner",
    "FakePod",
    "FakeNode",
    "GIB",
    "default_node",
    "dra_backed_gpu_pod",
    "large_node",
]

GIB = 1024**3


@dataclass
class FakeDevice:
    resource: str
    id: str
    numa: tuple[int, ...] = ()
    healthy: bool = True


@dataclass
class FakeMemory:
    type: str
    size: int
    numa: tuple[int, ...] = ()


@dataclass
class FakeClaimDevice:
    driver: str
    pool: str
    device: str
    cdi_devices: list[str] = field(default_factory=list)
    share_id: str | None = None
    # What the DRA driver last said of the device (Healthy, Unhealthy, Unknown) and its words.
    health: str = "Healthy"
    message: str = ""


@dataclass
class FakeClaim:
    namespace: str
    name: str
    devices: list[FakeClaimDevice] = field(default_factory=list)
    request: str = ""  # the claim's request this container uses ("": the whole claim)
    # Set for the claim the scheduler made for a DRA-backed extended resource (e.g. a plain
    # nvidia.com/gpu request): the resource the container asked for, by the request name above.
    extended_resource: str | None = None


@dataclass
class FakeContainer:
    name: str
    # resource name -> device ids held
    devices: dict[str, list[str]] = field(default_factory=dict)
    cpu_ids: set[int] = field(default_factory=set)
    memory: list[FakeMemory] = field(default_factory=list)
    claims: list[FakeClaim] = field(default_factory=list)


@dataclass(frozen=True)
class FakeOwner:
    """One of a pod's ownerReferences (the controller, usually)."""

    kind: str
    name: str
    api_version: str = "apps/v1"
    controller: bool = True

    @property
    def uid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"owner/{self.api_version}/{self.kind}/{self.name}"))


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer] = field(default_factory=list)
    # Pod-level exclusive allocations; newest kubelets only.
    cpu_ids: set[int] = field(default_factory=set)
    memory: list[FakeMemory] = field(default_factory=list)
    # What the Pods API shows of the pod besides its resources. An empty uid is derived from the
    # namespace and name, so the same pod keeps its uid across runs.
    uid: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    owners: list[FakeOwner] = field(default_factory=list)
    phase: str = "Running"
    # The DisruptionTarget condition's reason, once a controller marked the pod for deletion
    # (DeletionByDeviceTaintManager: watcher.sim.fake_evictions); "" otherwise.
    disruption: str = ""
    # A failed pod's status.reason and status.message (an admission rejection: fake_pod_objects.rejected).
    reason: str = ""
    message: str = ""
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.uid:
            self.uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{self.namespace}/{self.name}"))

    def container(self, name: str) -> FakeContainer:
        for c in self.containers:
            if c.name == name:
                return c
        c = FakeContainer(name)
        self.containers.append(c)
        return c


@dataclass
class FakeNode:
    devices: dict[tuple[str, str], FakeDevice] = field(default_factory=dict)
    cpu_ids: set[int] = field(default_factory=set)
    memory: list[FakeMemory] = field(default_factory=list)
    pods: dict[tuple[str, str], FakePod] = field(default_factory=dict)
    # The kubelet remembers the topology of an unplugged device still held by a pod.
    unplugged_numa: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)

    def add_device(self, device: FakeDevice) -> None:
        self.devices[(device.resource, device.id)] = device
        self.unplugged_numa.pop((device.resource, device.id), None)

    def remove_device(self, resource: str, device_id: str) -> None:
        device = self.devices.pop((resource, device_id))
        self.unplugged_numa[(resource, device_id)] = device.numa

    def add_pod(self, pod: FakePod) -> None:
        self.pods[(pod.namespace, pod.name)] = pod

    def device_numa(self, resource: str, device_id: str) -> tuple[int, ...]:
        dev = self.devices.get((resource, device_id))
        if dev is not None:
            return dev.numa
        return self.unplugged_numa.get((resource, device_id), ())


def _gpu_id(index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"fake-gpu/{index}"))


def default_node() -> FakeNode:
    """A node that looks real: 8 GPUs on 2 NUMA nodes, SR-IOV NICs, 96 CPUs, hugepages, a few pods."""
    node = _default_hardware()
    for pod in (*_default_workloads(), _default_dra_pod()):
        node.add_pod(pod)
    node.add_pod(
        FakePod(
            "kube-system",
            "node-exporter-x2x9q",
            [FakeContainer("node-exporter")],
            labels={"app.kubernetes.io/name": "node-exporter"},
            owners=[FakeOwner("DaemonSet", "node-exporter")],
        )
    )
    return node


def _default_hardware() -> FakeNode:
    """The default node without its pods: devices, CPUs and memory."""
    node = FakeNode()
    for i in range(8):
        node.add_device(FakeDevice("nvidia.com/gpu", _gpu_id(i), (i // 4,)))
    for numa, bus in ((0, "3b"), (1, "86")):
        for fn in range(3):
            node.add_device(FakeDevice("intel.com/sriov_netdevice", f"0000:{bus}:02.{fn}", (numa,)))
    # Devices without topology: one entry each, no `topology`.
    for i in range(4):
        node.add_device(FakeDevice("smarter-devices/fuse", f"fuse{i}"))
    # 2 sockets x 48 CPUs; 0, 1, 48, 49 reserved for the system.
    node.cpu_ids = set(range(96)) - {0, 1, 48, 49}
    for numa in (0, 1):
        node.memory.append(FakeMemory("memory", 180 * GIB, (numa,)))
        node.memory.append(FakeMemory("hugepages-1Gi", 32 * GIB, (numa,)))
        node.memory.append(FakeMemory("hugepages-2Mi", 2 * GIB, (numa,)))
    return node


def _default_workloads() -> list[FakePod]:
    """The default node's device-plugin pods: a training job, an inference server, a DPDK router."""
    trainer = FakeContainer(
        "trainer",
        devices={"nvidia.com/gpu": [_gpu_id(i) for i in range(4)]},
        cpu_ids=set(range(2, 18)),
        memory=[FakeMemory("memory", 64 * GIB, (0,)), FakeMemory("hugepages-1Gi", 8 * GIB, (0,))],
    )
    return [
        FakePod(
            "ml",
            "trainer-0",
            # A restartable init ("sidecar") container is listed like any other.
            [FakeContainer("log-shipper"), trainer],
            cpu_ids=set(range(2, 18)),
            memory=[FakeMemory("memory", 64 * GIB, (0,)), FakeMemory("hugepages-1Gi", 8 * GIB, (0,))],
            labels={"app.kubernetes.io/name": "llm-pretrain", "team": "research"},
            owners=[FakeOwner("Job", "llm-pretrain", api_version="batch/v1")],
        ),
        FakePod(
            "ml",
            "inference-7f9c",
            [
                FakeContainer(
                    "server",
                    devices={
                        "nvidia.com/gpu": [_gpu_id(4)],
                        "intel.com/sriov_netdevice": ["0000:86:02.0"],
                    },
                    cpu_ids={50, 51, 52, 53},
                )
            ],
            labels={"app.kubernetes.io/name": "inference", "pod-template-hash": "7f9c"},
            owners=[FakeOwner("ReplicaSet", "inference-7f9c")],
        ),
        FakePod(
            "net",
            "dpdk-router",
            [
                FakeContainer(
                    "router",
                    devices={"intel.com/sriov_netdevice": ["0000:3b:02.0", "0000:3b:02.1"]},
                    cpu_ids={18, 19, 20, 21},
                    memory=[FakeMemory("hugepages-1Gi", 4 * GIB, (0,))],
                ),
                FakeContainer("envoy"),
            ],
            labels={"app.kubernetes.io/name": "dpdk-router"},
            owners=[FakeOwner("DaemonSet", "dpdk-router")],
        ),
    ]


def _default_dra_pod() -> FakePod:
    """The default node's pod holding a DRA claim's device."""
    return FakePod(
        "dra",
        "claimed-gpu",
        [
            FakeContainer(
                "app",
                claims=[
                    FakeClaim(
                        "dra",
                        "gpu-claim",
                        [
                            FakeClaimDevice(
                                "gpu.example.com",
                                "node-a",
                                "gpu-8",
                                ["gpu.example.com/gpu=gpu-8"],
                                share_id="2f7c3c1e-6c1d-4e55-9d0f-8a6d2b1f0c11",
                            )
                        ],
                    )
                ],
            )
        ],
    )


def dra_backed_gpu_pod(
    namespace: str,
    name: str,
    devices: list[FakeClaimDevice],
    *,
    container: str = "main",
    resource: str = "nvidia.com/gpu",
    owners: list[FakeOwner] | None = None,
) -> FakePod:
    """A pod whose plain `resource` request (nvidia.com/gpu, say) a DRA driver serves: DRA-backed
    extended resources, on by default since 1.36. Its devices are those of the claim the scheduler
    made for it, under dynamic_resources in pod-resources, never in allocatable."""
    claim = FakeClaim(
        namespace,
        f"{name}-extended-resources-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex[:5]}",
        devices,
        request="container-0-request-0",
        extended_resource=resource,
    )
    return FakePod(namespace, name, [FakeContainer(container, claims=[claim])], owners=list(owners or []))


def large_node(
    *,
    cpus: int = 512,
    numa_nodes: int = 8,
    resources: int = 4,
    devices_per_resource: int = 64,
    pods: int = 250,
    containers_per_pod: int = 4,
    claims: int = 50,
) -> FakeNode:
    """A synthetic node at the scale of the biggest machines, for scripts and benchmarks."""
    node = FakeNode()
    node.cpu_ids = set(range(cpus))
    for r in range(resources):
        for d in range(devices_per_resource):
            node.add_device(FakeDevice(f"vendor{r}.example.com/dev", f"dev-{r}-{d}", (d % numa_nodes,)))
    for n in range(numa_nodes):
        node.memory.append(FakeMemory("memory", 256 * GIB, (n,)))
        node.memory.append(FakeMemory("hugepages-1Gi", 64 * GIB, (n,)))
    cpu = 0
    device_cursor = 0
    total_devices = resources * devices_per_resource
    for p in range(pods):
        pod = FakePod(f"ns-{p % 20}", f"pod-{p}")
        for c in range(containers_per_pod):
            container = FakeContainer(f"c{c}")
            if c == 0 and device_cursor < total_devices:
                r, d = divmod(device_cursor, devices_per_resource)
                container.devices[f"vendor{r}.example.com/dev"] = [f"dev-{r}-{d}"]
                device_cursor += 1
            container.cpu_ids = {cpu % cpus}
            cpu += 1
            container.memory = [FakeMemory("memory", GIB, ((p + c) % numa_nodes,))]
            if c == 1 and p < claims:
                container.claims = [
                    FakeClaim(
                        pod.namespace,
                        f"claim-{p}",
                        [
                            FakeClaimDevice(
                                "gpu.example.com", "pool-a", f"gpu-{p}", [f"gpu.example.com/gpu=gpu-{p}"]
                            )
                        ],
                    )
                ]
            pod.containers.append(container)
        node.add_pod(pod)
    return node
