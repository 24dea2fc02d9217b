"""The files the kubelet keeps about its allocations, as the fake node would have them.

`device-plugins/kubelet_internal_checkpoint`, `cpu_manager_state`,
`memory_manager_state` and `dra_manager_state`, each rewritten whole (temp file + rename)
as the kubelet does, so a directory watch sees a new file every time one is written.

The DRA manager's checkpoint is rewritten whenever a pod starts (its sandbox is made: the
manager prepares the pod's claims) and whenever one ends (its containers gone: it unprepares
them), claims or not: upstream (1.37.2, `cm/dra/manager.go`) stores it on every prepare and
unprepare, so on a real node every pod's start and end rewrites it.
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
import zlib
from pathlib import Path
from typing import Any

from watcher.model.wording import cpuset_string
from watcher.sim.fake_node import FakeNode

__all__ = ["write_dra_state", "write_state_files"]

# The DRA manager's checkpoint, as `pkg/kubelet/cm/dra/state` writes it.
_DRA_KIND, _DRA_API_VERSION = "DRACheckpoint", "checkpoint.dra.kubelet.k8s.io/v1"


def write_state_files(
    node: FakeNode,
    checkpoint_path: Path,
    cpu_state_path: Path,
    memory_state_path: Path,
    *,
    checkpoint: bool = True,
) -> None:
    """Rewrite the files the way the kubelet does: the device manager's checkpoint whenever it
    writes one (`checkpoint`), each manager's state file only when that manager's state changed
    (the CPU and memory managers take no part in a device's health or a plugin's return)."""
    entries = []
    cpu_entries: dict[str, dict[str, str]] = {}
    memory_entries: dict[str, dict[str, list[dict[str, Any]]]] = {}
    allocated_cpus: set[int] = set()
    for pod in node.pods.values():
        for c in pod.containers:
            for resource, ids in c.devices.items():
                by_numa: dict[str, list[str]] = {}
                for dev_id in ids:
                    for n in node.device_numa(resource, dev_id) or (-1,):
                        by_numa.setdefault(str(n), []).append(dev_id)
                entries.append(
                    {
                        "PodUID": pod.uid,
                        "ContainerName": c.name,
                        "ResourceName": resource,
                        "DeviceIDs": by_numa,
                        "AllocResp": "",
                    }
                )
            if c.cpu_ids:
                cpu_entries.setdefault(pod.uid, {})[c.name] = cpuset_string(c.cpu_ids)
                allocated_cpus.update(c.cpu_ids)
            if c.memory:
                memory_entries.setdefault(pod.uid, {})[c.name] = [
                    {"numaAffinity": list(m.numa), "type": m.type, "size": m.size} for m in c.memory
                ]
    registered: dict[str, list[str]] = {}
    for dev in node.devices.values():
        if dev.healthy:
            registered.setdefault(dev.resource, []).append(dev.id)
    data = {"PodDeviceEntries": entries, "RegisteredDevices": registered}
    body = json.dumps(data, sort_keys=True).encode()
    written = {"Data": data, "Checksum": zlib.crc32(body)}
    if checkpoint:
        # Compact, as Go's encoding/json writes it; the checksum is ours, not upstream's.
        _write_atomically(checkpoint_path, json.dumps(written, separators=(",", ":")).encode())
    cpu_state = {
        "policyName": "static",
        "defaultCpuSet": cpuset_string(node.cpu_ids - allocated_cpus),
        "entries": cpu_entries,
    }
    _write_if_changed(cpu_state_path, json.dumps(cpu_state).encode())
    memory_state = {"policyName": "Static", "entries": memory_entries}
    _write_if_changed(memory_state_path, json.dumps(memory_state).encode())


def write_dra_state(node: FakeNode, path: Path) -> None:
    """The DRA manager's checkpoint: each prepared claim, the pods using it and its devices. Its
    checksum is upstream's (CRC-32 of the Data string), so the kubelet would read it back."""
    claims: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in node.pods.values():
        for c in pod.containers:
            for claim in c.claims:
                key = (claim.namespace, claim.name)
                state = claims.setdefault(
                    key,
                    {
                        "ClaimUID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"claim/{key[0]}/{key[1]}")),
                        "ClaimName": claim.name,
                        "Namespace": claim.namespace,
                        "PodUIDs": {},
                        "DriverState": {},
                    },
                )
                state["PodUIDs"][pod.uid] = {}
                for d in claim.devices:
                    devices = state["DriverState"].setdefault(d.driver, {"Devices": []})["Devices"]
                    entry = {
                        "PoolName": d.pool,
                        "DeviceName": d.device,
                        "ShareID": d.share_id,
                        "RequestNames": [claim.request] if claim.request else None,
                        "CDIDeviceIDs": list(d.cdi_devices) or None,
                    }
                    if entry not in devices:
                        devices.append(entry)
    data = {"kind": _DRA_KIND, "apiVersion": _DRA_API_VERSION, "ClaimInfoStateList": list(claims.values())}
    text = json.dumps(data, separators=(",", ":"))
    _write_atomically(path, json.dumps({"Data": text, "Checksum": zlib.crc32(text.encode())}).encode())


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    _write_atomically(path, data)


def _write_atomically(path: Path, data: bytes) -> None:
    # The kubelet's file store writes a temporary "." + digits (os.CreateTemp(dir, "."), so mode
    # 0600) beside the file and renames it over the file.
    tmp = path.with_name(f".{secrets.randbelow(2**32)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
