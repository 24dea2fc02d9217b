"""Who holds a DRA device, read from an inventory: the claim giving it, the device as the claim
shows it, and every container holding it. Pure.

The inventory's tally keeps each DRA device's holders, carried from one inventory to the next; so
a health look asks about the few devices it needs and reads only their first holder's pod (a binary
search), never every pod of the node.
"""

from __future__ import annotations

from collections.abc import Iterable

from watcher.model.devicehealth.pods import DeviceVerdict, PodMeta
from watcher.model.inventory import Inventory
from watcher.model.records import ClaimDevice, Pod

__all__ = ["DeviceKey", "claim_device_of", "claim_object_of", "held_dra_devices", "resource_id_of"]

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def resource_id_of(device: ClaimDevice) -> str:
    """The id the kubelet gives a DRA device in a Pod status: its first CDI id, else
    driver/pool/device (upstream's cm/dra buildResourceHealth)."""
    return device.cdi_devices[0] if device.cdi_devices else f"{device.driver}/{device.pool}/{device.device}"


def held_dra_devices(
    inventory: Inventory, keys: Iterable[DeviceKey]
) -> dict[DeviceKey, tuple[str, ClaimDevice, tuple[str, ...]]]:
    """Each of `keys` a pod holds: (the first claim giving it, the device, every container
    ("ns/pod/container") holding it, whichever claim gave it). The inventory's tally knows the
    holders; only the first holder's pod is looked at (a binary search), never every pod."""
    out: dict[DeviceKey, tuple[str, ClaimDevice, tuple[str, ...]]] = {}
    claim_holders = inventory.tally.claim_holders
    for key in keys:
        entry = claim_holders.get(key)
        if entry is None:
            continue
        names = entry[0]
        for holder in sorted(names, key=lambda h: tuple(h.split("/", 2))):  # in the pods' order
            found = _claim_giving(inventory, holder, key)
            if found is not None:
                out[key] = (*found, names)
                break
    return out


def _claim_giving(inventory: Inventory, holder: str, key: DeviceKey) -> tuple[str, ClaimDevice] | None:
    namespace, name, container = holder.split("/", 2)
    pod = inventory.pod(namespace, name)
    for c in pod.containers if pod is not None else ():
        if c.name == container:
            for claim in c.claims:
                for d in claim.devices:
                    if (d.driver, d.pool, d.device) == key:
                        return claim.name, d
    return None


def claim_device_of(held: Pod | None, pod: PodMeta, v: DeviceVerdict) -> tuple[str, ClaimDevice] | None:
    """(ResourceClaim name, device) of verdict `v`, from what pod-resources shows of the pod.

    The verdict names the pod's own claim entry ("claim:gpu"), not the ResourceClaim object. The
    object's name is in the pod's status (resourceClaimStatuses) for a claim made from a template,
    but a real kubelet's Pods API serves its own status, which never carries that field (the
    status manager leaves it to the controller that owns it). So when the pod does not say, the
    verdict's device id is looked up among the claims pod-resources lists for that container:
    the id is the device's CDI id (else driver/pool/device), the same in both answers."""
    if held is None:
        return None
    pod_claim, _ = v.claim
    claim = pod.claim_object(pod_claim)
    found: list[tuple[str, ClaimDevice]] = []
    for container in held.containers:
        if claim is None and container.name != v.container:
            continue
        for c in container.claims:
            if c.namespace != pod.namespace or (claim is not None and c.name != claim):
                continue
            found.extend((c.name, d) for d in c.devices if resource_id_of(d) == v.resource_id)
    # Never guessed: one CDI id given to several devices (a driver's id per claim, not per device)
    # leaves the verdict unresolved. One device in several claims (shared) is that device, named
    # by the first claim.
    if len({(d.driver, d.pool, d.device) for _, d in found}) != 1:
        return None
    return min(found, key=lambda f: f[0])


def claim_object_of(held: Pod | None, pod: PodMeta, v: DeviceVerdict) -> str | None:
    """The ResourceClaim a DRA verdict is about (None: not a claim's, or not known): named by the
    pod's status where it says (a real kubelet's never does), else found by the device's id."""
    if not v.is_claim:
        return None
    found = claim_device_of(held, pod, v)
    return found[0] if found is not None else pod.claim_object(v.claim[0])
