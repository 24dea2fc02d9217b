"""The project's own exceptions: one class per condition the code acts on.

Every message says what happened AND what the operator should do, because the
CLI prints `str(err)` as its one line on stderr.
"""

from __future__ import annotations

__all__ = [
    "WatcherError",
    "KubeletError",
    "SocketMissingError",
    "NotASocketError",
    "SocketPermissionError",
    "KubeletUnavailableError",
    "RateLimitedError",
    "MethodDisabledError",
    "MethodNotImplementedError",
    "DeadlineExceededError",
    "ResponseTooLargeError",
    "PodNotFoundError",
    "UnexpectedKubeletError",
    "KubeletInitializingError",
    "WatchDroppedError",
    "SnapshotBoundError",
    "PodDecodeError",
    "UnsafePathError",
]


class WatcherError(Exception):
    """Base of every error this project raises on purpose."""


class KubeletError(WatcherError):
    """A call to the kubelet's pod-resources socket failed."""

    def __init__(self, message: str, *, socket: str, method: str | None = None) -> None:
        super().__init__(message)
        self.socket = socket
        self.method = method


class SocketMissingError(KubeletError):
    """The socket path does not exist: the kubelet is not (yet) serving it."""


class NotASocketError(KubeletError):
    """The path exists but is not a unix socket (e.g. a file bind-mounted by mistake)."""


class SocketPermissionError(KubeletError):
    """The process may not connect to the socket."""


class KubeletUnavailableError(KubeletError):
    """The socket exists but nothing answers on it (kubelet restarting or dead)."""


class RateLimitedError(KubeletError):
    """RESOURCE_EXHAUSTED from the kubelet's global token bucket."""


class MethodDisabledError(KubeletError):
    """The kubelet knows the method but its feature gate is off (UNKNOWN "... disabled")."""


class MethodNotImplementedError(KubeletError):
    """The kubelet predates the method (UNIMPLEMENTED)."""


class DeadlineExceededError(KubeletError):
    """The call did not finish within its deadline."""


class ResponseTooLargeError(KubeletError):
    """The response is larger than the client's receive limit."""


class PodNotFoundError(KubeletError):
    """`Get` named a pod the kubelet does not know."""


class UnexpectedKubeletError(KubeletError):
    """Any other gRPC failure; the message carries the status code and details."""


class KubeletInitializingError(KubeletError):
    """FAILED_PRECONDITION "Kubelet is initializing": the Pods API's answer while the kubelet starts."""


class WatchDroppedError(KubeletError):
    """The kubelet dropped a Pods API watch that fell behind (RESOURCE_EXHAUSTED "watch client
    channel closed"): nothing is lost if the agent reconnects and diffs the fresh snapshot."""


class SnapshotBoundError(KubeletError):
    """A Pods API snapshot went past the agent's bounds (pods, bytes or time) before
    INITIAL_SYNC_COMPLETE: given up, the agent works from pod-resources alone and tries again later."""


class PodDecodeError(WatcherError):
    """One Pod from the Pods API is not a Pod message (or has no uid): that pod is skipped."""

    def __init__(self, message: str, *, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid  # None: not readable


class UnsafePathError(WatcherError):
    """A file the agent writes is a symbolic link or not a regular file: refused, untouched."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path
