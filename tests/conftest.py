"""Shared fixtures: short socket directories, a running fake kubelet, a task-leak guard,
certificates for TLS tests, the real Kubernetes API server (kube-testcluster), and the HTTP sinks'
receivers and sinks."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import hypothesis
import pytest
import pytest_asyncio
import structlog

from testkit import tiers
from testkit.certificates import make_pki
from testkit.container_node import ContainerCluster, ContainerNode, start_container_cluster
from testkit.deployed import IMAGE, agent_image
from testkit.disks import FailingDisk, tmpfs
from testkit.disks import failing_disk as make_failing_disk
from testkit.dispatching import open_outbox
from testkit.fake_kubelets import StartKubelet
from testkit.http_sinks import NODE as SINK_NODE
from testkit.http_sinks import PD_KEY, SIGNING_SECRET
from testkit.kube_controllers import KubeControllers, start_kube_controllers
from testkit.kube_reporting import Placement, install_reporting, place_agent
from testkit.kube_testcluster import KubeTestCluster, start_kube_testcluster
from testkit.kubelet_lite import KubeletLite
from testkit.peers import peer
from testkit.permissions import umask
from testkit.planted_secret import PLANTED_SECRET
from testkit.real_node import RealNode
from testkit.receiver import Receiver
from testkit.receivers import PagerDutyReceiver, SlackReceiver, WebhookReceiver
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.base import BaseSinkSettings, Sink
from watcher.sinks.registry import build_sink
from watcher.store.store import Store

ReceiverT = TypeVar("ReceiverT", bound=Receiver)

# Properties are about what a function returns, not how fast: under `make test`'s workers on two
# cores an example can take longer than Hypothesis' 200 ms default deadline and fail as "flaky".
hypothesis.settings.register_profile(
    "pod-resources-watcher",
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("pod-resources-watcher")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="prw-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    """A fake kubelet serving the built-in node under `short_tmp`."""
    fake = FakeKubelet(short_tmp, seed=1234)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop(remove_socket=True)


@pytest.fixture
async def start_kubelet(short_tmp: Path) -> AsyncIterator[StartKubelet]:
    """`await start_kubelet(seed=1)`: a fake kubelet started at short_tmp/kubelet, where
    `make_settings(short_tmp)` looks (testkit.fake_kubelets); each stopped after the test."""
    starter = StartKubelet(short_tmp)
    try:
        yield starter
    finally:
        await starter.stop_all()


@pytest.fixture
async def kubelet_lite(short_tmp: Path) -> AsyncIterator[KubeletLite]:
    """kubelet-lite (the Go test peer on upstream's device manager and pod-resources server)
    serving short_tmp/kubelet, where `make_settings(short_tmp)` looks; no plugins yet. Every
    process it or its plugins started is stopped afterwards, whatever the test did."""
    async with KubeletLite(peer("kubelet-lite"), peer("device-plugin"), short_tmp / "kubelet") as lite:
        yield lite


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Tests that run the CLI in-process configure logging onto a stream pytest closes
    afterwards; put logging back so no test depends on which ran before it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    # Let cancelled tasks finish unwinding before judging.
    for _ in range(3):
        await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for t in leaked:
        t.cancel()
    assert not leaked, f"test leaked tasks: {leaked}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test whose captured output (stdout, stderr, log records) holds the planted secret fails."""
    outcome = yield
    report = outcome.get_result()
    leaked = [name for name, text in report.sections if PLANTED_SECRET in text]
    if leaked and report.passed:
        report.outcome = "failed"
        report.longrepr = f"the planted secret appeared in captured output: {', '.join(leaked)}"


# --- filesystems that really fill up or fail ---


@pytest.fixture
def tiny_filesystem(short_tmp: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs as the state directory: one that can really fill up."""
    with tmpfs(short_tmp / "state", "size=2m") as path:
        yield path


@pytest.fixture
def read_only_state(short_tmp: Path) -> Iterator[Path]:
    """A read-only tmpfs as the state directory; `mount -o remount,rw` makes it writable."""
    with tmpfs(short_tmp / "state", "ro,size=2m") as path:
        yield path


@pytest.fixture
def failing_disk(short_tmp: Path) -> Iterator[FailingDisk]:
    """The state directory on a disk that can fail under the agent (root, loop devices, ext4)."""
    with make_failing_disk(short_tmp / "state") as disk:
        yield disk


# --- certificates (the `openssl` command) ---


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate from it; and a client
    certificate from another CA."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common default umask, under which files came out 0644 and directories 0755."""
    with umask(0o022):
        yield


# --- the real Kubernetes API server (the Go peer kube-testcluster) ---


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestCluster]:
    """One kube-testcluster (etcd and upstream's kube-apiserver) for the whole session: starting it
    costs seconds. Tests share it, so each names its own objects uniquely. The static-token user
    `viewer` (group `viewers`) is granted nothing."""
    with start_kube_testcluster(tmp_path_factory.mktemp("kube"), {"viewer": ["viewers"]}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reporting(kube_cluster: KubeTestCluster) -> KubeTestCluster:
    """The session's cluster with the shipped RBAC and admission policy in force
    (deploy/kubernetes/reporting), installed again by each module that asks."""
    asyncio.run(install_reporting(kube_cluster))
    return kube_cluster


@pytest.fixture
def placed(reporting: KubeTestCluster, request: pytest.FixtureRequest) -> Placement:
    """The agent's Pod on a Node of its own in `reporting`, named after the test (shortened to a
    DNS label: no brackets or underscores)."""
    tag = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())[:20].strip("-")
    return place_agent(reporting, tag)


# --- the upstream kubelet (the Go peers kubelet and fake-cri) ---


@pytest.fixture
async def real_node(kube_cluster: KubeTestCluster, short_tmp: Path) -> AsyncIterator[RealNode]:
    """Upstream's kubelet on a fake CRI, registered with the session's API server as a Node of
    its own (a fresh name: tests share the API server), Ready and schedulable; no plugins yet.
    Stopped, and the Node and its pods deleted, afterwards."""
    async with RealNode(kube_cluster, short_tmp / "node", f"node-{uuid.uuid4().hex[:8]}") as node:
        yield node


@pytest.fixture(scope="session")
def kube_controllers(
    kube_cluster: KubeTestCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeControllers]:
    """Upstream's scheduler, resourceclaim and Job controllers (peers/cmd/kube-controllers) against
    the session's cluster, for tests that create Jobs and claims as users do. One for the session:
    two schedulers or Job controllers on one cluster would race for the same pods."""
    with start_kube_controllers(kube_cluster, tmp_path_factory.mktemp("kube-controllers")) as running:
        yield running


@pytest.fixture
async def scheduled_node(
    kube_cluster: KubeTestCluster, kube_controllers: KubeControllers, short_tmp: Path
) -> AsyncIterator[RealNode]:
    """`real_node`, on a cluster whose scheduler and controllers run."""
    async with RealNode(kube_cluster, short_tmp / "node", f"node-{uuid.uuid4().hex[:8]}") as node:
        yield node


# --- a node with a real container runtime (containerd, runc, CNI; testkit/container_node.py) ---


@pytest.fixture(scope="module")
def container_cluster() -> Iterator[ContainerCluster]:
    """An API server of its own serving beyond 127.0.0.1 (the shared one stays on loopback) and
    kube-controllers with the scheduler, DaemonSet, garbage-collector and root-CA controllers,
    for container nodes. One per module: its tests share it."""
    directory = Path(tempfile.mkdtemp(prefix="prw-cc-", dir="/tmp"))
    try:
        with start_container_cluster(directory) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def container_node(container_cluster: ContainerCluster) -> AsyncIterator[ContainerNode]:
    """A ContainerNode of `container_cluster`, Ready, for the module (tests using it run in the
    module's event loop: `pytest.mark.asyncio(loop_scope="module")`). Stopped afterwards, with
    nothing left on the host."""
    directory = Path(tempfile.mkdtemp(prefix="prw-cn-", dir="/tmp"))  # short: socket paths
    try:
        async with container_cluster.node(directory / "node", f"cnode-{uuid.uuid4().hex[:6]}") as node:
            yield node
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def image_node(container_node: ContainerNode) -> ContainerNode:
    """`container_node` with the agent's image (`make image`; built now if missing or stale)
    imported into its containerd, for tests of the deployed agent."""
    archive = await asyncio.to_thread(agent_image)
    assert IMAGE in await container_node.import_image(archive)
    return container_node


# --- the HTTP sinks against their receivers (tests/test_sink_*.py; testkit/http_sinks.py) ---


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[ReceiverT], Awaitable[ReceiverT]]]:
    """Start receivers on 127.0.0.1; they are closed after the test."""
    started: list[Receiver] = []

    async def start(receiver: ReceiverT) -> ReceiverT:
        started.append(await receiver.start())
        return receiver

    yield start
    for receiver in reversed(started):
        await receiver.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A real outbox: the dispatcher's queues, and the KeyValue the PagerDuty sink keeps."""
    async with open_outbox(tmp_path / "outbox.db") as outbox:
        yield outbox


@pytest.fixture
async def make_sink(
    serve: Callable[[Receiver], Awaitable[Receiver]], store: Store, tmp_path: Path
) -> AsyncIterator[Callable[[BaseSinkSettings], Sink]]:
    """Build sinks with `build_sink`; closed (before the receivers) after the test."""
    made: list[Sink] = []

    def make(cfg: BaseSinkSettings) -> Sink:
        sink = build_sink(cfg, node=SINK_NODE, state_dir=tmp_path, store=store)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        await sink.close()


@pytest.fixture
async def slack(serve: Callable[[SlackReceiver], Awaitable[SlackReceiver]]) -> SlackReceiver:
    return await serve(SlackReceiver(rate=1.0))


@pytest.fixture
async def pagerduty(serve: Callable[[PagerDutyReceiver], Awaitable[PagerDutyReceiver]]) -> PagerDutyReceiver:
    return await serve(PagerDutyReceiver())


@pytest.fixture
async def hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver())


@pytest.fixture
async def signed_hook(serve: Callable[[WebhookReceiver], Awaitable[WebhookReceiver]]) -> WebhookReceiver:
    return await serve(WebhookReceiver(secret=SIGNING_SECRET))


@pytest.fixture
def pd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """${PD_ROUTING_KEY}, which `pd_config` names, set to PD_KEY."""
    monkeypatch.setenv("PD_ROUTING_KEY", PD_KEY)


@pytest.fixture
def signing_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SIGNING_SECRET", SIGNING_SECRET)


# --- the fast tier (`make test-fast`): computed, never listed (testkit/tiers.py) ---


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `fast` every test that needs nothing outside its process (testkit/tiers.py)."""
    for item in items:
        if tiers.is_fast(item):
            item.add_marker(pytest.mark.fast)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m fast` alone, a module that can hold no fast test is not even imported: the
    fast tier's run is mostly collecting, and most of that is rewriting asserts."""
    if config.option.markexpr != "fast" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix == ".py" and not tiers.may_hold_fast_tests(collection_path):
        return True
    return None


@pytest.fixture(autouse=True)
def _fast_stays_inside(request: pytest.FixtureRequest) -> Iterator[None]:
    """A fast test that starts a process or opens a socket fails: what reading the code missed."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    with tiers.forbid_outside(request.node.nodeid):
        yield
