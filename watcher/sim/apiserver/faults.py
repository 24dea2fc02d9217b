"""Faults the fake API server injects on request: the next matching requests answered with an
error status, with the real reason and wording for it (429 with Retry-After)."""

from __future__ import annotations

import dataclasses

from watcher.sim.apiserver.errors import ApiError

__all__ = ["Faults"]


@dataclasses.dataclass
class _Fault:
    status: int
    count: int
    retry_after: int | None
    method: str | None
    path_prefix: str | None


class Faults:
    """The faults still to inject, first added first."""

    def __init__(self) -> None:
        self._faults: list[_Fault] = []

    def add(
        self,
        status: int,
        *,
        count: int = 1,
        retry_after: int | None = None,
        method: str | None = None,
        path_prefix: str | None = None,
    ) -> None:
        self._faults.append(
            _Fault(status, count, retry_after, method.upper() if method else None, path_prefix)
        )

    def take(self, method: str, path: str) -> None:
        """Raise the first fault that matches this request, counting it down."""
        for fault in self._faults:
            if fault.method is not None and fault.method != method:
                continue
            if fault.path_prefix is not None and not path.startswith(fault.path_prefix):
                continue
            fault.count -= 1
            if fault.count <= 0:
                self._faults.remove(fault)
            raise _fault_error(fault)


def _fault_error(fault: _Fault) -> ApiError:
    status = fault.status
    if status == 429:
        wait = fault.retry_after if fault.retry_after is not None else 1
        return ApiError(
            429, "TooManyRequests", "Too many requests, please try again later.", {"retryAfterSeconds": wait}
        )
    reasons = {
        409: ("Conflict", "Operation cannot be fulfilled: the object has been modified"),
        500: ("InternalError", "Internal error occurred: injected by the fake API server"),
        503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
        504: ("Timeout", "The server was unable to return a response in the time allotted"),
        401: ("Unauthorized", "Unauthorized"),
        403: ("Forbidden", "forbidden: injected by the fake API server"),
    }
    reason, message = reasons.get(status, ("InternalError", f"injected status {status}"))
    return ApiError(
        status, reason, message, {"retryAfterSeconds": fault.retry_after} if fault.retry_after else None
    )
