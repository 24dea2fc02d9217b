"""Async client of the kubelet's pod-resources v1 API over its unix socket.

Calls return the raw response bytes as well as parsed messages: the watch loop
compares raw bytes first so an unchanged inventory is never parsed. Every gRPC
failure is turned into one of the exceptions in `watcher.errors`, with a
message that tells the operator what to do.
"""

from __future__ import annotations

import os
import stat
from types import TracebackType

import grpc
from grpc import aio

from watcher import errors
from watcher.kubeletapi.v1 import api_pb2

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MAX_RECEIVE_BYTES",
    "PodResourcesClient",
    "check_socket",
    "open_channel",
    "permission_error",
    "unavailable_error",
]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT = 10.0
# Agents at gRPC's 4 MiB default have failed on large nodes; the limit is also what bounds the
# agent's memory. Measured (bench/big_node.py, deploy/kubernetes/daemonset.yaml says how), an answer
# costs the agent up to ~15x its size at a cycle's peak, and 8 MiB answers kept every node shape
# measured under 180 MiB: inside the DaemonSet's 256 Mi limit with room for queued events. A node
# with larger answers needs both raised (memory limit ~ 60 MiB + 16 x max_receive_bytes).
DEFAULT_MAX_RECEIVE_BYTES = 8 * 1024 * 1024

_SERVICE = "/v1.PodResourcesLister/"
LIST = "List"
ALLOCATABLE = "GetAllocatableResources"
GET = "Get"


def check_socket(path: str, *, expected: str = "pod-resources/kubelet.sock") -> None:
    """Raise the matching KubeletError unless `path` is a unix socket we can reach.

    gRPC reports all of these as a bare UNAVAILABLE after its own dial attempt;
    a stat first gives the operator the precise cause. `expected` is the socket's place under
    the kubelet's root directory, which the messages name (this API's or the Pods API's).
    """
    directory = expected.partition("/")[0]
    try:
        st = os.stat(path)
    except FileNotFoundError as err:
        raise errors.SocketMissingError(
            f"kubelet socket {path} does not exist: is the kubelet running, and is its "
            f"{directory} DIRECTORY mounted here (not the socket file)?",
            socket=path,
        ) from err
    except PermissionError as err:
        raise permission_error(path, expected=expected) from err
    if not stat.S_ISSOCK(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "regular file or other"
        raise errors.NotASocketError(
            f"{path} exists but is not a unix socket ({kind}): point the watcher at the "
            f"kubelet's {expected}; if it was bind-mounted as a file, "
            "mount its directory instead",
            socket=path,
        )


def permission_error(
    path: str, *, expected: str = "pod-resources/kubelet.sock"
) -> errors.SocketPermissionError:
    """What a refused connect (or stat) of the kubelet's root-owned socket means, and the fix."""
    return errors.SocketPermissionError(
        f"permission denied on {path}: the kubelet's socket is root-owned and connecting "
        "needs write access; run the watcher as root (privileged) with the "
        f"{expected.partition('/')[0]} directory mounted read-write",
        socket=path,
    )


def unavailable_error(
    details: str, *, socket: str, method: str, expected: str = "pod-resources/kubelet.sock"
) -> errors.KubeletError:
    """UNAVAILABLE told apart: permission denied, the socket gone, or nobody answering."""
    lowered = details.lower()
    if "permission denied" in lowered:
        return permission_error(socket, expected=expected)
    if "no such file" in lowered:
        return errors.SocketMissingError(
            f"kubelet socket {socket} vanished during {method}: the kubelet is "
            "restarting; the call will be retried when the socket is back",
            socket=socket,
            method=method,
        )
    return errors.KubeletUnavailableError(
        f"kubelet not answering on {socket} ({details}): it is restarting or down; "
        "check `systemctl status kubelet` if this lasts",
        socket=socket,
        method=method,
    )


def open_channel(socket_path: str, max_receive_bytes: int) -> aio.Channel:
    """A gRPC channel to the kubelet's unix socket `socket_path`, as the agent dials every one."""
    return aio.insecure_channel(
        f"unix://{os.path.abspath(socket_path)}",
        options=[
            ("grpc.max_receive_message_length", max_receive_bytes),
            # Retries and reconnects are the watcher's job: it knows when
            # the socket was replaced, gRPC's backoff does not.
            ("grpc.enable_retries", 0),
            # gRPC shares subchannels between channels to the same target, and
            # with them their reconnect backoff: a "fresh" channel would wait out
            # the old one's backoff. Each channel gets its own.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ],
    )


class PodResourcesClient:
    """One channel to the kubelet; `reconnect()` replaces it when the socket is replaced."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_receive_bytes <= 0:
            raise ValueError(f"max_receive_bytes must be > 0, got {max_receive_bytes}")
        self.socket_path = socket_path
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self._channel: aio.Channel | None = None
        self._calls: dict[str, aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}

    async def __aenter__(self) -> PodResourcesClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ensure_channel(self) -> aio.Channel:
        if self._channel is None:
            self._channel = open_channel(self.socket_path, self.max_receive_bytes)
        return self._channel

    async def close(self) -> None:
        """Close the channel; the next call opens a new one."""
        channel, self._channel = self._channel, None
        self._calls = {}
        if channel is not None:
            await channel.close(grace=None)

    async def reconnect(self) -> None:
        """Drop the current channel so the next call dials the socket afresh."""
        await self.close()

    async def _call(self, method: str, request: bytes) -> bytes:
        check_socket(self.socket_path)
        call = self._calls.get(method)
        if call is None:
            # No deserializer: the caller gets the raw bytes for its fast path. Made once
            # per channel: every cycle makes these calls.
            call = self._calls[method] = self._ensure_channel().unary_unary(_SERVICE + method)
        try:
            response = await call(request, timeout=self.timeout)
        except aio.AioRpcError as err:
            raise self._translate(method, err) from err
        assert isinstance(response, bytes)
        return response

    async def list_raw(self) -> bytes:
        """`List` as serialized ListPodResourcesResponse bytes."""
        return await self._call(LIST, b"")

    async def allocatable_raw(self) -> bytes:
        """`GetAllocatableResources` as serialized AllocatableResourcesResponse bytes."""
        return await self._call(ALLOCATABLE, b"")

    async def get_raw(self, namespace: str, name: str) -> bytes:
        """`Get` for one pod as serialized GetPodResourcesResponse bytes."""
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        return await self._call(GET, request.SerializeToString())

    async def list(self) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse.FromString(await self.list_raw())

    async def allocatable(self) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse.FromString(await self.allocatable_raw())

    async def get(self, namespace: str, name: str) -> api_pb2.GetPodResourcesResponse:
        return api_pb2.GetPodResourcesResponse.FromString(await self.get_raw(namespace, name))

    def _translate(self, method: str, err: aio.AioRpcError) -> errors.KubeletError:
        code = err.code()
        details = err.details() or ""
        path = self.socket_path
        kw = {"socket": path, "method": method}
        lowered = details.lower()
        if code == grpc.StatusCode.UNAVAILABLE:
            return unavailable_error(details, socket=path, method=method)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            if "larger than max" in lowered or "message larger" in lowered:
                return errors.ResponseTooLargeError(
                    f"{method} response exceeds the {self.max_receive_bytes}-byte receive "
                    f"limit ({details}): raise [kubelet] max_receive_bytes, and the agent's "
                    "memory limit with it (about 16 bytes for each byte of the answer)",
                    **kw,
                )
            return errors.RateLimitedError(
                f"kubelet rate-limited {method} ({details}): it allows 100 requests/s "
                "shared by ALL its clients; lower this agent's rate or find the chatty "
                "client on this node",
                **kw,
            )
        if code == grpc.StatusCode.UNKNOWN and "disabled" in lowered:
            return errors.MethodDisabledError(
                f"{method} is disabled on this kubelet ({details}): enable its feature "
                "gate or upgrade the kubelet",
                **kw,
            )
        if code == grpc.StatusCode.UNKNOWN and method == GET and "not found" in lowered:
            return errors.PodNotFoundError(f"kubelet: {details}", **kw)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return errors.MethodNotImplementedError(
                f"this kubelet does not implement {method} ({details}): it predates the "
                "method; upgrade the kubelet to use it",
                **kw,
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.DeadlineExceededError(
                f"{method} did not answer within {self.timeout:g} s: the kubelet is "
                "overloaded or hung; check its health before raising the deadline",
                **kw,
            )
        name = code.name if code is not None else "UNKNOWN"
        return errors.UnexpectedKubeletError(f"{method} failed with {name}: {details or 'no details'}", **kw)
