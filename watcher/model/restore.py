"""An Inventory and its parts back from the canonical JSON form (the saved state). Pure.

What `Inventory.canonical` and the saved state's rows hold is read back strictly: any other
format or shape is a ValueError, and the values read are shared as the kubelet's are
(`watcher.model.sharing`), so a restored model is no larger than a freshly built one.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from watcher.model.inventory import FORMAT, Inventory
from watcher.model.records import Claim, ClaimDevice, Container, Device, Memory, Pod
from watcher.model.sharing import shared, shared_device, shared_ids, shared_memory

__all__ = [
    "FORMATS_READ",
    "from_canonical",
    "allocatable_from_canonical",
    "pod_from_canonical",
    "pod_from_json",
]

# Canonical forms `from_canonical` reads: 2 has the same shape as 3 (only the hash differs).
FORMATS_READ = (2, FORMAT)


def _ints(values: Iterable[Any]) -> list[int]:
    # JSON from disk: only ints may reach the shared values (a `true` would stand for 1 there).
    return [int(v) for v in values]


def _devices_from(data: Mapping[str, Mapping[str, Sequence[int]]]) -> tuple[Device, ...]:
    return tuple(
        shared_device(res, dev_id, _ints(data[res][dev_id]))
        for res in sorted(data)
        for dev_id in sorted(data[res])
    )


def _memory_from(data: Sequence[Mapping[str, Any]]) -> tuple[Memory, ...]:
    if not data:
        return ()
    return shared(tuple(shared_memory(str(m["type"]), _ints(m["numa"]), int(m["size"])) for m in data))


def _malformed(err: Exception) -> ValueError:
    return ValueError(f"malformed inventory: {err!r}")


def pod_from_canonical(p: Mapping[str, Any]) -> Pod:
    """One pod from its canonical JSON form (`pod_json`). Raises ValueError on another shape."""
    try:
        return Pod(
            namespace=sys.intern(p["namespace"]),
            name=p["name"],
            cpu_ids=shared_ids(_ints(p["cpu_ids"])),
            memory=_memory_from(p["memory"]),
            containers=tuple(
                shared(
                    Container(
                        name=sys.intern(c["name"]),
                        devices=_devices_from(c["devices"]),
                        cpu_ids=shared_ids(_ints(c["cpu_ids"])),
                        memory=_memory_from(c["memory"]),
                        claims=tuple(
                            Claim(
                                cl["namespace"],
                                cl["name"],
                                tuple(
                                    ClaimDevice(
                                        d["driver"],
                                        d["pool"],
                                        d["device"],
                                        tuple(d["cdi_devices"]),
                                        d["share_id"],
                                    )
                                    for d in cl["devices"]
                                ),
                            )
                            for cl in c["dynamic_resources"]
                        ),
                    )
                )
                for c in p["containers"]
            ),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise _malformed(err) from err


def pod_from_json(body: bytes) -> Pod:
    """One pod from the compact JSON `Pod.canonical_bytes` made of it (as the saved state keeps
    it), its digest taken from `body` as it is: nothing is serialised again. Were `body` not
    those exact bytes, the digest, and any inventory hash made of it, would not match the ones
    recorded when it was written. Raises ValueError on another shape."""
    pod = pod_from_canonical(json.loads(body))
    object.__setattr__(pod, "_digest", hashlib.sha256(body).digest())
    return pod


def allocatable_from_canonical(
    data: Mapping[str, Any],
) -> tuple[tuple[Device, ...], tuple[int, ...], tuple[Memory, ...], bool]:
    """The allocatable side from the canonical form without its pods (`{"format", "allocatable"}`,
    as `Inventory.allocatable_bytes`): devices, CPU ids, memory, and whether it is known."""
    if not isinstance(data, Mapping):
        raise ValueError(f"malformed inventory: expected an object, got {type(data).__name__}")
    if data.get("format") not in FORMATS_READ:
        raise ValueError(f"unsupported inventory format {data.get('format')!r}, expected {FORMAT}")
    try:
        alloc = data["allocatable"]
        return (
            _devices_from(alloc["devices"]),
            shared_ids(_ints(alloc["cpu_ids"])),
            _memory_from(alloc["memory"]),
            bool(alloc["known"]),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise _malformed(err) from err


def from_canonical(data: Mapping[str, Any]) -> Inventory:
    """Rebuild an Inventory from `Inventory.canonical` (e.g. loaded from the state file).

    Raises ValueError on any other format or shape.
    """
    devices, cpu_ids, memory, known = allocatable_from_canonical(data)
    try:
        pods = tuple(pod_from_canonical(p) for p in data["pods"])
    except (KeyError, TypeError) as err:
        raise _malformed(err) from err
    return Inventory(devices=devices, cpu_ids=cpu_ids, memory=memory, pods=pods, allocatable_known=known)
