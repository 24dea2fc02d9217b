"""Async client of the kubelet's Pods API (`v1alpha1.Pods`) over its unix socket.

Pods come back as their raw core/v1 Pod bytes: `watcher.sources.pods_api.decoding` keeps what the agent
needs of each. Every gRPC failure becomes one of the exceptions in `watcher.errors`, so the watch
can tell the kubelet's warm-up, a dropped watcher, a missing or forbidden socket and a kubelet
without the API (any other refusal) apart, each with a message saying what to do.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import TracebackType

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from watcher import errors
from watcher.kubelet.client import check_socket, open_channel, unavailable_error
from watcher.kubeletapi.v1alpha1 import pods_pb2

__all__ = ["DEFAULT_MAX_RECEIVE_BYTES", "EXPECTED", "PodsApiClient"]

# One event carries one whole Pod; a Pod may reach the API server's own cap (~1.5 MB in etcd, more
# in the kubelet's view with status), and users do write 10 MB ones. 16 MiB lets those through
# while one message still bounds what the agent holds for it.
DEFAULT_MAX_RECEIVE_BYTES = 16 * 1024 * 1024
EXPECTED = "pods-api/pods-api.sock"  # under the kubelet's root directory

_SERVICE = "/v1alpha1.Pods/"
WATCH, LIST, GET = "WatchPods", "ListPods", "GetPod"
_INITIALIZING = "kubelet is initializing"
_DROPPED = "watch client channel closed"


class PodsApiClient:
    """One channel to the Pods API; `close()` drops it and the next call dials afresh."""

    def __init__(
        self, path: str, *, timeout: float, max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_receive_bytes <= 0:
            raise ValueError(f"max_receive_bytes must be > 0, got {max_receive_bytes}")
        self.socket_path = path
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self._channel: aio.Channel | None = None

    async def __aenter__(self) -> PodsApiClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _channel_now(self) -> aio.Channel:
        check_socket(self.socket_path, expected=EXPECTED)
        if self._channel is None:
            self._channel = open_channel(self.socket_path, self.max_receive_bytes)
        return self._channel

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)

    async def watch(self) -> AsyncGenerator[tuple[int, bytes], None]:
        """WatchPods: (event type, raw Pod) until the stream ends, which always raises: the
        kubelet's code translated, or PodDecodeError for an event that is not protobuf."""
        method: aio.UnaryStreamMultiCallable[bytes, bytes] = self._channel_now().unary_stream(
            _SERVICE + WATCH
        )
        call = method(b"")
        try:
            async for raw in call:
                try:
                    event = pods_pb2.WatchPodsEvent.FromString(raw)
                except DecodeError as err:
                    raise errors.PodDecodeError(
                        f"a WatchPods event from {self.socket_path} is not protobuf ({err}): "
                        "the watch is restarted; a kubelet that keeps sending such events is broken"
                    ) from err
                yield event.type, event.pod
        except aio.AioRpcError as err:
            raise self._translate(WATCH, err) from err
        finally:
            call.cancel()
        raise errors.KubeletUnavailableError(
            f"the kubelet ended the Pods API watch on {self.socket_path} without an error: "
            "it is restarting; the watch is reopened",
            socket=self.socket_path,
            method=WATCH,
        )

    async def _unary(self, method: str, request: bytes) -> bytes:
        call: aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel_now().unary_unary(_SERVICE + method)
        try:
            response = await call(request, timeout=self.timeout)
        except aio.AioRpcError as err:
            raise self._translate(method, err) from err
        assert isinstance(response, bytes)
        return response

    async def list_pods(self) -> list[bytes]:
        """ListPods: every pod's raw bytes, in uid order."""
        return list(pods_pb2.ListPodsResponse.FromString(await self._unary(LIST, b"")).pods)

    async def list_raw(self) -> bytes:
        """ListPods: the answer's bytes as they came (a ListPodsResponse), for a caller that walks
        it without holding a parsed copy too (watcher.sources.pods_api.resync)."""
        return await self._unary(LIST, b"")

    async def get_pod(self, uid: str) -> bytes:
        """GetPod: the raw bytes of pod `uid`; PodNotFoundError if the kubelet has none."""
        request = pods_pb2.GetPodRequest(podUID=uid).SerializeToString()
        return pods_pb2.GetPodResponse.FromString(await self._unary(GET, request)).pod

    def _translate(self, method: str, err: aio.AioRpcError) -> errors.KubeletError:
        code, details = err.code(), err.details() or ""
        path, lowered = self.socket_path, details.lower()
        kw = {"socket": path, "method": method}
        if code == grpc.StatusCode.UNAVAILABLE:
            return unavailable_error(details, socket=path, method=method, expected=EXPECTED)
        if code == grpc.StatusCode.CANCELLED:
            # The kubelet's server going away mid-stream (a restart) cancels the stream.
            return errors.KubeletUnavailableError(
                f"the Pods API on {path} went away during {method} ({details}): the kubelet is "
                "restarting; the call is retried",
                **kw,
            )
        if code == grpc.StatusCode.FAILED_PRECONDITION and _INITIALIZING in lowered:
            return errors.KubeletInitializingError(
                f"the Pods API on {path} answers {method} with {details!r}: the kubelet is starting; "
                "retried shortly",
                **kw,
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            if "larger than max" in lowered or "message larger" in lowered:
                return errors.ResponseTooLargeError(
                    f"a {method} message exceeds the {self.max_receive_bytes}-byte receive limit "
                    f"({details}): one pod on this node is that large; the agent reads its pods from "
                    "pod-resources until the watch gets through",
                    **kw,
                )
            if _DROPPED in lowered:
                return errors.WatchDroppedError(
                    f"the kubelet dropped the agent's Pods API watch ({details}): it fell 100 events "
                    "behind; the agent reconnects and compares a fresh snapshot, nothing is lost",
                    **kw,
                )
            return errors.RateLimitedError(
                f"the Pods API rate-limited {method} ({details}): ListPods and GetPod share "
                "100 requests/s, burst 10, among ALL its clients; find the chatty client on this node",
                **kw,
            )
        if code == grpc.StatusCode.NOT_FOUND and method == GET:
            return errors.PodNotFoundError(f"kubelet: {details}", **kw)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.DeadlineExceededError(
                f"{method} did not answer within {self.timeout:g} s: the kubelet is overloaded or hung",
                **kw,
            )
        # Any other refusal is a kubelet that does not offer the API (too old, or its gate off):
        # every such code means the same to the agent.
        name = code.name if code is not None else "UNKNOWN"
        return errors.MethodDisabledError(
            f"the kubelet refuses the Pods API's {method} on {path} ({name}: {details or 'no details'}): "
            "its PodsAPI feature gate is off or it predates the API; the agent works from "
            "pod-resources alone (no pod uids, owners, labels or DRA device health)",
            **kw,
        )
