"""Who holds a DRA device, read from an inventory: the claim giving it, the device as the claim
shows it, and every container holding it. Pure.

The inventory's tally keeps each DRA device's holders, carried from one inventory to the next; so
a health look asks about the few devices it needs and reads only their first holder's pod (a binary
search), never every pod of the node.
"""

from __future__ import annotations

from collections.abc import Iterable

from watcher.model.inventory import Inventory
from watcher.model.records import ClaimDevice

__all__ = ["DeviceKey", "held_dra_devices"]

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


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
