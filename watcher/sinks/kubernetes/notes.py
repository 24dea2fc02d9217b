"""How the kubernetes sink's texts are bounded: cut to a byte limit on a character boundary, and a
long list cut short with "and N more". Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from watcher.model.wording import printable

__all__ = ["fit", "listed", "pods_of"]

# Devices or pods named in one note or message before "and N more".
_SHOWN = 8


def fit(text: str, limit: int) -> str:
    """`text` cut to `limit` UTF-8 bytes on a character boundary, marked with an ellipsis if cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode(errors="ignore") + "…"


def listed(items: Sequence[str]) -> str:
    """The first items, printable and comma-separated, and how many more there are."""
    shown = ", ".join(printable(i) for i in items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def pods_of(holders: Iterable[str]) -> list[str]:
    """The pods ("namespace/pod") of holders named "namespace/pod/container", sorted, once each."""
    return sorted({"/".join(h.split("/")[:2]) for h in holders if h.count("/") >= 1})
