"""The watcher's own lifecycle changes (started, kubelet connected / restarted / unreachable /
reachable, API degraded). Pure builders of Change values, so their wording lives in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from watcher.model.changes import Change, Kind, Severity
from watcher.model.diff import inventory_summary
from watcher.model.inventory import Inventory

__all__ = [
    "started",
    "connected",
    "restarted",
    "unreachable",
    "reachable",
    "degraded",
    "answer_too_large",
    "snapshot",
    "LOST_IN_LIST_ONLY",
]

# What List-only mode cannot see, said in the api.degraded event.
LOST_IN_LIST_ONLY = [
    "device hot-plug, unplug and health changes",
    "free capacity per resource and NUMA node",
    "allocatable CPU and memory changes",
    "devices allocated to pods but failed or vanished",
]


def started(inv: Inventory | None, *, baseline: str, changes: int, error: str | None) -> Change:
    summary = inventory_summary(inv) if inv is not None else None
    details: dict[str, Any] = {
        "baseline": baseline,
        "changes_since_last_run": changes,
        "kubelet": {"reachable": inv is not None, "error": error},
        "inventory": summary,
    }
    if inv is not None and inv.allocatable_known:
        # Which devices are there, by id: what a consumer that keeps device state (the kubernetes
        # sink's conditions) reconciles against at every start.
        allocatable: dict[str, list[str]] = {}
        for d in inv.devices:
            allocatable.setdefault(d.resource, []).append(d.id)
        details["allocatable_devices"] = allocatable
    if summary is not None:
        devices = summary["devices"] or {}
        parts = [f"{summary['pods']} pods"] + [f"{n} {res}" for res, n in devices.items()]
        text = "watcher started: " + ", ".join(parts)
        if changes:
            text += f"; {changes} change(s) since the last run"
    else:
        text = "watcher started; the kubelet is not reachable yet"
    return Change(Kind.WATCHER_STARTED, Severity.INFO, text, details)


def connected(socket: Path) -> Change:
    return Change(
        Kind.KUBELET_CONNECTED,
        Severity.INFO,
        f"connected to the kubelet at {socket}",
        {"socket": str(socket)},
    )


def restarted(socket: Path, *, seen_by: str) -> Change:
    return Change(
        Kind.KUBELET_RESTARTED,
        Severity.INFO,
        f"kubelet restarted: socket {socket} was replaced",
        {"socket": str(socket), "seen_by": seen_by},
    )


# What each failure to reach the kubelet means, for people (the kinds are the agent's own names).
FAILURES = {
    "SocketMissingError": "its socket is gone",
    "NotASocketError": "something that is not a socket sits at its path",
    "SocketPermissionError": "permission denied on its socket",
    "KubeletUnavailableError": "it does not answer",
    "DeadlineExceededError": "it did not answer in time",
    "ResponseTooLargeError": "its answer is over the receive limit",
    "MethodDisabledError": "List is disabled",
    "MethodNotImplementedError": "it does not implement List",
    "UnexpectedKubeletError": "it answered with an unexpected error",
    "DecodeError": "its answer could not be decoded",
}


def failure_text(kind: str | None) -> str:
    """A failure kind in words; an unknown one as it is."""
    return FAILURES.get(kind or "", kind or "an error")


def unreachable(socket: Path, *, down_for: float, error: str | None, kind: str | None) -> Change:
    return Change(
        Kind.KUBELET_UNREACHABLE,
        Severity.CRITICAL,
        f"kubelet unreachable for {down_for:.0f} s: {failure_text(kind)}",
        {"socket": str(socket), "down_seconds": round(down_for, 3), "error": error, "error_kind": kind},
    )


def reachable(socket: Path, *, down_for: float) -> Change:
    return Change(
        Kind.KUBELET_REACHABLE,
        Severity.INFO,
        f"kubelet reachable again after {down_for:.1f} s",
        {"socket": str(socket), "down_seconds": round(down_for, 3)},
    )


def degraded(method: str, reason: str, *, lost: list[str], severity: Severity = Severity.WARNING) -> Change:
    if method == "List":
        text = "List unavailable: the watcher cannot see pod allocations on this kubelet"
    else:
        text = f"{method} unavailable: watching allocations only (List-only mode)"
    return Change(Kind.API_DEGRADED, severity, text, {"method": method, "reason": reason, "lost": lost})


def answer_too_large(method: str, error: str, *, limit: int) -> Change:
    """The kubelet answered, but with more than the receive limit: what is on the node chose that
    (a device plugin listing absurd topologies, a flood of pods), not a kubelet that is down."""
    return Change(
        Kind.API_ANSWER_TOO_LARGE,
        Severity.WARNING,
        f"the kubelet's {method} answer is over the {limit}-byte receive limit: the watcher cannot see "
        "this node's changes until it fits; look for the device plugin or pods that make it so large, "
        "or raise [kubelet] max_receive_bytes and the agent's memory limit with it",
        {"method": method, "error": error, "max_receive_bytes": limit},
    )


def invalid_text(repaired: list[str]) -> Change:
    """The kubelet's answer carried strings that are not valid UTF-8 (they were repaired)."""
    shown = sorted(set(repaired))
    return Change(
        Kind.API_INVALID_TEXT,
        Severity.WARNING,
        f"the kubelet's answer has {len(shown)} name(s) or id(s) that are not valid UTF-8, "
        f"e.g. {shown[0]!r}: shown with the bad bytes escaped; look for the device plugin or pod "
        "that chose it",
        {"strings": shown[:20], "count": len(shown)},
    )


def snapshot(inv: Inventory) -> Change:
    """The whole inventory, for push consumers to reconcile against."""
    summary = inventory_summary(inv)
    return Change(
        Kind.INVENTORY_SNAPSHOT,
        Severity.INFO,
        f"inventory snapshot {inv.content_hash[:19]}: {summary['pods']} pods",
        {"hash": inv.content_hash, "summary": summary, "inventory": inv.canonical},
    )
