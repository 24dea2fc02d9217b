"""A pod evicted for a device taint on the fake node, as upstream's device taint eviction
controller and the real kubelet show it (tests/test_e2e_real_node_evictions.py runs the real ones).

The controller (kube-controller-manager's `pkg/controller/devicetainteviction`) writes the pod's
DisruptionTarget condition (True, DeletionByDeviceTaintManager) and deletes it; the kubelet copies
the condition into the status its Pods API serves, unprepares the pod's claims (pod-resources lists the
pod a moment without its DRA devices: seen with the real kubelet), kills the containers (the pod
turns Failed and pod-resources leaves it out) and, once they are gone, the pod is deleted. Each
step here is its own change, in that order.
"""

from __future__ import annotations

import asyncio

from watcher.sim.fake_kubelet import FakeKubelet

__all__ = ["DISRUPTION_REASON", "evict_for_device_taint"]

DISRUPTION_REASON = "DeletionByDeviceTaintManager"


async def evict_for_device_taint(fake: FakeKubelet, namespace: str, pod: str, *, delete: bool = True) -> None:
    """Evict `namespace/pod` (a device it holds has a NoExecute taint); `delete=False` stops
    before the deletion: the Pods API keeps showing the Failed pod with its condition."""
    evicted = fake.node.pods[(namespace, pod)]
    evicted.disruption = DISRUPTION_REASON
    fake.update_pod(namespace, pod)  # the status with the condition, the pod still running
    await asyncio.sleep(0)  # sent on the next loop turn: its own event
    for container in evicted.containers:  # its claims unprepared: still listed, without them
        for claim in container.claims:
            claim.devices = []
    fake.update_pod(namespace, pod)
    await asyncio.sleep(0)
    fake.update_pod(namespace, pod, phase="Failed")  # the containers killed
    if delete:
        await asyncio.sleep(0)
        fake.free(namespace, pod)  # DELETED
