"""Upstream's DRA test driver as a kubelet plugin (peers/cmd/dra-test-driver, driven by
testkit/dra_driver.py) against the real API server (kube-testcluster): the ResourceSlice it
publishes for its node, taints republished and removed, its sockets under the kubelet root, and
what a kubelet would meet on them, played here with raw gRPC calls: the registration service the
plugin watcher calls, and the health stream, muted and not. No kubelet runs."""

from __future__ import annotations

import asyncio
import contextlib
import stat
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from testkit.changes import Changes
from testkit.dra_driver import ControlError, DraDriver
from testkit.kube_testcluster import KubeTestCluster
from testkit.peers import peer
from testkit.protowire import every, fields, first
from testkit.waiting import wait_until

pytestmark = pytest.mark.e2e

DRIVER = "gpu.test.example.com"
DEVICES = ("gpu0", "gpu1")
REGISTRATION = "/pluginregistration.Registration/"
HEALTH = "/v1.DRAResourceHealth/NodeWatchResources"
HEALTHY, UNHEALTHY = 1, 2  # k8s.io/kubelet/pkg/apis/dra-health/v1 HealthStatus
XID = {"key": "example.com/xid", "value": "79", "effect": "NoExecute"}


def _slices(cluster: KubeTestCluster, node: str) -> list[dict[str, Any]]:
    listed = cluster.get("resourceslices")["items"]
    return [s for s in listed if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]


def _taints(slice_: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Device -> its taints as the driver was told them (the server's timeAdded left out)."""
    return {
        d["name"]: [{k: t[k] for k in ("key", "value", "effect")} for t in d.get("taints", [])]
        for d in slice_["spec"]["devices"]
    }


async def _published(
    cluster: KubeTestCluster, node: str, test: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The one ResourceSlice of the driver for the node, once `test` holds for it."""
    found: list[dict[str, Any]] = []

    async def holds() -> bool:
        found[:] = await asyncio.to_thread(_slices, cluster, node)
        return len(found) == 1 and test(found[0])

    await wait_until(holds, 20, interval=0.2, what=what)
    return found[0]


@pytest.fixture
def node(kube_cluster: KubeTestCluster) -> Iterator[str]:
    """A Node of its own: the ResourceSlice controller reads its uid for the slice's owner, and
    without the Node it publishes nothing. kube-testcluster garbage-collects nothing, so the
    slices go by hand."""
    name = f"dra-{uuid.uuid4().hex[:8]}"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    for slice_ in _slices(kube_cluster, name):
        kube_cluster.kubectl("delete", "resourceslice", slice_["metadata"]["name"], "--ignore-not-found")
    kube_cluster.kubectl("delete", "node", name, "--ignore-not-found")


def _driver(short_tmp: Path, cluster: KubeTestCluster, node: str, *, health: bool = True) -> DraDriver:
    return DraDriver(
        peer("dra-test-driver"),
        short_tmp / "kubelet",
        kubeconfig=cluster.admin_kubeconfig,
        node=node,
        driver=DRIVER,
        devices=DEVICES,
        health=health,
    )


@pytest.fixture
async def driver(short_tmp: Path, kube_cluster: KubeTestCluster, node: str) -> AsyncIterator[DraDriver]:
    async with _driver(short_tmp, kube_cluster, node) as started:
        yield started


def _raw(message: bytes) -> bytes:
    """Bytes in and out: the messages are read with testkit.protowire, no generated code."""
    return message


async def _call(socket: Path, method: str, request: bytes = b"") -> bytes:
    async with aio.insecure_channel(f"unix:{socket}") as channel:
        return await channel.unary_unary(method, _raw, _raw)(request, timeout=5)


async def _plugin_info(driver: DraDriver) -> dict[str, Any]:
    """GetInfo on the registration socket, as the kubelet's plugin watcher calls it."""
    info = await _call(driver.registration_socket, REGISTRATION + "GetInfo")
    one = {n: (first(info, n) or b"").decode() for n in (1, 2, 3)}
    versions = [v.decode() for v in every(info, 4)]
    return {"type": one[1], "name": one[2], "endpoint": one[3], "versions": versions}


def _is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.stat().st_mode)


Report = dict[tuple[str, str], tuple[int, str]]


def _report(message: bytes) -> Report:
    """A NodeWatchResourcesResponse: (pool, device) -> (health, message)."""
    report: Report = {}
    for device in every(message, 1):
        ident = first(device, 1) or b""
        pool, name = ((first(ident, n) or b"").decode() for n in (1, 2))
        health = next((v for n, v in fields(device) if n == 2 and isinstance(v, int)), 0)
        report[pool, name] = (health, (first(device, 5) or b"").decode())
    return report


class HealthWatch:
    """The health stream a kubelet opens on the plugin socket; every report it receives."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.reports: list[Report] = []
        self.changes = Changes()
        self.failure: BaseException | None = None

    async def __aenter__(self) -> HealthWatch:
        self.channel = aio.insecure_channel(f"unix:{self.socket}")
        self.call = self.channel.unary_stream(HEALTH, _raw, _raw)(b"")
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async for message in self.call:
                self.reports.append(_report(message))
                self.changes.notify()
        except aio.AioRpcError as error:
            self.failure = error
            self.changes.notify()

    def _check(self) -> None:
        if self.failure is not None:
            raise AssertionError(f"the health stream failed: {self.failure}")

    async def until(self, predicate: Callable[[list[Report]], bool], what: str) -> None:
        await self.changes.until(
            lambda: predicate(self.reports),
            15,
            check=self._check,
            describe=lambda: f"{what}: {self.reports[-3:]}",
        )

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.channel.close()


async def test_it_publishes_its_pool_for_the_node_and_listens_under_the_kubelet_root(
    driver: DraDriver, kube_cluster: KubeTestCluster, node: str
) -> None:
    published = await _published(kube_cluster, node, lambda _s: True, "a ResourceSlice for the node")
    assert published["spec"]["pool"]["name"] == node  # the pool is named after the node by default
    assert [d["name"] for d in published["spec"]["devices"]] == list(DEVICES)
    assert _taints(published) == {"gpu0": [], "gpu1": []}
    node_uid = kube_cluster.get("node", node)["metadata"]["uid"]
    (owner,) = published["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)
    assert (
        _is_socket(driver.registration_socket)
        and driver.registration_socket.parent.name == "plugins_registry"
    )
    assert (
        _is_socket(driver.plugin_socket) and driver.plugin_socket.parent == driver.root / "plugins" / DRIVER
    )
    state = await driver.state()
    assert state["registered"] is False  # no kubelet has called it
    assert state["prepared"] == [] and state["taints"] == {} and state["errors"] == []
    assert (state["pool"], state["devices"], state["health_service"]) == (node, list(DEVICES), True)


async def test_a_taint_is_republished_replaced_and_removed(
    driver: DraDriver, kube_cluster: KubeTestCluster, node: str
) -> None:
    await _published(kube_cluster, node, lambda _s: True, "a ResourceSlice for the node")
    await driver.taint("gpu1", XID["key"], XID["value"], XID["effect"])
    tainted = await _published(kube_cluster, node, lambda s: _taints(s)["gpu1"] != [], "gpu1 tainted")
    assert _taints(tainted) == {"gpu0": [], "gpu1": [XID]}
    (stored,) = next(d for d in tainted["spec"]["devices"] if d["name"] == "gpu1")["taints"]
    assert stored["timeAdded"]  # set by the API server; the controller keeps it (no update loop)
    # The same key again replaces the taint rather than adding a second one.
    await driver.taint("gpu1", XID["key"], "48", "NoSchedule")
    replaced = {**XID, "value": "48", "effect": "NoSchedule"}
    await _published(kube_cluster, node, lambda s: _taints(s)["gpu1"] == [replaced], "gpu1's taint replaced")
    assert (await driver.state())["taints"]["gpu1"] == [replaced]
    await driver.untaint("gpu1", XID["key"])
    await _published(kube_cluster, node, lambda s: _taints(s) == {"gpu0": [], "gpu1": []}, "the taint gone")
    assert (await driver.state())["taints"] == {}
    with pytest.raises(ControlError) as absent:
        await driver.untaint("gpu1", XID["key"])
    assert absent.value.status == 404
    with pytest.raises(ControlError) as unknown:
        await driver.taint("gpu7", XID["key"])
    assert unknown.value.status == 404 and "gpu7" in unknown.value.error
    assert (await driver.state())["errors"] == []
    # The effect is the API server's to judge; publishing is asynchronous, so its refusal shows
    # in the state's errors (upstream's controller retries it with backoff).
    await driver.taint("gpu0", XID["key"], effect="Bogus")

    async def refused() -> bool:
        return any('Unsupported value: "Bogus"' in e["error"] for e in (await driver.state())["errors"])

    await wait_until(refused, 20, interval=0.2, what="the API server's refusal of the effect")


async def test_the_plugin_watcher_meets_its_registration_service(driver: DraDriver) -> None:
    info = await _plugin_info(driver)
    assert (info["type"], info["name"], info["endpoint"]) == ("DRAPlugin", DRIVER, str(driver.plugin_socket))
    assert set(info["versions"]) == {
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    }
    assert (await driver.state())["registered"] is False
    await _call(driver.registration_socket, REGISTRATION + "NotifyRegistrationStatus", b"\x08\x01")
    assert (await driver.state())["registered"] is True
    # A new process has to be registered again, as after a driver pod's restart.
    await driver.restart()
    assert (await driver.state())["registered"] is False
    assert (await _plugin_info(driver))["name"] == DRIVER


async def test_health_reports_reach_the_stream_and_a_muted_driver_sends_none(
    driver: DraDriver, node: str
) -> None:
    async with HealthWatch(driver.plugin_socket) as watch:
        # Upstream's driver first reports what it has been told: nothing yet.
        await watch.until(lambda reports: len(reports) >= 1, "the first report")
        assert watch.reports[0] == {}
        await driver.set_health(None, "gpu0", "Unhealthy", "XID 79")
        await watch.until(lambda r: (node, "gpu0") in r[-1], "gpu0 reported")
        assert watch.reports[-1] == {(node, "gpu0"): (UNHEALTHY, "XID 79")}

        await driver.mute()
        before = await driver.state()
        assert before["muted"] and before["health_streams"] == 1
        await driver.set_health(None, "gpu0", "Healthy")

        async def withheld_two() -> bool:
            return bool((await driver.state())["reports_withheld"] >= before["reports_withheld"] + 2)

        # The update's report and a periodic one (every 2 s) withheld: the stream stays open.
        await wait_until(withheld_two, 10, interval=0.2, what="two reports withheld")
        during = await driver.state()
        assert during["health_streams"] == 1
        # Reports go out one at a time, so every one sent before the mute has arrived by now;
        # the client got exactly those, and none carries the update made while muted.
        await watch.until(lambda r: len(r) >= during["reports_sent"], "the reports sent before the mute")
        assert len(watch.reports) == during["reports_sent"]
        assert all(r.get((node, "gpu0"), (0, ""))[0] != HEALTHY for r in watch.reports)

        await driver.unmute()
        await watch.until(lambda r: r[-1].get((node, "gpu0")) == (HEALTHY, ""), "gpu0 Healthy after unmute")
        assert not (await driver.state())["muted"]


async def test_without_health_it_serves_and_advertises_none(
    short_tmp: Path, kube_cluster: KubeTestCluster, node: str
) -> None:
    async with _driver(short_tmp, kube_cluster, node, health=False) as driver:
        info = await _plugin_info(driver)
        assert set(info["versions"]) == {"v1.DRAPlugin", "v1beta1.DRAPlugin"}
        with pytest.raises(aio.AioRpcError) as refused:
            async with aio.insecure_channel(f"unix:{driver.plugin_socket}") as channel:
                await channel.unary_stream(HEALTH, _raw, _raw)(b"", timeout=5).read()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(ControlError) as off:
            await driver.set_health(None, "gpu0", "Unhealthy")
        assert off.value.status == 409
        assert (await driver.state())["health_service"] is False


async def test_a_restart_republishes_what_the_new_process_knows(
    driver: DraDriver, kube_cluster: KubeTestCluster, node: str
) -> None:
    await driver.taint("gpu0", XID["key"], XID["value"], XID["effect"])
    await _published(kube_cluster, node, lambda s: _taints(s)["gpu0"] == [XID], "gpu0 tainted")
    await driver.stop()
    # Upstream's Stop closes its listeners, which removes the sockets: the plugin watcher sees
    # the registration socket go.
    assert not driver.registration_socket.exists() and not driver.plugin_socket.exists()
    assert not driver.control_socket.exists()
    await driver.start()
    assert _is_socket(driver.registration_socket) and _is_socket(driver.plugin_socket)
    assert (await driver.state())["taints"] == {}
    # The new process knows no taint, so the one slice loses it.
    await _published(
        kube_cluster, node, lambda s: _taints(s) == {"gpu0": [], "gpu1": []}, "untainted after restart"
    )
    await driver.taint("gpu1", XID["key"], XID["value"], XID["effect"])
    after = await _published(
        kube_cluster, node, lambda s: _taints(s)["gpu1"] == [XID], "gpu1 tainted after restart"
    )
    assert [d["name"] for d in after["spec"]["devices"]] == list(DEVICES)
