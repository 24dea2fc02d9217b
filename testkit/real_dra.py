"""DRA on a real node, the way a user sets it up: upstream's DRA test driver registered with the
real kubelet (testkit.dra_driver), a DeviceClass for its driver, a ResourceClaimTemplate, and a Job
whose pod asks for a claim from it. The resourceclaim controller makes the claim, the real
scheduler allocates it and binds the pod, the kubelet prepares it through the driver
(NodePrepareResources) and reports the device's health in the pod's status.

Names: the driver `<tag>.test.example.com`, its DeviceClass `<tag>`, so tests sharing one API
server never select each other's devices.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testkit.dra_driver import DraDriver
from testkit.peers import peer
from testkit.real_node import RealNode
from testkit.waiting import wait_until

__all__ = [
    "DraSetup",
    "add_dra_driver",
    "allocated_device",
    "claim_job",
    "claim_of",
    "job_pod",
    "restart_driver_healthy",
    "until_status_health",
]

REQUEST = "gpu"  # the pod's claim entry and its request in every template: its status entry is claim:gpu


@dataclass(frozen=True)
class DraSetup:
    driver: DraDriver
    device_class: str

    @property
    def name(self) -> str:
        return self.driver.driver

    @property
    def pool(self) -> str:
        return self.driver.pool


async def add_dra_driver(
    node: RealNode, tag: str, devices: tuple[str, ...] = ("gpu-0", "gpu-1"), *, health: bool = True
) -> DraSetup:
    """Start the driver on `node`, its DeviceClass in the API server; returns once the kubelet
    registered the plugin and the driver's ResourceSlice is published."""
    driver = DraDriver(
        peer("dra-test-driver"),
        node.root,
        kubeconfig=node.cluster.admin_kubeconfig,
        node=node.name,
        driver=f"{tag}.test.example.com",
        devices=devices,
        health=health,
    )
    node.closers.append(driver.stop)
    await driver.start()
    await node.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": tag},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver.driver}"'}}]},
        }
    )

    async def registered() -> bool:
        state = await driver.state()
        if not state.get("registered"):
            return False
        slices = await node.get("resourceslices", "--field-selector", f"spec.nodeName={node.name}")
        return any(s["spec"]["driver"] == driver.driver for s in slices["items"])

    await wait_until(registered, 30, interval=0.2, what=f"{driver.driver} registered and published")
    return DraSetup(driver, tag)


async def claim_job(
    node: RealNode,
    setup: DraSetup,
    namespace: str,
    name: str,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> None:
    """A ResourceClaimTemplate asking for one device of the class (its request tolerating the
    device taints `tolerations` says), and a Job whose one pod (kept to `node` by a node selector)
    takes a claim from it."""
    template = f"{name}-gpu"
    exactly: dict[str, Any] = {"deviceClassName": setup.device_class}
    if tolerations:
        exactly["tolerations"] = [dict(t) for t in tolerations]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "resourceClaims": [{"name": REQUEST, "resourceClaimTemplateName": template}],
        "containers": [
            {"name": "main", "image": "registry.test/trainer:1", "resources": {"claims": [{"name": REQUEST}]}}
        ],
    }
    await node.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}}},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "backoffLimit": 0,
                "template": {"metadata": {"labels": {"team": "research"}}, "spec": pod_spec},
            },
        },
    )


async def job_pod(node: RealNode, namespace: str, job: str, timeout: float = 60.0) -> dict[str, Any]:
    """The Job's pod once it runs on `node`: its claim allocated by the scheduler and prepared by
    the driver."""
    found: dict[str, Any] = {}

    async def running() -> bool:
        pods = await node.get("pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}")
        for pod in pods["items"]:
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if pod["status"].get("phase") == "Running" and all(s["state"].get("running") for s in statuses):
                found["pod"] = pod
                return True
        return False

    await wait_until(running, timeout, interval=0.2, what=f"Job {namespace}/{job}'s pod Running")
    pod: dict[str, Any] = found["pod"]
    return pod


async def claim_of(node: RealNode, pod: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaim the pod's `gpu` entry names in its status (made from the template)."""
    statuses = pod["status"].get("resourceClaimStatuses", [])
    (name,) = [s["resourceClaimName"] for s in statuses if s["name"] == REQUEST]
    claim: dict[str, Any] = await node.get("resourceclaim", "-n", pod["metadata"]["namespace"], name)
    return claim


def allocated_device(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


async def until_status_health(
    node: RealNode, namespace: str, pod: str, health: str, timeout: float = 30.0, *, nudge: bool = False
) -> dict[str, Any]:
    """Until the pod's status (in the API server) gives its claim's device `health`; that entry.
    `nudge`: annotate the pod before each look. The kubelet re-evaluates a DRA device's health only
    when it syncs the pod; a health change it is pushed (a driver's report) syncs it at once, but a
    timeout or a driver gone does not, and waits for the periodic resync (1 to 1.5 min) unless the
    pod is updated, as any update does."""
    seen: dict[str, Any] = {}

    async def says() -> bool:
        if nudge:
            await asyncio.to_thread(
                node.kubectl,
                "annotate",
                "pod",
                pod,
                "-n",
                namespace,
                f"nudge={uuid.uuid4().hex[:6]}",
                "--overwrite",
            )
        got = await node.get("pod", "-n", namespace, pod)
        for status in got["status"].get("containerStatuses", []):
            for entry in status.get("allocatedResourcesStatus", []):
                if entry["name"].startswith("claim:"):
                    for resource in entry.get("resources", []):
                        if resource.get("health") == health:
                            seen["entry"] = {"name": entry["name"], **resource}
                            return True
        return False

    interval = 2.0 if nudge else 0.1
    await wait_until(
        says, timeout, interval=interval, what=f"{namespace}/{pod}'s claim {health} in its status"
    )
    entry: dict[str, Any] = seen["entry"]
    return entry


async def restart_driver_healthy(
    node: RealNode, setup: DraSetup, namespace: str, pod: str, device: str
) -> None:
    """The driver restarts as a plugin that keeps no health does: a new process (a new
    registration socket in plugins_registry/) that calls `device` Healthy again. Returns once the
    kubelet registered it and `pod`'s status says Healthy (nudged: a driver gone and back syncs no
    pod by itself)."""
    driver = setup.driver
    await driver.stop()
    await driver.start()
    await driver.set_health(setup.pool, device, "Healthy")

    async def registered() -> bool:
        return bool((await driver.state()).get("registered"))

    await wait_until(registered, 30, interval=0.2, what="the restarted driver registered")
    await until_status_health(node, namespace, pod, "Healthy", 90, nudge=True)
