"""Small inventories written as a few names: which GPUs a node has and which pods hold them (device
plugins' GPUs, or DRA claims' devices), the Pods API's view of a pod's verdict on one, and the
fake kubelet's Job pod holding one DRA GPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from watcher.model.devicehealth.pods import DeviceVerdict, PodMeta
from watcher.model.inventory import Inventory
from watcher.model.restore import from_canonical
from watcher.sim.fake_node import FakeClaim, FakeClaimDevice, FakeContainer, FakeOwner, FakePod

__all__ = ["GPU", "DRIVER", "ClaimHoldings", "inventory_of", "claim_inventory", "verdict_pod", "dra_job_pod"]

GPU = "nvidia.com/gpu"
DRIVER = "gpu.nvidia.com"
# "ns/pod" -> (its one container, the ResourceClaim's name, [(pool, device, first CDI id or None)])
ClaimHoldings = Mapping[str, tuple[str, str, Sequence[tuple[str, str, str | None]]]]


def inventory_of(gpus: Sequence[str], pods: Mapping[str, Sequence[str]]) -> Inventory:
    """gpus: allocatable ids; pods: "ns/name" -> the GPU ids its one container ("main") holds."""
    return from_canonical(
        {
            "format": 3,
            "allocatable": {
                "known": True,
                "devices": {GPU: {g: [0] for g in gpus}} if gpus else {},
                "cpu_ids": [0, 1],
                "memory": [],
            },
            "pods": [
                {
                    "namespace": key.split("/")[0],
                    "name": key.split("/")[1],
                    "cpu_ids": [],
                    "memory": [],
                    "containers": [
                        {
                            "name": "main",
                            "devices": {GPU: {g: [0] for g in held}} if held else {},
                            "cpu_ids": [],
                            "memory": [],
                            "dynamic_resources": [],
                        }
                    ],
                }
                for key, held in sorted(pods.items())
            ],
        }
    )


def claim_inventory(pods: ClaimHoldings, *, gpus: Sequence[str] = (), driver: str = DRIVER) -> Inventory:
    """A node whose pods hold DRA claims of `driver`'s devices; `gpus`: device-plugin GPUs in allocatable."""
    return from_canonical(
        {
            "format": 3,
            "allocatable": {
                "known": True,
                "devices": {GPU: {g: [0] for g in gpus}} if gpus else {},
                "cpu_ids": [0, 1],
                "memory": [],
            },
            "pods": [
                {
                    "namespace": key.split("/")[0],
                    "name": key.split("/")[1],
                    "cpu_ids": [],
                    "memory": [],
                    "containers": [
                        {
                            "name": container,
                            "devices": {},
                            "cpu_ids": [],
                            "memory": [],
                            "dynamic_resources": [
                                {
                                    "namespace": key.split("/")[0],
                                    "name": claim,
                                    "devices": [
                                        {
                                            "driver": driver,
                                            "pool": pool,
                                            "device": device,
                                            "cdi_devices": [cdi] if cdi else [],
                                            "share_id": None,
                                        }
                                        for pool, device, cdi in devices
                                    ],
                                }
                            ],
                        }
                    ],
                }
                for key, (container, claim, devices) in sorted(pods.items())
            ],
        }
    )


def verdict_pod(
    key: str,
    container: str,
    verdicts: Sequence[tuple[str, str, str]],
    *,
    claims: Sequence[tuple[str, str]] = (("gpu", "gpu-claim"),),
    pod_claim: str = "claim:gpu/gpus",
) -> PodMeta:
    """The Pods API's view of pod `key` ("ns/name", uid "uid-<name>"): `verdicts` (resource id, health,
    message) on its pod claim `pod_claim`'s devices; `claims` maps pod claims to ResourceClaim names."""
    namespace, name = key.split("/")
    return PodMeta(
        f"uid-{name}",
        namespace,
        name,
        "Running",
        verdicts=tuple(DeviceVerdict(container, pod_claim, rid, h, m) for rid, h, m in verdicts),
        claims=tuple(claims),
    )


def dra_job_pod(
    pool: str,
    device: str,
    *,
    labels: Mapping[str, str] | None = None,
    name: str = "llm-pretrain-0-abcde",
    claim: str = "llm-pretrain-0-gpu",
) -> FakePod:
    """Job ml/llm-pretrain's pod `name`, its container "trainer" holding DRIVER's `device` of
    `pool` through ResourceClaim `claim` (request "gpu"), for the fake kubelet."""
    gpu = FakeClaimDevice(DRIVER, pool, device, [f"nvidia.com/gpu={device}"])
    held = FakeClaim("ml", claim, [gpu], request="gpu")
    return FakePod(
        "ml",
        name,
        [FakeContainer("trainer", claims=[held])],
        labels=dict(labels or {}),
        owners=[FakeOwner("Job", "llm-pretrain", api_version="batch/v1")],
    )
