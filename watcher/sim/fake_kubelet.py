"""A simulated kubelet: a real grpc.aio server of the pod-resources v1 API on a unix socket.

It keeps the real kubelet's quirks, because tests against a polite fake prove
nothing (they are those of the kubelet's own pod-resources server and device manager):

- the socket is created by unlink, listen on a temporary name, rename into
  place: a new file on every start; a stopped kubelet leaves its stale socket;
- every answer comes in a fresh random order, one device entry per device per
  NUMA node;
- unhealthy or unplugged devices vanish from allocatable but stay in the pods'
  allocations;
- one global token bucket (100/s, burst 10) rejects with RESOURCE_EXHAUSTED;
- methods can be disabled (UNKNOWN "... disabled") or absent (UNIMPLEMENTED);
- `device-plugins/kubelet_internal_checkpoint` is rewritten (temp file + rename) on every
  device change a plugin reports (health, hot-plug, unplug, registration) and on an allocation of
  devices, but not when a plugin leaves (the kubelet writes nothing then either); `cpu_manager_state` and
  `memory_manager_state` when their content changes; `dra_manager_state` whenever a pod starts or
  ends, with claims or without, as the kubelet's DRA manager prepares and unprepares every pod.
  (Unlike the kubelet, `free()` rewrites the checkpoint: the kubelet frees a pod's devices in
  memory and writes nothing.)

Beside it, unless `pods_api=False`, it serves the kubelet's Pods API at
`pods-api/pods-api.sock` (watcher.sim.fake_pods_api), the pods as core/v1 Pod messages. The two
can disagree as a node's do (`fake.churn`): a force-deleted pod is gone from the Pods API while
pod-resources still lists it, and a pod recreated under its name can leave the old one terminating
on the Pods API, its late status updates after the new one's ADDED.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from watcher.kubeletapi.k8s import core_v1_pb2
from watcher.kubeletapi.v1 import api_pb2
from watcher.ratelimit import TokenBucket
from watcher.sim import fake_answers, fake_state_files
from watcher.sim.fake_dra import DraDevices
from watcher.sim.fake_faults import SERVICE, MethodFaults
from watcher.sim.fake_node import FakeDevice, FakeMemory, FakeNode, FakePod, default_node
from watcher.sim.fake_plugins import Plugins, Warmup
from watcher.sim.fake_pod_objects import pod_object, pod_objects
from watcher.sim.fake_pods_api import FakePodsApi
from watcher.sim.fake_sockets import serve_at

__all__ = ["FakeKubelet", "PodChurn"]


class FakeKubelet:
    """Serve `node` under `root` (a stand-in for /var/lib/kubelet), scriptable from Python.

    Mutations take effect on the next call and rewrite at once the state files the kubelet
    would rewrite for them; CPU and memory changes take effect across `restart()`, as on a
    real node.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        node: FakeNode | None = None,
        *,
        rate: float = 100.0,
        burst: int = 10,
        seed: int | None = None,
        shuffle: bool = True,
        warmup: Warmup | None = None,
        pods_api: bool = True,
        node_name: str = "fake-node",
    ) -> None:
        self.root = Path(root)
        self.node = node if node is not None else default_node()
        self.socket_dir = self.root / "pod-resources"
        self.socket_path = self.socket_dir / "kubelet.sock"
        self.checkpoint_path = self.root / "device-plugins" / "kubelet_internal_checkpoint"
        self.cpu_state_path = self.root / "cpu_manager_state"
        self.memory_state_path = self.root / "memory_manager_state"
        self.dra_state_path = self.root / "dra_manager_state"
        self.rate = rate
        self.burst = burst
        self.bucket = TokenBucket(rate, burst)
        self.faults = MethodFaults()  # disable, make_absent, set_delay, answer_garbage, enable
        self.calls: Counter[str] = Counter()
        # When each served call was answered (bounded): the benchmarks' view of our load.
        self.call_times: deque[float] = deque(maxlen=100_000)
        self.rejected = 0
        self.starts = 0
        self._rng = random.Random(seed)
        self.shuffle = shuffle
        # time.monotonic() when the socket was last renamed into place, and of the
        # first call served after that: what "reconnect latency" is measured by.
        self.started_at: float | None = None
        self.first_call_at: float | None = None
        self._server: aio.Server | None = None
        # Its own generator: the answers' shuffle stays the same sequence with or without warm-up.
        self.plugins = Plugins(
            self.root / "device-plugins",
            self.node,
            warmup=warmup,
            rng=random.Random(None if seed is None else seed + 1),
            on_change=self._changed,
        )
        # The Pods API (on by default since 1.37): False is a kubelet without it (no socket).
        self.node_name = node_name
        # Pods deleted and recreated in the ways that part the Pods API from pod-resources.
        self.churn = PodChurn(
            self.node, lambda checkpoint, dra: self._changed(checkpoint=checkpoint, dra=dra)
        )
        self.pods_api = (
            FakePodsApi(
                self.root,
                self._api_pods,
                ready=lambda: not self.plugins.hidden_pods,
            )
            if pods_api
            else None
        )
        # DRA drivers' verdicts on their devices (fake.dra.set_health): the Pods API shows them.
        self.dra = DraDevices(self.node, lambda: self._changed(checkpoint=False))
        # A pod the warm-up shows is an ADDED on the Pods API; it rewrites no state file.
        self.plugins.on_shown = lambda: self._changed(checkpoint=False)

    # -- lifecycle --

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Unlink the old socket, listen on a temporary name, rename it into place."""
        if self._server is not None:
            raise RuntimeError("fake kubelet already running")
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self._handler(),))
        await serve_at(server, self.socket_path)
        if self.pods_api is not None:
            await self.pods_api.start()
        self.started_at = time.monotonic()
        self.first_call_at = None
        self._server = server
        self.bucket = TokenBucket(self.rate, self.burst)
        self.starts += 1
        self.plugins.kubelet_started()
        self.write_state_files()
        if not self.dra_state_path.exists():  # the DRA manager makes its checkpoint on its first start
            fake_state_files.write_dra_state(self.node, self.dra_state_path)

    async def stop(self, *, remove_socket: bool = False) -> None:
        """Stop serving. Like a killed kubelet, leave the stale socket unless told otherwise."""
        server, self._server = self._server, None
        await self.plugins.stop()
        if self.pods_api is not None:
            await self.pods_api.stop(remove_socket=remove_socket)
        if server is not None:
            await server.stop(grace=None)
        if remove_socket:
            self.socket_path.unlink(missing_ok=True)

    async def restart(
        self,
        downtime: float = 0.0,
        *,
        cpu_ids: Iterable[int] | None = None,
        memory: Iterable[FakeMemory] | None = None,
    ) -> None:
        """Stop, stay down for `downtime` seconds, optionally change CPUs/memory, start again."""
        await self.stop()
        if downtime > 0:
            await asyncio.sleep(downtime)
        if cpu_ids is not None:
            self.node.cpu_ids = set(cpu_ids)
        if memory is not None:
            self.node.memory = list(memory)
        await self.start()

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(remove_socket=True)

    # -- scripting --

    def _changed(self, *, checkpoint: bool = True, dra: bool = False) -> None:
        """Tell the files and the Pods API; `dra`: a pod started or ended."""
        if self.running:
            self.write_state_files(checkpoint=checkpoint)
            if dra:
                fake_state_files.write_dra_state(self.node, self.dra_state_path)
            if self.pods_api is not None:
                self.pods_api.changed()

    def update_pod(
        self,
        namespace: str,
        pod: str,
        *,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        """The pod's phase (Pending, Running, Succeeded, Failed) or its labels (the kubelet takes
        those from the API server) change: nothing the pod-resources API shows."""
        fake_pod = self.node.pods[(namespace, pod)]
        if phase is not None:
            fake_pod.phase = phase
        if labels is not None:
            fake_pod.labels = dict(labels)
        self._changed(checkpoint=False)

    def add_device(self, resource: str, device_id: str, numa: Iterable[int] = ()) -> None:
        """Hot-plug a device (or a device plugin registering one)."""
        self.node.add_device(FakeDevice(resource, device_id, tuple(numa)))
        self._changed()

    def remove_device(self, resource: str, device_id: str) -> None:
        """Unplug a device. Pods that hold it keep it, and its topology, in their allocations."""
        self.node.remove_device(resource, device_id)
        self._changed()

    def set_healthy(self, resource: str, device_id: str, healthy: bool) -> None:
        self.node.devices[(resource, device_id)].healthy = healthy
        self._changed()

    def make_unhealthy(self, resource: str, device_id: str) -> None:
        self.set_healthy(resource, device_id, False)

    def heal(self, resource: str, device_id: str) -> None:
        self.set_healthy(resource, device_id, True)

    def allocate(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        devices: dict[str, list[str]] | None = None,
        cpu_ids: Iterable[int] = (),
        memory: Iterable[FakeMemory] = (),
    ) -> None:
        """Give a container devices, CPUs or memory, creating the pod and container if needed."""
        fake_pod = self.node.pods.get((namespace, pod))
        started = fake_pod is None
        if fake_pod is None:
            fake_pod = FakePod(namespace, pod)
            self.node.add_pod(fake_pod)
        c = fake_pod.container(container)
        for resource, ids in (devices or {}).items():
            held = c.devices.setdefault(resource, [])
            held.extend(i for i in ids if i not in held)
        c.cpu_ids.update(cpu_ids)
        c.memory.extend(memory)
        # The device manager writes its checkpoint for a container given devices, not for one
        # that asks for none.
        self._changed(checkpoint=any(devices.values()) if devices else False, dra=started)

    def free(self, namespace: str, pod: str) -> None:
        """The pod ended: its allocations are released."""
        del self.node.pods[(namespace, pod)]
        self.churn.force_deleted.discard((namespace, pod))
        self._changed(dra=True)

    def add_pod(self, pod: FakePod) -> None:
        self.node.add_pod(pod)
        self._changed(checkpoint=any(any(c.devices.values()) for c in pod.containers), dra=True)

    # -- the wire --

    def _api_pods(self) -> list[core_v1_pb2.Pod]:
        hidden = self.plugins.hidden_pods | self.churn.force_deleted
        return pod_objects(self.node, hidden, self.node_name) + self.churn.old_objects(self.node_name)

    def allocatable_response(self) -> api_pb2.AllocatableResourcesResponse:
        return fake_answers.allocatable_response(self.node, self._shuffle, self.plugins.down)

    def list_response(self) -> api_pb2.ListPodResourcesResponse:
        return fake_answers.list_response(self.node, self._shuffle, self.plugins.hidden_pods)

    def _shuffle(self, seq: list[Any]) -> None:
        if self.shuffle:
            self._rng.shuffle(seq)

    def _handler(self) -> grpc.GenericRpcHandler:
        def unary(method: str, build: Callable[[bytes], Any]) -> grpc.RpcMethodHandler[bytes, bytes]:
            async def handle(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
                return await self._serve(method, request, context, build)

            return grpc.unary_unary_rpc_method_handler(handle)  # raw bytes in and out

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": unary("List", lambda _req: self.list_response()),
                "GetAllocatableResources": unary(
                    "GetAllocatableResources", lambda _req: self.allocatable_response()
                ),
                "Get": unary("Get", self._get),
            },
        )

    def _get(self, request: bytes) -> api_pb2.GetPodResourcesResponse:
        req = api_pb2.GetPodResourcesRequest.FromString(request)
        key = (req.pod_namespace, req.pod_name)
        pod = None if key in self.plugins.hidden_pods else self.node.pods.get(key)
        if pod is None:
            raise LookupError(f"pod {req.pod_name} in namespace {req.pod_namespace} not found")
        return api_pb2.GetPodResourcesResponse(
            pod_resources=fake_answers.pod_resources(self.node, pod, self._shuffle)
        )

    async def _serve(
        self,
        method: str,
        request: bytes,
        context: aio.ServicerContext[bytes, bytes],
        build: Callable[[bytes], Any],
    ) -> bytes:
        await self.faults.before_limiter(method, context)
        # The kubelet's limiter is an interceptor in front of every method it implements.
        if not self.bucket.take():
            self.rejected += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        await self.faults.before_answer(method, context)
        try:
            message = build(request)
        except LookupError as err:
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        self.calls[method] += 1
        self.call_times.append(time.monotonic())
        if self.first_call_at is None and method not in self.faults.garbage:
            self.first_call_at = time.monotonic()
        return self.faults.answer(method, message.SerializeToString())

    # -- state files --

    def write_state_files(self, *, checkpoint: bool = True) -> None:
        """Rewrite the checkpoint (unless not `checkpoint`) and each manager state file whose
        content changed, the way the kubelet does."""
        fake_state_files.write_state_files(
            self.node,
            self.checkpoint_path,
            self.cpu_state_path,
            self.memory_state_path,
            checkpoint=checkpoint,
        )


class PodChurn:
    """Pods deleted and recreated the ways that make the Pods API and pod-resources disagree for a
    while, each change told to the kubelet (`changed(checkpoint, dra)`: dra when a pod started
    or ended) as the others are."""

    def __init__(self, node: FakeNode, changed: Callable[[bool, bool], None]) -> None:
        self.node = node
        self.changed = changed
        self.force_deleted: set[tuple[str, str]] = set()  # hidden from the Pods API, still listed
        self.old_pods: dict[str, FakePod] = {}  # uid -> an old pod still terminating under a reused name

    def force_delete(self, namespace: str, pod: str) -> None:
        """`kubectl delete --force`: the API server forgets the pod at once and the Pods API sends
        DELETED while its containers still run, so pod-resources lists it until `free()`."""
        self.force_deleted.add((namespace, pod))
        self.changed(False, False)  # its containers still run: nothing is unprepared yet

    def replace_pod(self, pod: FakePod, *, old_stays: bool = False) -> FakePod:
        """`pod` (another uid) takes the namespace/name of the pod there, as a StatefulSet's pod
        deleted and recreated does: pod-resources shows the new one at once, and the Pods API
        sends its ADDED and the old one's DELETED together. With `old_stays` the old one is still
        terminating: the Pods API keeps showing it, its status updates coming after the new pod's
        ADDED, until `remove_old_pod`. Returns the old pod."""
        old = self.node.pods.pop((pod.namespace, pod.name))
        self.node.add_pod(pod)
        if old_stays:
            self.old_pods[old.uid] = old
        self.changed(any(any(c.devices.values()) for c in pod.containers), True)
        return old

    def update_old_pod(self, uid: str, *, phase: str) -> None:
        """The terminating old pod's late status update (a MODIFIED for its uid)."""
        self.old_pods[uid].phase = phase
        self.changed(False, False)

    def remove_old_pod(self, uid: str) -> None:
        """The terminating old pod is gone: its DELETED, its last event."""
        del self.old_pods[uid]
        self.changed(False, True)

    def old_objects(self, node_name: str) -> list[core_v1_pb2.Pod]:
        """The old pods as the Pods API still shows them."""
        return [pod_object(self.node, pod, node_name) for pod in self.old_pods.values()]
