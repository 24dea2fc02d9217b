"""How the diff words what changed (NUMA nodes, counts, bytes, CPU sets) and the Change it makes. Pure.

Shared by the modules that compare two inventories (`watcher.model.diff` and the
allocation and capacity comparisons it calls), each of which returns its changes
with the key they sort by within their kind. `cpuset_string` is also the notation
of the kubelet's CPU manager state, for whoever renders it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.records import NumaNodes

__all__ = [
    "SortKey",
    "Keyed",
    "make_change",
    "cpuset_string",
    "numa_text",
    "count_text",
    "bytes_text",
    "printable",
]

SortKey = tuple[Any, ...]
# A change with the key it sorts by among the changes of its kind.
Keyed = tuple[SortKey, Change]


def make_change(kind: Kind, severity: Severity, summary: str, details: Mapping[str, Any]) -> Change:
    """A Change whose summary is one line, however its parts were wrapped."""
    return Change(kind, severity, " ".join(summary.split()), details)


def cpuset_string(ids: Iterable[int]) -> str:
    """Linux cpuset notation, e.g. `0-3,8,10-11`; empty for no CPUs."""
    out: list[str] = []
    start = prev = None
    for i in sorted(set(ids)):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def numa_text(numa: NumaNodes) -> str:
    if not numa:
        return "no NUMA node"
    return f"NUMA {','.join(str(n) for n in numa)}"


def count_text(n: int | None) -> str:
    return "?" if n is None else str(n)


def bytes_text(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


# C0 and C1 controls, DEL, and the line/paragraph separators and bidirectional overrides that
# change how a terminal, a chat client or a log viewer shows the text around them.
_CONTROLS = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in [
        *range(0x20),
        *range(0x7F, 0xA0),
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    ]
}


def printable(text: str) -> str:
    """`text` safe to show a person: control characters (ANSI escapes, newlines, bidi overrides)
    escaped as `\\xNN`/`\\uNNNN`, so a name chosen by a device plugin or a user cannot forge lines,
    colours or reorder what is shown. Plain text comes back as it is."""
    return text.translate(_CONTROLS)
