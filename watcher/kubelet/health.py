"""What the agent knows of the kubelet's health, as a frozen value with pure transitions.

Each transition takes the time (monotonic seconds) and what was seen, and returns the next value
and the lifecycle changes it calls for (`kubelet.reachable`, `kubelet.connected`,
`kubelet.unreachable`, `api.degraded`, `api.answer_too_large`). Nothing here does I/O or keeps a
clock: the reactor feeds it, and a value whose changes could not be stored is simply dropped, so
they come again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from watcher.model import lifecycle
from watcher.model.changes import Change, Severity

__all__ = ["KubeletHealth", "ALLOCATABLE", "LIST"]

ALLOCATABLE = "GetAllocatableResources"
LIST = "List"


@dataclass(frozen=True)
class KubeletHealth:
    failing_since: float | None = None  # first failed query of the current outage
    last_error: str | None = None
    last_error_kind: str | None = None
    unreachable_reported: bool = False
    attempt: int = 0  # failed (or rate-limited) queries in a row: the retry backoff's count
    retry_at: float | None = None
    ever_connected: bool = False
    degraded_reported: frozenset[str] = frozenset()  # methods an `api.degraded` was stored for
    too_large_reported: bool = False  # an `api.answer_too_large` was stored for this run of them

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def answered(
        self, now: float, socket: Path, *, started_reported: bool, list_only_reason: str | None
    ) -> tuple[KubeletHealth, list[Change]]:
        """Both calls answered (`list_only_reason`: GetAllocatableResources is unavailable, why)."""
        changes: list[Change] = []
        if self.unreachable_reported:
            down_for = now - (self.failing_since or now)
            changes.append(lifecycle.reachable(socket, down_for=down_for))
        if started_reported and not self.ever_connected:
            changes.append(lifecycle.connected(socket))
        reported = set(self.degraded_reported)
        if list_only_reason is None:
            reported.discard(ALLOCATABLE)
        elif ALLOCATABLE not in reported:
            reported.add(ALLOCATABLE)
            changes.append(
                lifecycle.degraded(ALLOCATABLE, list_only_reason, lost=lifecycle.LOST_IN_LIST_ONLY)
            )
        return KubeletHealth(ever_connected=True, degraded_reported=frozenset(reported)), changes

    def failed(
        self,
        now: float,
        error: str,
        kind: str,
        *,
        retry_delay: float,
        list_disabled: bool,
        next_periodic: float,
    ) -> tuple[KubeletHealth, list[Change]]:
        """A query failed; `list_disabled`: List itself is disabled or not implemented."""
        changes: list[Change] = []
        retry_at = now + retry_delay
        reported = self.degraded_reported
        if list_disabled and LIST not in reported:
            # Without List the watcher is blind; say so once, keep trying slowly.
            reported = reported | {LIST}
            changes.append(lifecycle.degraded(LIST, error, lost=["everything"], severity=Severity.CRITICAL))
            retry_at = next_periodic
        after = dataclasses.replace(
            self,
            failing_since=self.failing_since if self.failing_since is not None else now,
            last_error=error,
            last_error_kind=kind,
            attempt=self.attempt + 1,
            retry_at=retry_at,
            degraded_reported=reported,
        )
        return after, changes

    def too_large(
        self, now: float, socket: Path, *, method: str, error: str, limit: int, retry_delay: float
    ) -> tuple[KubeletHealth, list[Change]]:
        """The kubelet answered over the receive limit. It is there, so this is no outage: any
        outage under way ends (`kubelet.reachable`), and no `kubelet.unreachable` follows however
        long it lasts. `api.answer_too_large` once, until an answer fits; retried on the backoff."""
        changes: list[Change] = []
        if self.unreachable_reported:
            changes.append(lifecycle.reachable(socket, down_for=now - (self.failing_since or now)))
        if not self.too_large_reported:
            changes.append(lifecycle.answer_too_large(method, error, limit=limit))
        after = dataclasses.replace(
            self,
            failing_since=None,
            last_error=error,
            last_error_kind="ResponseTooLargeError",
            unreachable_reported=False,
            attempt=self.attempt + 1,
            retry_at=now + retry_delay,
            too_large_reported=True,
        )
        return after, changes

    def rate_limited(self, now: float, delay: float) -> KubeletHealth:
        return dataclasses.replace(self, attempt=self.attempt + 1, retry_at=now + delay)

    def retry_after(self, at: float) -> KubeletHealth:
        """Retry at `at` (a commit failed: the agent must try again even with nothing new)."""
        return dataclasses.replace(self, retry_at=at)

    def unreachable_at(self, grace: float) -> float | None:
        """When `kubelet.unreachable` becomes due, if it is still to come."""
        if self.failing_since is None or self.unreachable_reported:
            return None
        return self.failing_since + grace

    def unreachable(self, now: float, grace: float, socket: Path) -> tuple[KubeletHealth, Change | None]:
        """`kubelet.unreachable`, once the failures have lasted `grace` seconds."""
        due = self.unreachable_at(grace)
        if due is None or now < due:
            return self, None
        assert self.failing_since is not None
        change = lifecycle.unreachable(
            socket, down_for=now - self.failing_since, error=self.last_error, kind=self.last_error_kind
        )
        return dataclasses.replace(self, unreachable_reported=True), change
