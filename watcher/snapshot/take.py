"""One-shot snapshot: query both RPCs, build the inventory, render it for people or machines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from watcher import errors
from watcher.kubelet.client import PodResourcesClient
from watcher.kubelet.repair import repair_answers
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.inventory import Inventory
from watcher.model.records import Memory
from watcher.model.wording import cpuset_string, printable
from watcher.snapshot.common import format_bytes, patiently, table
from watcher.snapshot.pods import PodsView, format_pods_json, format_pods_table

__all__ = ["Snapshot", "format_json", "format_table", "take_snapshot"]

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Snapshot:
    inventory: Inventory
    # Why allocatable is unknown (method disabled or absent); None when it is known.
    degraded: str | None = None
    # What the Pods API said (watcher.snapshot.pods); None: it was not asked.
    pods: PodsView | None = None


def _list(raw: bytes, socket: str) -> api_pb2.ListPodResourcesResponse:
    return _parse(api_pb2.ListPodResourcesResponse, raw, "List", socket, lambda r: repair_answers(None, r)[1])


def _allocatable(raw: bytes, socket: str) -> api_pb2.AllocatableResourcesResponse:
    # With an empty List answer (a valid one) beside it: only the allocatable side is repaired.
    return _parse(
        api_pb2.AllocatableResourcesResponse,
        raw,
        "GetAllocatableResources",
        socket,
        lambda r: repair_answers(r, b"")[0] or b"",
    )


def _parse(message: type[M], raw: bytes, method: str, socket: str, repair: Callable[[bytes], bytes]) -> M:
    """`raw` as `message`; a string that is not UTF-8 repaired as the agent repairs it (each bad
    byte escaped, docs/kubelet.md); bytes that are not protobuf at all an UnexpectedKubeletError."""
    try:
        return message.FromString(raw)
    except DecodeError:
        pass
    try:
        return message.FromString(repair(raw))
    except DecodeError as err:
        raise errors.UnexpectedKubeletError(
            f"{method}'s answer on {socket} is not protobuf ({err}): the kubelet is broken, "
            "or the socket is not a kubelet's",
            socket=socket,
            method=method,
        ) from err


async def take_snapshot(client: PodResourcesClient) -> Snapshot:
    """Query GetAllocatableResources and List; fall back to List-only if the former is unavailable
    or its answer is not protobuf. A List answer that is not protobuf is one UnexpectedKubeletError."""
    socket = client.socket_path
    alloc_task = asyncio.ensure_future(patiently(client.allocatable_raw))
    try:
        pods = _list(await patiently(client.list_raw), socket)
    except BaseException:
        alloc_task.cancel()
        await asyncio.gather(alloc_task, return_exceptions=True)
        raise
    degraded: str | None = None
    allocatable: api_pb2.AllocatableResourcesResponse | None = None
    try:
        raw = await alloc_task
    except (errors.MethodDisabledError, errors.MethodNotImplementedError) as err:
        degraded = str(err)
    else:
        try:
            allocatable = _allocatable(raw, socket)
        except errors.UnexpectedKubeletError as err:
            # What List said still stands: allocations only, as for a disabled method.
            degraded = str(err)
    return Snapshot(build(allocatable, pods), degraded)


def _num(value: int | None) -> str:
    return "?" if value is None else str(value)


def _numa(nodes: tuple[int, ...] | int | None) -> str:
    if nodes is None or nodes == ():
        return "-"
    if isinstance(nodes, int):
        return str(nodes)
    return ",".join(str(n) for n in nodes)


def _holdings(cpu_ids: tuple[int, ...], memory: tuple[Memory, ...], prefix: str = "") -> str:
    parts = []
    if cpu_ids:
        parts.append(f"{prefix}cpus {cpuset_string(cpu_ids)}")
    if memory:
        parts.append(
            f"{prefix}memory "
            + ", ".join(f"{m.type} {format_bytes(m.size)} on numa {_numa(m.numa)}" for m in memory)
        )
    return ("  " + "; ".join(parts)) if parts else ""


def format_table(snap: Snapshot) -> str:
    inv = snap.inventory
    out: list[str] = [f"inventory {inv.content_hash}"]
    if snap.degraded:
        out.append(f"note: allocatable unknown, showing allocations only: {snap.degraded}")

    out += ["", "DEVICES"]
    rows: list[list[str]] = []
    for cap in inv.capacity:
        rows.append([cap.resource, "all", _num(cap.allocatable), str(cap.allocated), _num(cap.free)])
        if len(cap.per_numa) > 1 or (cap.per_numa and cap.per_numa[0].numa is not None):
            for n in cap.per_numa:
                rows.append(["", _numa(n.numa), _num(n.allocatable), str(n.allocated), _num(n.free)])
    out += table(["RESOURCE", "NUMA", "ALLOCATABLE", "ALLOCATED", "FREE"], rows) if rows else ["(none)"]

    if inv.missing_devices:
        out += ["", "ALLOCATED BUT NOT ALLOCATABLE (failed or vanished while in use)"]
        out += table(
            ["RESOURCE", "DEVICE", "NUMA", "HELD BY"],
            [[m.resource, m.id, _numa(m.numa), ", ".join(m.holders)] for m in inv.missing_devices],
        )

    cpus = inv.cpus
    out += ["", "CPUS"]
    out += table(
        ["ALLOCATABLE", "ALLOCATED", "FREE", "ALLOCATABLE IDS"],
        [[_num(cpus.allocatable), str(cpus.allocated), _num(cpus.free), cpuset_string(inv.cpu_ids) or "-"]],
    )

    out += ["", "MEMORY"]
    mem_rows = [
        [
            m.type,
            _numa(m.numa),
            "?" if m.allocatable is None else format_bytes(m.allocatable),
            format_bytes(m.allocated),
            "?" if m.free is None else format_bytes(m.free),
        ]
        for m in inv.memory_capacity
    ]
    out += table(["TYPE", "NUMA", "ALLOCATABLE", "ALLOCATED", "FREE"], mem_rows) if mem_rows else ["(none)"]

    out += ["", "PODS (exclusive holdings)"]
    if not inv.pods:
        out.append("(none)")
    for pod in inv.pods:
        out.append(pod.key + _holdings(pod.cpu_ids, pod.memory, "pod-level "))
        for c in pod.containers:
            out.append(f"  {c.name}" + (_holdings(c.cpu_ids, c.memory) or "  -"))
            held: dict[str, list[str]] = {}
            for d in c.devices:
                held.setdefault(d.resource, []).append(d.id)
            out += [f"    {res}: {', '.join(ids)}" for res, ids in held.items()]
            for cl in c.claims:
                devices = ", ".join(
                    f"{d.driver}/{d.pool}/{d.device}" + (f" (share {d.share_id})" if d.share_id else "")
                    for d in cl.devices
                )
                out.append(f"    claim {cl.namespace}/{cl.name}: {devices}")
    if snap.pods is not None:
        out += format_pods_table(snap.pods, snap.inventory)
    # Each item is one line: names chosen by plugins and users cannot add lines or colours.
    return "\n".join(printable(line) for line in out)


def format_json(snap: Snapshot) -> str:
    inv = snap.inventory
    doc: dict[str, Any] = {
        "hash": inv.content_hash,
        "degraded": snap.degraded,
        "inventory": inv.canonical,
        "derived": inv.derived(),
    }
    if snap.pods is not None:
        doc["pods_api"] = format_pods_json(snap.pods, snap.inventory)
    return json.dumps(doc, indent=2, sort_keys=True)
