"""The kubelet's Pods API (v1alpha1.Pods, beta and on by default in 1.37) as upstream serves it:
`pkg/kubelet/apis/pods` NewPodsServer over the kubelet's pod manager, in kubelet-lite. What a
client sees on the wire, recorded against the real server: the snapshot, the watch's order and
its DELETED events, the not-found answer, the socket a restart replaces. Every check runs against
the fake kubelet too (`[fake]`), so the fake is shown to agree with upstream on each of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Protocol

import grpc
import pytest
from grpc import aio

from testkit.kubelet_driver import FakeDriver
from testkit.kubelet_lite import KubeletLite
from testkit.peers import peer
from testkit.protowire import every, fields, first
from watcher.cli import main
from watcher.sim.fake_kubelet import FakeKubelet

pytestmark = pytest.mark.e2e

SERVICE = "/v1alpha1.Pods/"
ADDED, MODIFIED, DELETED, INITIAL_SYNC_COMPLETE = 1, 2, 3, 4
# k8s.io/api core/v1 generated.proto: Pod.metadata = 1, ObjectMeta.name = 1, .namespace = 3,
# .uid = 5; Pod.spec = 2, Pod.status = 3, PodStatus.phase = 1.
META, SPEC, STATUS = 1, 2, 3


class PodsKubelet(Protocol):
    """What these tests ask of a kubelet: KubeletLite itself, or the fake through FakeDriver."""

    @property
    def pods_api_socket(self) -> Path: ...

    @property
    def socket_path(self) -> Path: ...

    async def admit(
        self, namespace: str, pod: str, containers: Mapping[str, Mapping[str, int]], *, uid: str | None = None
    ) -> dict[str, dict[str, list[str]]]: ...

    async def remove(self, namespace: str, pod: str) -> None: ...

    async def restart(self) -> None: ...


@pytest.fixture(params=["real", "fake"])
async def pods_kubelet(request: pytest.FixtureRequest, short_tmp: Path) -> AsyncIterator[PodsKubelet]:
    """kubelet-lite ([real]), or the fake kubelet with an empty node ([fake])."""
    if request.param == "real":
        async with KubeletLite(peer("kubelet-lite"), peer("device-plugin"), short_tmp / "kubelet") as lite:
            yield lite
        return
    async with FakeKubelet(short_tmp / "fake", FakeDriver.node("example.com/dev", {}, 4), seed=7) as fake:
        yield FakeDriver(fake, "example.com/dev")


def _who(pod: bytes) -> tuple[str, str, str]:
    meta = first(pod, META) or b""
    name, namespace, uid = (first(meta, n) or b"" for n in (1, 3, 5))
    return namespace.decode(), name.decode(), uid.decode()


def _phase(pod: bytes) -> str:
    return (first(pod, STATUS, 1) or b"").decode()


async def _list(kubelet: PodsKubelet) -> list[bytes]:
    async with aio.insecure_channel(f"unix:{kubelet.pods_api_socket}") as channel:
        answer = await channel.unary_unary(SERVICE + "ListPods")(b"", timeout=5)
    return every(bytes(answer), 1)


async def test_list_pods_gives_every_admitted_pod_in_uid_order(pods_kubelet: PodsKubelet) -> None:
    for uid, name in (("c-3", "third"), ("a-1", "first"), ("b-2", "second")):
        await pods_kubelet.admit("team", name, {"main": {}}, uid=uid)
    pods = await _list(pods_kubelet)
    assert [_who(p) for p in pods] == [
        ("team", "first", "a-1"),
        ("team", "second", "b-2"),
        ("team", "third", "c-3"),
    ]
    assert {_phase(p) for p in pods} == {"Running"}


async def test_watch_gives_the_snapshot_then_sync_complete_then_changes_and_a_bare_deleted(
    pods_kubelet: PodsKubelet,
) -> None:
    for uid, name in (("b-2", "later"), ("a-1", "earlier")):
        await pods_kubelet.admit("ml", name, {"main": {}}, uid=uid)
    async with aio.insecure_channel(f"unix:{pods_kubelet.pods_api_socket}") as channel:
        call = channel.unary_stream(SERVICE + "WatchPods")(b"")
        stream = call.__aiter__()

        async def event() -> tuple[int, bytes]:
            raw = bytes(await asyncio.wait_for(stream.__anext__(), timeout=10))
            kind = next((int(v) for n, v in fields(raw) if n == 1 and isinstance(v, int)), 0)
            return kind, first(raw, 2) or b""

        snapshot = [await event() for _ in range(3)]
        assert [(k, _who(p)[2]) for k, p in snapshot] == [
            (ADDED, "a-1"),
            (ADDED, "b-2"),
            (INITIAL_SYNC_COMPLETE, ""),
        ]
        await pods_kubelet.admit("ml", "new", {"main": {}}, uid="c-3")
        kind, pod = await event()
        assert (kind, _who(pod), _phase(pod)) == (ADDED, ("ml", "new", "c-3"), "Running")
        await pods_kubelet.remove("ml", "earlier")
        kind, pod = await event()
        assert (kind, _who(pod)) == (DELETED, ("ml", "earlier", "a-1"))
        # A DELETED event carries the pod's name, namespace and uid, and nothing else (Go's
        # generated code still writes every field, empty): no labels (ObjectMeta 11), no
        # containers (PodSpec 2), no node (PodSpec 10), no phase (PodStatus 1).
        meta, spec = first(pod, META) or b"", first(pod, SPEC) or b""
        assert every(meta, 11) == [] and every(spec, 2) == []
        assert (first(spec, 10), first(pod, STATUS, 1)) in (
            (b"", b""),
            (None, None),
            (None, b""),
            (b"", None),
        )
        call.cancel()


async def test_snapshot_reads_upstreams_list_pods(
    pods_kubelet: PodsKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    """`snapshot` decodes the Pods the Go server marshals: each pod with its uid and phase."""
    for uid, name in (("b-2", "second"), ("a-1", "first")):
        await pods_kubelet.admit("team", name, {"main": {}}, uid=uid)
    code = await asyncio.to_thread(
        main, ["snapshot", "--socket", str(pods_kubelet.socket_path), "-o", "json"]
    )
    out, err = capfd.readouterr()
    assert code == 0, err
    api = json.loads(out)["pods_api"]
    assert (api["available"], api["skipped"]) == (True, 0)
    assert [(p["namespace"], p["name"], p["uid"], p["phase"]) for p in api["pods"]] == [
        ("team", "first", "a-1", "Running"),
        ("team", "second", "b-2", "Running"),
    ]


async def test_get_pod_of_an_unknown_uid_is_not_found_in_upstreams_words(pods_kubelet: PodsKubelet) -> None:
    request = bytes([0x0A, 5]) + b"ghost"  # GetPodRequest.podUID = 1
    async with aio.insecure_channel(f"unix:{pods_kubelet.pods_api_socket}") as channel:
        with pytest.raises(aio.AioRpcError) as caught:
            await channel.unary_unary(SERVICE + "GetPod")(request, timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "pod with UID ghost not found"


async def test_a_restart_replaces_the_pods_api_socket_and_the_pods_come_back(
    pods_kubelet: PodsKubelet,
) -> None:
    await pods_kubelet.admit("ml", "kept", {"main": {}}, uid="k-1")

    def identity() -> tuple[int, int]:  # the inode number alone can be reused at once
        st = pods_kubelet.pods_api_socket.stat()
        assert pods_kubelet.pods_api_socket.is_socket()
        return st.st_ino, st.st_mtime_ns

    before = identity()
    await pods_kubelet.restart()
    assert identity() != before
    assert [_who(p) for p in await _list(pods_kubelet)] == [("ml", "kept", "k-1")]


async def test_a_stopping_kubelet_closes_every_watch_as_a_drop_or_cuts_it(pods_kubelet: PodsKubelet) -> None:
    """Upstream's broadcaster closes every watcher's channel when the kubelet stops, so a watch
    ends in the very words of a drop; unless the process exits first (the kubelet does not wait for
    its server's GracefulStop), then the connection is cut (UNAVAILABLE). Upstream gives either,
    about half the time each; the fake always the first, the harder case for a client."""
    async with aio.insecure_channel(f"unix:{pods_kubelet.pods_api_socket}") as channel:
        call = channel.unary_stream(SERVICE + "WatchPods")(b"")
        stream = call.__aiter__()
        assert kind_of(bytes(await asyncio.wait_for(stream.__anext__(), 10))) == INITIAL_SYNC_COMPLETE
        await pods_kubelet.restart()
        read, end = await _read_until_it_ends(stream, 1)
    assert read == 0
    dropped = (end.code(), end.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "watch client channel closed",
    )
    assert dropped or end.code() == grpc.StatusCode.UNAVAILABLE, (end.code(), end.details())


async def test_a_watcher_that_stops_reading_is_dropped_with_resource_exhausted(
    pods_kubelet: PodsKubelet,
) -> None:
    """Upstream's broadcaster drops a client whose 100-event channel is full; the client still
    reads what was sent and buffered, then the stream ends in upstream's words."""
    options = [("grpc.http2.bdp_probe", 0)]  # no window growth: what the transport holds is bounded
    # Large pods (about 8 KiB each), so that few fill what the transport holds before the channel.
    containers = {f"container-{i:03d}-" + "x" * 50: {} for i in range(100)}
    async with aio.insecure_channel(f"unix:{pods_kubelet.pods_api_socket}", options=options) as channel:
        call = channel.unary_stream(SERVICE + "WatchPods")(b"")
        stream = call.__aiter__()
        assert kind_of(bytes(await asyncio.wait_for(stream.__anext__(), 10))) == INITIAL_SYNC_COMPLETE
        admitted = 0
        for admitted in range(1, 401):  # never read meanwhile; bounded
            await pods_kubelet.admit("flood", f"pod-{admitted:04d}", containers, uid=f"u-{admitted:04d}")
            if admitted % 25 == 0 and call.done():
                break
        read, end = await _read_until_it_ends(stream, admitted + 1)
    assert (end.code(), end.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "watch client channel closed")
    assert 100 <= read < admitted


async def _read_until_it_ends(stream: AsyncIterator[bytes], limit: int) -> tuple[int, aio.AioRpcError]:
    """How many events the stream still gives before its error (at most `limit`)."""
    for read in range(limit):
        try:
            await asyncio.wait_for(stream.__anext__(), 10)
        except aio.AioRpcError as err:
            return read, err
    raise AssertionError(f"the stream did not end within {limit} events")


def kind_of(raw: bytes) -> int:
    return next((int(v) for n, v in fields(raw) if n == 1 and isinstance(v, int)), 0)
