"""What a kubelet shows after a step, in forms two kubelets can be compared by.

The wire: `List` and `GetAllocatableResources` decoded by the agent's own `Decoder` into its
`Inventory` (order and entry splitting gone, as the agent sees them). The files: which of those
the agent watches (the checkpoint, the manager state files, the sockets in `device-plugins/`
and `pod-resources/`) were created, replaced or deleted. The events: kind, severity and the
details that name things (device, resource, pod, container, devices), not times or ids.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from watcher.kubelet.decoding import Decoder
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.events import Event
from watcher.model.inventory import Inventory

__all__ = [
    "FileMarks",
    "SERVICE",
    "call",
    "event_digest",
    "file_changes",
    "file_marks",
    "inventory",
    "pod_digest",
]

SERVICE = "/v1.PodResourcesLister/"
# Directories under the kubelet's root the agent watches, and the names it watches there.
_WATCHED: dict[str, Callable[[str], bool]] = {
    "device-plugins": lambda n: n == "kubelet_internal_checkpoint" or n.endswith(".sock"),
    "": lambda n: n in ("cpu_manager_state", "memory_manager_state", "dra_manager_state"),
    "pod-resources": lambda n: n == "kubelet.sock",
}
# Event details that say what changed; the rest (times, counts of cycles, uids) may differ.
_NAMING = ("resource", "device", "numa", "namespace", "pod", "container", "devices", "allocated_to")

# relative path -> (inode, mtime_ns, mode)
FileMarks = dict[str, tuple[int, int, int]]


async def call(socket: Path, method: str, request: bytes = b"") -> bytes:
    """One pod-resources v1 call on a fresh channel; raw answer bytes."""
    async with aio.insecure_channel(f"unix:{socket}") as channel:
        unary: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + method)
        return bytes(await unary(request, timeout=5))


async def _patient_call(socket: Path, method: str) -> bytes:
    # An agent under test shares the kubelet's limiter (burst 10, 100 a second): a rejection
    # here is its load, not an answer; a token comes back within 10 ms.
    for _ in range(50):
        try:
            return await call(socket, method)
        except aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        await asyncio.sleep(0.02)
    return await call(socket, method)


async def inventory(socket: Path) -> Inventory:
    """Both answers as the agent decodes them (retried past the rate limiter)."""
    alloc = await _patient_call(socket, "GetAllocatableResources")
    listed = await _patient_call(socket, "List")
    return Decoder().decode(alloc, listed)[0]


def file_marks(root: Path) -> FileMarks:
    """Each watched file's identity now: a rewrite by rename gives a new inode or time."""
    marks: FileMarks = {}
    for sub, match in _WATCHED.items():
        directory = root / sub if sub else root
        if not directory.is_dir():
            continue
        for entry in os.scandir(directory):
            if match(entry.name):
                st = entry.stat(follow_symlinks=False)
                marks[f"{sub}/{entry.name}" if sub else entry.name] = (
                    st.st_ino,
                    st.st_mtime_ns,
                    stat.S_IMODE(st.st_mode),
                )
    return marks


def file_changes(before: FileMarks, after: FileMarks) -> dict[str, str]:
    """Watched file -> "created", "replaced" or "deleted" between two marks."""
    out: dict[str, str] = {}
    for name in before.keys() | after.keys():
        if name not in after:
            out[name] = "deleted"
        elif name not in before:
            out[name] = "created"
        elif before[name][:2] != after[name][:2]:
            out[name] = "replaced"
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def event_digest(events: Iterable[Event]) -> list[tuple[str, str, dict[str, Any]]]:
    """Each event's kind, severity and naming details, in order."""
    return [
        (
            str(e.kind),
            str(e.severity),
            {k: _plain(e.details[k]) for k in _NAMING if k in e.details},
        )
        for e in events
    ]


def pod_digest(pod: api_pb2.PodResources) -> tuple[str, str, dict[str, Any]]:
    """One pod of `Get` (or `List`) with every order and entry split gone: per container its
    devices as (resource, id, NUMA nodes), its CPUs and memory."""
    containers: dict[str, Any] = {}
    for c in pod.containers:
        devices: dict[tuple[str, str], set[int]] = {}
        for entry in c.devices:
            for device in entry.device_ids:
                devices.setdefault((entry.resource_name, device), set()).update(
                    n.ID for n in entry.topology.nodes
                )
        containers[c.name] = {
            "devices": sorted((r, d, tuple(sorted(n))) for (r, d), n in devices.items()),
            "cpu_ids": sorted(c.cpu_ids),
            "memory": sorted((m.memory_type, m.size) for m in c.memory),
            "claims": len(c.dynamic_resources),
        }
    return pod.namespace, pod.name, containers
