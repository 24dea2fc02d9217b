"""`snapshot --output html`: one self-contained page that draws the node. A pure function of a snapshot.

NUMA nodes are boxes holding their devices and memory; each device, CPU and memory block is coloured
by its state and labelled with the pod and container holding it. The page needs nothing else: inline
CSS, no script, no external resource, and a Content-Security-Policy that forbids both, so a name that
got past the escaping still could neither run nor fetch anything.

Device ids and pod, container and resource names are chosen by device plugins and users: every one
goes through `printable` (controls, bidi, zero-width and tag characters and combining marks escaped,
so none can reorder or overdraw what is shown, nor make a look-alike of another tile),
is cut to a bounded length, then HTML-escaped (quotes too: they also land in attributes).
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

from watcher.model.devicehealth.holders import claim_object_of
from watcher.model.devicehealth.pods import DeviceVerdict, PodMeta
from watcher.model.inventory import Inventory
from watcher.model.records import NumaNodes, Pod
from watcher.model.wording import cpuset_string, printable
from watcher.snapshot.common import format_bytes
from watcher.snapshot.take import Snapshot

__all__ = ["STATE_COLOURS", "MAX_LABEL", "render_html"]

# free: allocatable and held by no pod; allocated: held and allocatable; failed: held by a pod
# but absent from allocatable (failed or vanished while in use). Solid fills, so they can be told
# apart on a screen and counted in a screenshot.
STATE_COLOURS = {"free": "#2e7d32", "allocated": "#1565c0", "failed": "#c62828"}
STATE_WORDS = {
    "free": "free",
    "allocated": "allocated to a pod",
    "failed": "failed while allocated (held by a pod, absent from allocatable)",
}
# Longest name shown, in characters after escaping controls: one hostile name cannot swamp the page.
MAX_LABEL = 64
# Holders named on one device before "+N more" (a device is normally held by one container).
MAX_HOLDERS = 3

# (pod "namespace/name", container; "(pod)" for pod-level CPUs and memory)
Holder = tuple[str, str]

_CSS = """
body{font:13px/1.35 system-ui,sans-serif;margin:16px;color:#212121;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}
.hash{font-family:monospace;color:#555;word-break:break-all}
.note{background:#fff3e0;border:1px solid #ef6c00;padding:6px 8px;margin:8px 0}
.legend{display:flex;gap:16px;margin:10px 0;flex-wrap:wrap}
.legend span{display:inline-flex;align-items:center;gap:6px}
.sw{display:inline-block;width:14px;height:14px;border-radius:2px}
.numas{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.numa{border:2px solid #424242;border-radius:6px;padding:8px;background:#fff;max-width:960px}
.numa h2,.cpus h2,.totals h2{font-size:15px;margin:0 0 6px}
.figures{color:#444;margin:0 0 6px;padding-left:16px}
.res h3{font-size:13px;margin:8px 0 4px;font-family:monospace}
.tiles{display:flex;flex-wrap:wrap;gap:6px}
.dev{width:210px;min-height:56px;padding:4px 6px;border-radius:4px;color:#fff;box-sizing:border-box;
overflow:hidden}
.dev .id{font-family:monospace;font-size:11px;word-break:break-all}
.pod,.ctr{display:block;unicode-bidi:isolate;word-break:break-all}
.ctr{opacity:.85}
.mem{margin:6px 0}
.bar{display:flex;height:22px;width:420px;border:1px solid #424242;background:#fff}
.seg{height:100%;box-sizing:border-box;border-right:1px solid #fff;overflow:hidden;color:#fff;
font-size:11px;white-space:nowrap}
.cpus,.totals{border:2px solid #424242;border-radius:6px;padding:8px;background:#fff;margin-top:12px}
.grid{display:grid;grid-template-columns:repeat(16,44px);gap:3px}
.cpu{height:22px;border-radius:3px;color:#fff;font-size:11px;text-align:center;line-height:22px}
.who{list-style:none;padding:0;margin:8px 0 0}
.who li{margin:2px 0}
table{border-collapse:collapse}
td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}
"""
_CSS += "".join(f".s-{state}{{background:{colour}}}\n" for state, colour in STATE_COLOURS.items())
_CSS += ".health td.s-failed,.health td.s-unknown{color:#fff}.s-unknown{background:#757575}\n"


def _text(value: str, limit: int = MAX_LABEL) -> str:
    """`value` safe in HTML text and in a quoted attribute, at most `limit` characters shown."""
    shown = printable(value)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=True)


def _numa_title(numa: NumaNodes) -> str:
    if not numa:
        return "No NUMA node"
    if len(numa) == 1:
        return f"NUMA node {numa[0]}"
    return "NUMA nodes " + ", ".join(str(n) for n in numa) + " (counted on each)"


def _place_key(numa: NumaNodes) -> tuple[int, int, NumaNodes]:
    # Single nodes first in order, then devices spanning several, then those without topology.
    return (0 if len(numa) == 1 else 1 if numa else 2, numa[0] if numa else 0, numa)


def _holder_html(holders: list[Holder]) -> str:
    out = [
        f'<span class="pod" data-pod="{_text(pod)}">{_text(pod)}</span>'
        f'<span class="ctr" data-container="{_text(ctr)}">{_text(ctr)}</span>'
        for pod, ctr in holders[:MAX_HOLDERS]
    ]
    if len(holders) > MAX_HOLDERS:
        out.append(f'<span class="ctr">+{len(holders) - MAX_HOLDERS} more</span>')
    return "".join(out)


def _title(holders: list[Holder]) -> str:
    return "; ".join(f"{_text(pod)} {_text(ctr)}" for pod, ctr in holders[:MAX_HOLDERS])


@dataclass(frozen=True)
class _Tile:
    resource: str
    id: str
    state: str
    holders: list[Holder]


def _device_tiles(inv: Inventory) -> dict[NumaNodes, list[_Tile]]:
    """Every device, allocatable or held, by the NUMA nodes it is on."""
    holders: dict[tuple[str, str], list[Holder]] = defaultdict(list)
    for pod in inv.pods:
        for c in pod.containers:
            for d in c.devices:
                holders[(d.resource, d.id)].append((pod.key, c.name))
    missing = {(m.resource, m.id) for m in inv.missing_devices}
    places: dict[NumaNodes, list[_Tile]] = defaultdict(list)
    for d in inv.devices:
        held = holders.get((d.resource, d.id), [])
        places[d.numa].append(_Tile(d.resource, d.id, "allocated" if held else "free", held))
    allocatable = {(d.resource, d.id) for d in inv.devices}
    for (res, dev_id), (_, numa) in sorted(inv.holders.items()):
        if (res, dev_id) in allocatable:
            continue
        # Absent from allocatable: failed while in use, unless allocatable is unknown altogether.
        state = "failed" if (res, dev_id) in missing else "allocated"
        places[numa].append(_Tile(res, dev_id, state, holders[(res, dev_id)]))
    return places


def _tile_html(tile: _Tile, numa: NumaNodes) -> str:
    numa_attr = ",".join(str(n) for n in numa)
    label = _holder_html(tile.holders) if tile.holders else '<span class="ctr">free</span>'
    return (
        f'<div class="dev s-{tile.state}" data-device="{_text(tile.id)}"'
        f' data-resource="{_text(tile.resource)}" data-state="{tile.state}" data-numa="{numa_attr}"'
        f' title="{_text(tile.id)}: {STATE_WORDS[tile.state]}">'
        f'<span class="id">{_text(tile.id)}</span>{label}</div>'
    )


def _memory_holders(pods: tuple[Pod, ...]) -> dict[tuple[str, NumaNodes], list[tuple[Holder, int]]]:
    """Bytes per holder of each (type, NUMA nodes), adding up to what `count_memory` counts: a pod's
    own (pod-level) value overlaps its containers', so only what it has beyond them is its own."""
    out: dict[tuple[str, NumaNodes], list[tuple[Holder, int]]] = defaultdict(list)
    for pod in pods:
        by_key: dict[tuple[str, NumaNodes], int] = defaultdict(int)
        for c in pod.containers:
            for m in c.memory:
                out[(m.type, m.numa)].append(((pod.key, c.name), m.size))
                by_key[(m.type, m.numa)] += m.size
        for m in pod.memory:
            extra = m.size - by_key.get((m.type, m.numa), 0)
            if extra > 0:
                out[(m.type, m.numa)].append(((pod.key, "(pod)"), extra))
    return out


def _memory_html(inv: Inventory) -> dict[NumaNodes, list[str]]:
    held = _memory_holders(inv.pods)
    places: dict[NumaNodes, list[str]] = defaultdict(list)
    for m in inv.memory_capacity:
        total = max(m.allocatable or 0, m.allocated, 1)
        segs = []
        for (pod, ctr), size in held.get((m.type, m.numa), []):
            width = 100.0 * size / total
            segs.append(
                f'<div class="seg s-allocated" style="width:{width:.3f}%" data-pod="{_text(pod)}"'
                f' data-container="{_text(ctr)}" title="{_text(pod)} {_text(ctr)}: {format_bytes(size)}">'
                f"{_text(pod)} {_text(ctr)}</div>"
            )
        if m.free:
            segs.append(f'<div class="seg s-free" style="width:{100.0 * m.free / total:.3f}%"></div>')
        over = m.allocatable is not None and m.allocated > m.allocatable
        figures = (
            f"{format_bytes(m.allocated)} allocated"
            + ("" if m.allocatable is None else f" of {format_bytes(m.allocatable)}")
            + ("" if m.free is None else f", {format_bytes(m.free)} free")
            + (", more allocated than allocatable" if over else "")
        )
        places[m.numa].append(
            f'<div class="mem" data-memory="{_text(m.type)}" data-state="{"failed" if over else "ok"}">'
            f"<div>{_text(m.type)}: {figures}</div>"
            f'<div class="bar">{"".join(segs)}</div></div>'
        )
    return places


def _figures_html(inv: Inventory, numa: NumaNodes) -> str:
    """This NUMA node's device counts per resource, from the inventory's capacity figures."""
    if len(numa) > 1:
        return ""
    node = numa[0] if numa else None
    lines = []
    for cap in inv.capacity:
        for n in cap.per_numa:
            if n.numa == node:
                known = "" if n.allocatable is None else f"{n.allocatable} allocatable, "
                free = "" if n.free is None else f", {n.free} free"
                lines.append(f"<li>{_text(cap.resource)}: {known}{n.allocated} allocated{free}</li>")
    return f'<ul class="figures">{"".join(lines)}</ul>' if lines else ""


def _cpus_html(inv: Inventory) -> str:
    holders: dict[int, list[Holder]] = defaultdict(list)
    for pod in inv.pods:
        in_containers: set[int] = set()
        for c in pod.containers:
            for cpu in c.cpu_ids:
                holders[cpu].append((pod.key, c.name))
            in_containers.update(c.cpu_ids)
        for cpu in set(pod.cpu_ids) - in_containers:
            holders[cpu].append((pod.key, "(pod)"))
    allocatable = set(inv.cpu_ids)
    cells = []
    for cpu in sorted(allocatable | set(holders)):
        who = holders.get(cpu, [])
        if not who:
            state = "free"
        elif cpu in allocatable or not inv.allocatable_known:
            state = "allocated"
        else:
            state = "failed"
        pods = " ".join(sorted({pod for pod, _ in who}))
        pod_attr = f' data-pod="{_text(pods)}"' if who else ""
        title = f"CPU {cpu}: {STATE_WORDS[state]}" + (f" ({_title(who)})" if who else "")
        cells.append(
            f'<div class="cpu s-{state}" data-cpu="{cpu}" data-state="{state}"{pod_attr}'
            f' title="{title}">{cpu}</div>'
        )
    by_holder: dict[Holder, list[int]] = defaultdict(list)
    for cpu, who in holders.items():
        for h in who:
            by_holder[h].append(cpu)
    listed = "".join(
        f'<li><span class="sw s-allocated"></span> cpus {cpuset_string(cpus)}: '
        f'<span data-pod="{_text(pod)}">{_text(pod)}</span> '
        f'<span data-container="{_text(ctr)}">{_text(ctr)}</span></li>'
        for (pod, ctr), cpus in sorted(by_holder.items())
    )
    cap = inv.cpus
    figures = (
        f"{'?' if cap.allocatable is None else cap.allocatable} allocatable, {cap.allocated} allocated, "
        f"{'?' if cap.free is None else cap.free} free"
    )
    return (
        '<section class="cpus"><h2>CPUs</h2>'
        f"<p>{figures}. The kubelet does not say which NUMA node a CPU is on, "
        "so they are drawn for the whole node.</p>"
        f'<div class="grid">{"".join(cells)}</div><ul class="who">{listed}</ul></section>'
    )


def _totals_html(inv: Inventory) -> str:
    rows = "".join(
        f"<tr><td>{_text(c.resource)}</td><td>{'?' if c.allocatable is None else c.allocatable}</td>"
        f"<td>{c.allocated}</td><td>{'?' if c.free is None else c.free}</td><td>{c.unavailable}</td></tr>"
        for c in inv.capacity
    )
    return (
        '<section class="totals"><h2>Devices per resource</h2><table><tr><th>resource</th>'
        "<th>allocatable</th><th>allocated</th><th>free</th><th>failed while allocated</th></tr>"
        f"{rows}</table></section>"
    )


# A DRA device's id in a verdict is its CDI id, which drivers make long (vendor/class=claim uid and
# request): shown whole up to this, since it is the only name the Pod status gives the device.
MAX_ID = 256
# Verdict rows shown before "+N more": a node runs a few hundred pods at most, each a few devices.
MAX_VERDICTS = 500
_HEALTH_CLASS = {"Unhealthy": "s-failed", "Unknown": "s-unknown"}


def _verdict_resource(inv: Inventory, pod: PodMeta, v: DeviceVerdict) -> str:
    """A verdict's resource, a DRA entry with the ResourceClaim it is about (as the text shows it)."""
    claim = claim_object_of(inv.pod(pod.namespace, pod.name), pod, v)
    return f"{v.resource} (ResourceClaim {claim})" if claim else v.resource


def _health_html(snap: Snapshot) -> str:
    """The kubelet's verdict on each allocated device, from the Pods API (the only place a DRA
    device's failure shows on the node), the non-Healthy first; where it could not be read, why."""
    view = snap.pods
    if view is None:
        return ""
    if view.unavailable is not None:
        body = f'<p class="note">Pods API not read: {_text(view.unavailable, 400)}</p>'
    else:
        verdicts = view.verdicts()
        rows = "".join(
            f'<tr data-health="{_text(v.health)}" data-verdict-device="{_text(v.resource_id, MAX_ID)}">'
            f"<td>{_text(pod.key)}</td><td>{_text(v.container)}</td>"
            f"<td>{_text(_verdict_resource(snap.inventory, pod, v), MAX_ID)}</td>"
            f"<td>{_text(v.resource_id, MAX_ID)}</td>"
            f'<td class="{_HEALTH_CLASS.get(v.health, "")}">{_text(v.health)}</td>'
            f"<td>{_text(v.message or '-', 400)}</td></tr>"
            for pod, v in verdicts[:MAX_VERDICTS]
        )
        more = f"<p>+{len(verdicts) - MAX_VERDICTS} more</p>" if len(verdicts) > MAX_VERDICTS else ""
        body = (
            "<table><tr><th>pod</th><th>container</th><th>resource</th><th>device</th><th>health</th>"
            f"<th>message</th></tr>{rows}</table>{more}"
            if verdicts
            else "<p>(no allocated device has a verdict)</p>"
        )
    return f'<section class="totals health"><h2>Device health (the kubelet\'s verdicts)</h2>{body}</section>'


def render_html(snap: Snapshot, node: str) -> str:
    """The page for `snap` on the node named `node`: a complete HTML document."""
    inv = snap.inventory
    content_hash = _text(inv.content_hash, 80)
    tiles = _device_tiles(inv)
    memory = _memory_html(inv)
    boxes = []
    for numa in sorted(set(tiles) | set(memory), key=_place_key):
        by_res: dict[str, list[str]] = defaultdict(list)
        for tile in tiles.get(numa, []):
            by_res[tile.resource].append(_tile_html(tile, numa))
        resources = "".join(
            f'<div class="res"><h3>{_text(res)}</h3><div class="tiles">{"".join(items)}</div></div>'
            for res, items in sorted(by_res.items())
        )
        boxes.append(
            f'<section class="numa" data-numa="{",".join(str(n) for n in numa)}"><h2>{_numa_title(numa)}</h2>'
            f"{_figures_html(inv, numa)}{resources}{''.join(memory.get(numa, []))}</section>"
        )
    legend = "".join(
        f'<span data-legend="{state}"><i class="sw s-{state}"></i>{STATE_WORDS[state]}</span>'
        for state in STATE_COLOURS
    )
    note = (
        f'<p class="note">Allocatable unknown, showing allocations only: {_text(snap.degraded, 400)}</p>'
        if snap.degraded
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        # No script and nothing fetched, whatever the page contains.
        '<meta http-equiv="Content-Security-Policy"'
        " content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{_text(node)}: pod resources</title><style>{_CSS}</style></head><body>"
        f'<header><h1 data-node="{_text(node)}">Node {_text(node)}</h1>'
        f'<div>inventory <span class="hash" data-hash="{content_hash}">{content_hash}</span></div>'
        f'{note}<div class="legend">{legend}</div></header>'
        f'<div class="numas">{"".join(boxes) or "<p>(no devices or memory)</p>"}</div>'
        f"{_cpus_html(inv)}{_totals_html(inv)}{_health_html(snap)}</body></html>\n"
    )
