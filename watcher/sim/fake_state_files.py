"""The files the kubelet keeps about its allocations, as the fake node would have them.

`device-plugins/kubelet_internal_checkpoint`, `cpu_manager_state` and
`memory_manager_state`, each rewritten whole (temp file + rename) as the
kubelet does, so a directory watch sees a new file every time.
"""

from __future__ import annotations

import json
import os
import secrets
import zlib
from pathlib import Path
from typing import Any

from watcher.model.wording import cpuset_string
from watcher.sim.fake_node import FakeNode

__all__ = ["write_state_files"]


def write_state_files(
    node: FakeNode, checkpoint_path: Path, cpu_state_path: Path, memory_state_path: Path
) -> None:
    """Rewrite the checkpoint and manager state files the way the kubelet does."""
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
    checkpoint = {"Data": data, "Checksum": zlib.crc32(body)}
    _write_atomically(checkpoint_path, json.dumps(checkpoint).encode())
    cpu_state = {
        "policyName": "static",
        "defaultCpuSet": cpuset_string(node.cpu_ids - allocated_cpus),
        "entries": cpu_entries,
    }
    _write_atomically(cpu_state_path, json.dumps(cpu_state).encode())
    memory_state = {"policyName": "Static", "entries": memory_entries}
    _write_atomically(memory_state_path, json.dumps(memory_state).encode())


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
