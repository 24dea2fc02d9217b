"""How the diff words what changed (NUMA nodes, counts, bytes, CPU sets) and the Change it makes, and
what of a name a person may see (`printable`). Pure.

Shared by the modules that compare two inventories (`watcher.model.diff` and the
allocation and capacity comparisons it calls), each of which returns its changes
with the key they sort by within their kind. `cpuset_string` is also the notation
of the kubelet's CPU manager state, for whoever renders it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from functools import lru_cache
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


# What a person is never shown as it is, by Unicode category: controls (Cc: C0, DEL, C1); format
# characters (Cf: the bidi marks, embeddings, overrides and isolates, zero-width spaces and joiners,
# the tag characters U+E0000..U+E007F, the BOM), which reorder or hide text or draw nothing; combining
# marks (Mn, Me), which draw over the character before them or stack beyond its line; the line and
# paragraph separators (Zl, Zp); spaces other than U+0020 (Zs), which look like it; surrogates,
# private-use and unassigned code points (Cs, Co, Cn), which draw as anything or nothing.
_HIDDEN = frozenset({"Cc", "Cf", "Mn", "Me", "Zl", "Zp", "Zs", "Cs", "Co", "Cn"})
# Letters that draw nothing at all (Unicode lists them as default-ignorable): a look-alike's padding.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
# An ASCII string, the common case, needs only this (and most need nothing).
_ASCII_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


@lru_cache(maxsize=4096)
def _shown(c: str) -> str:
    if c == " " or (unicodedata.category(c) not in _HIDDEN and c not in _BLANK_LETTERS):
        return c
    return _escaped(c)


def printable(text: str) -> str:
    """`text` as a person may see it: the one place that decides. Controls (ANSI escapes, newlines),
    bidi controls, zero-width and tag characters, combining marks, look-alike spaces and unassigned
    code points are escaped as `\\xNN`, `\\uNNNN` or `\\UNNNNNNNN`, so a name chosen by a device plugin
    or a user cannot forge lines or colours, reorder or overdraw what is shown, or pass for another
    name. Plain text comes back as it is, and an escaped text escapes to itself. Machine fields
    (event details, ids in JSON) keep the exact string and never go through here."""
    if text.isascii():
        return text if text.isprintable() else text.translate(_ASCII_CONTROLS)
    return "".join(map(_shown, text))
