"""Expected devices (watcher/model/expected.py, watcher/sources/node_expected.py): fewer devices
known to the kubelet than the operator expects is one device.missing, back to the count one
device.missing_resolved; an unhealthy device (still in the Node's capacity), the kubelet's warm-up
and an agent restart open nothing. Pure, then the agent on the fake kubelet with the Node scripted
as the kubelet's device manager reports it (capacity = healthy + unhealthy devices)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import make_settings, running_agent
from testkit.inventories import inventory_of
from watcher.config import ConfigError
from watcher.model.changes import Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.pods import PodMeta
from watcher.model.events import Event, envelope
from watcher.model.expected import Expected, waiting_for
from watcher.settings_file import parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_plugins import Warmup
from watcher.sources.expected_settings import ExpectedSettings
from watcher.sources.node_expected import NodeExpectations, counts_of

GPU = "nvidia.com/gpu"
XGPU = "example.com/gpu"  # the fake kubelet's node has nvidia.com/gpu devices of its own
IDS = frozenset({"gpu0", "gpu1", "gpu2", "gpu3"})


def _look(
    state: Expected,
    ids: frozenset[str],
    capacity: int | None,
    *,
    want: int | None = 4,
    holding: bool = False,
    waiting: int = 0,
) -> tuple[Expected, list[Any]]:
    return state.observe(
        None if want is None else {GPU: want},
        {GPU: ids},
        None if capacity is None else {GPU: capacity},
        waiting={GPU: waiting} if waiting else {},
        holding=holding,
    )


def test_a_vanished_device_is_one_missing_and_its_return_one_resolve() -> None:
    state, changes = _look(Expected(), IDS, 4)
    assert changes == []
    # The plugin drops gpu2: pod-resources at once, the Node's capacity on its next status (lag).
    state, changes = _look(state, IDS - {"gpu2"}, 4)
    assert changes == []  # the Node still says 4: nothing until the kubelet's count agrees
    state, changes = _look(state, IDS - {"gpu2"}, 3)
    (missing,) = changes
    assert missing.kind is Kind.DEVICE_MISSING and missing.severity is Severity.WARNING
    assert missing.details["expected"] == 4 and missing.details["known"] == 3
    assert missing.details["devices"] == ["gpu2"] and missing.details["missing"] == 1
    assert "3 of 4" in missing.summary and "gpu2" in missing.summary
    state, changes = _look(state, IDS - {"gpu2", "gpu3"}, 2)
    assert changes == []  # still one story: a second device going does not page again
    state, changes = _look(state, IDS, 3)  # back in pod-resources before the Node says so
    (resolved,) = changes
    assert resolved.kind is Kind.DEVICE_MISSING_RESOLVED and resolved.details["known"] == 4
    assert _look(state, IDS, 4)[1] == []


def test_an_unhealthy_device_is_not_missing() -> None:
    # The kubelet leaves an unhealthy device out of allocatable but counts it in its capacity.
    state, changes = _look(Expected(), IDS - {"gpu1"}, 4)
    assert changes == [] and state.open == ()


def test_nothing_opens_without_the_nodes_capacity_or_while_the_warm_up_is_held() -> None:
    assert _look(Expected(), IDS - {"gpu1"}, None)[1] == []  # unhealthy or gone? unknown
    assert _look(Expected(), frozenset(), 0, holding=True)[1] == []
    assert _look(Expected(), frozenset(), 0, want=None)[1] == []  # the expectation not read yet


def test_no_device_known_at_all_waits_for_the_warm_up_grace() -> None:
    """An agent started without a baseline in a kubelet's warm-up: pod-resources and the Node both
    say 0 until the plugin registers, and no hold covers it. Not missing before the grace."""
    state = Expected()
    for now in (0.0, 5.0, 59.0):
        state, changes = state.observe({GPU: 4}, {}, {GPU: 0}, waiting={}, holding=False, now=now, grace=60.0)
        assert changes == []
    _, changes = state.observe(
        {GPU: 4}, {GPU: IDS}, {GPU: 4}, waiting={}, holding=False, now=61.0, grace=60.0
    )
    assert changes == []  # the plugin registered: nothing was missing
    state, (missing,) = state.observe({GPU: 4}, {}, {GPU: 0}, waiting={}, holding=False, now=61.0, grace=60.0)
    assert missing.kind is Kind.DEVICE_MISSING and missing.details["known"] == 0  # it stayed away


def test_pods_waiting_make_it_critical() -> None:
    (missing,) = _look(Expected(), IDS - {"gpu0"}, 3, waiting=2)[1]
    assert missing.severity is Severity.CRITICAL and missing.details["pods_waiting"] == 2
    pods = [
        PodMeta("u1", "ml", "a", phase="Pending", wants=(GPU,)),
        PodMeta("u2", "ml", "b", phase="Running", wants=()),
        PodMeta("u3", "ml", "c", phase="Pending", wants=("example.com/nic",)),
    ]
    assert waiting_for(pods, {GPU: 4}) == {GPU: 1}
    assert waiting_for(pods, None) == {}
    # Admitted with its GPU and still starting: it holds what it asked for, it waits for nothing.
    held = inventory_of(["gpu0"], {"ml/a": ["gpu1"]})  # testkit's GPU is nvidia.com/gpu too
    assert waiting_for(pods, {GPU: 4}, held) == {}


def test_a_withdrawn_expectation_resolves_and_the_state_survives_a_restart() -> None:
    state, _ = _look(Expected(), IDS - {"gpu0"}, 3)
    restored = Expected.from_json(state.to_json())
    assert restored == state
    assert _look(restored, IDS - {"gpu0"}, 3)[1] == []  # an agent restart: no second page
    state, (ended,) = restored.observe({}, {GPU: IDS}, {GPU: 3}, waiting={}, holding=False)
    assert ended.kind is Kind.DEVICE_MISSING_RESOLVED and ended.details["withdrawn"] is True
    assert state.open == ()
    assert Expected.from_json({"open": [{"resource": 1}], "complete": []}) == Expected()


def test_one_condition_per_node_and_resource() -> None:
    state, (missing,) = _look(Expected(), IDS - {"gpu0"}, 3)
    _, (resolved,) = _look(state, IDS, 4)
    for change, active in ((missing, True), (resolved, False)):
        event = _event(change)
        cond = condition_of(event)
        assert cond is not None and cond.active is active
        assert cond.key == f"n1/missing/{GPU}" and cond.labels["alertname"] == "PodResourcesDevicesMissing"


def _event(change: Any) -> Event:
    return envelope(change, seq=1, node="n1", cycle="c", before=None, after=None)


def test_counts_come_from_the_named_label_and_the_capacity() -> None:
    settings = ExpectedSettings(devices={"example.com/nic": 2}, labels={GPU: "nvidia.com/gpu.count"})
    node = {
        "metadata": {"labels": {"nvidia.com/gpu.count": "8"}},
        "status": {"capacity": {GPU: "7", "example.com/nic": "2", "cpu": "64"}},
    }
    assert counts_of(node, settings) == ({"example.com/nic": 2, GPU: 8}, {"example.com/nic": 2, GPU: 7}, [])
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "eight"
    assert counts_of(node, settings) == (
        {"example.com/nic": 2},
        {"example.com/nic": 2},
        ["nvidia.com/gpu.count"],
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"devices": {GPU: 0}}, r"^expected\.devices\.nvidia\.com/gpu: out of range"),
        ({"devices": {"gpu": 1}}, r"^expected\.devices\.gpu: not a device resource"),
        ({"labels": {GPU: "a b"}}, r"^expected\.labels\.nvidia\.com/gpu: not a label key"),
        ({"devices": {GPU: 1}, "labels": {GPU: "x"}}, r"^expected\.labels\.nvidia\.com/gpu: .*set one"),
    ],
)
def test_the_settings_are_checked(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_settings({"expected": table, "kubernetes": {"api": "on"}})


def test_check_config_shows_the_expectation_as_written() -> None:
    from watcher.settings_file import printable

    table = {"devices": {"example.com/nic": 2}, "labels": {GPU: "nvidia.com/gpu.count"}}
    shown = printable(parse_settings({"expected": table, "kubernetes": {"api": "on"}}))["expected"]
    assert shown == {**table, "interval": 30.0}  # not "***": a count or a label key is no secret


def test_an_expectation_needs_the_api_server() -> None:
    with pytest.raises(ConfigError, match=r"^expected: needs the API server"):
        parse_settings({"expected": {"devices": {GPU: 2}}})
    assert not parse_settings({}).expected.configured


class _Wake:
    """A trigger until the agent's exists (the source is made before the agent)."""

    def fire(self, reason: str, *, urgent: bool = False) -> None:
        return None


class _DirectApi:
    """KubeApi's one method the source uses, without a server: the scripted Node answers."""

    async def call(self, request: Awaitable[Any]) -> Any:
        return await request


class _ScriptedNode(NodeExpectations):
    """The real source, its Node read replaced by what the kubelet's device manager would post:
    capacity = every device it knows, healthy or not; `labels` as the operator set them."""

    def __init__(self, fake: FakeKubelet, labels: dict[str, str], stop: asyncio.Event, **kw: Any) -> None:
        super().__init__(_DirectApi(), node="n1", stop=stop, **kw)  # type: ignore[arg-type]
        self.fake = fake
        self.labels = labels

    async def _get(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for resource, _ in self.fake.node.devices:
            counts.setdefault(resource, 0)
            # After a kubelet restart the device manager counts a plugin's devices from its
            # registration on: 0 until then (upstream's devicemanager readCheckpoint, 1.37.2:
            # "the resource capacity will stay zero till the corresponding device plugin
            # re-registers").
            if resource not in self.fake.plugins.down:
                counts[resource] += 1
        capacity = {r: str(n) for r, n in counts.items()}
        return {"metadata": {"labels": dict(self.labels)}, "status": {"capacity": capacity}}


async def test_the_agent_pages_a_dropped_device_once_and_resolves_it(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=40)
    for n in range(4):
        fake.add_device(XGPU, f"gpu{n}", [n % 2])
    stop = asyncio.Event()
    settings = make_settings(short_tmp)
    wanted = ExpectedSettings(labels={XGPU: "example.com/gpu.count"}, interval=1.0)
    source = _ScriptedNode(fake, {"example.com/gpu.count": "4"}, stop, settings=wanted, trigger=_Wake())
    async with fake, running_agent(settings, fake, sources=[source]) as run:
        source.trigger = run.agent.notifier.trigger
        try:
            await run.recorder.kinds_after(0, 1)
            await run.recorder.until(lambda: source.expected == {XGPU: 4}, 10)
            await run.quiet_cycle()
            mark = len(run.recorder.events)
            fake.make_unhealthy(XGPU, "gpu1")  # unhealthy: still known, no missing
            await run.recorder.until(lambda: "device.removed" in run.recorder.kinds(mark), 10)
            await source.read()
            await run.quiet_cycle()
            assert "device.missing" not in run.recorder.kinds(mark)
            fake.remove_device(XGPU, "gpu3")  # the plugin drops it from its list
            await source.read()
            await run.recorder.until(lambda: "device.missing" in run.recorder.kinds(mark), 10)
            await run.quiet_cycle()
            (missing,) = [e for e in run.recorder.events[mark:] if e.kind == "device.missing"]
            assert missing.details["expected"] == 4 and missing.details["known"] == 3
            assert missing.details["devices"] == ["gpu1", "gpu3"]  # gpu1 unhealthy: left allocatable too
            fake.add_device(XGPU, "gpu3", [1])
            await run.recorder.until(lambda: "device.missing_resolved" in run.recorder.kinds(mark), 10)
            await source.read()
            await run.quiet_cycle()
            kinds = run.recorder.kinds(mark)
            assert kinds.count("device.missing") == 1 and kinds.count("device.missing_resolved") == 1
        finally:
            stop.set()


async def test_a_kubelet_restart_in_the_fake_is_no_missing_device(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=42)
    for n in range(4):
        fake.add_device(XGPU, f"gpu{n}", [n % 2])
    stop = asyncio.Event()
    wanted = ExpectedSettings(devices={XGPU: 4}, interval=1.0)
    source = _ScriptedNode(fake, {}, stop, settings=wanted, trigger=_Wake())
    async with fake, running_agent(make_settings(short_tmp), fake, sources=[source]) as run:
        source.trigger = run.agent.notifier.trigger
        try:
            await run.recorder.kinds_after(0, 1)
            await run.recorder.until(lambda: source.capacity == {XGPU: 4}, 10)
            await run.quiet_cycle()
            mark = len(run.recorder.events)
            fake.plugins.warmup = Warmup(plugin_delay=(0.5, 0.8), pods_delay=(0.0, 0.2))
            await fake.restart()
            await source.read()
            assert source.capacity == {XGPU: 0}  # the warm-up: no device counted yet
            await run.recorder.until(lambda: "kubelet.restarted" in run.recorder.kinds(mark), 10)
            await fake.plugins.wait_settled()
            await run.released()
            await source.read()
            await run.quiet_cycle()
            assert source.capacity == {XGPU: 4}
            assert "device.missing" not in run.recorder.kinds(mark), run.recorder.kinds(mark)
        finally:
            stop.set()


async def _one_life(fake: FakeKubelet, short_tmp: Path, first: bool) -> None:
    """One run of the agent on the same state dir: the first sees gpu3 dropped, the second it back."""
    stop = asyncio.Event()
    wanted = ExpectedSettings(devices={XGPU: 4}, interval=1.0)
    source = _ScriptedNode(fake, {}, stop, settings=wanted, trigger=_Wake())
    async with running_agent(make_settings(short_tmp), fake, sources=[source]) as run:
        source.trigger = run.agent.notifier.trigger
        try:
            await run.recorder.kinds_after(0, 1)
            await run.recorder.until(lambda: source.capacity is not None, 10)
            await run.quiet_cycle()
            if first:
                fake.remove_device(XGPU, "gpu3")
                await source.read()
                await run.recorder.until(lambda: "device.missing" in run.recorder.kinds(), 10)
                return
            assert "device.missing" not in run.recorder.kinds()  # saved: not told again
            fake.add_device(XGPU, "gpu3", [1])
            await source.read()
            await run.recorder.until(lambda: "device.missing_resolved" in run.recorder.kinds(), 10)
            (resolved,) = [e for e in run.recorder.events if e.kind == "device.missing_resolved"]
            assert resolved.details["devices"] == ["gpu3"] and resolved.details["known"] == 4
        finally:
            stop.set()


async def test_an_agent_restart_neither_pages_it_again_nor_loses_its_resolve(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=41)
    for n in range(4):
        fake.add_device(XGPU, f"gpu{n}", [n % 2])
    async with fake:
        await _one_life(fake, short_tmp, first=True)
        await _one_life(fake, short_tmp, first=False)


def test_the_node_condition_is_true_while_missing_and_false_when_back() -> None:
    from watcher.sinks.kubernetes.condition_plan import OWNER_MARK, is_owned
    from watcher.sinks.kubernetes.episodes import MISSING

    assert MISSING.type_of("nvidia.com/gpu") == "NvidiaGpuDevicesMissing"
    state, (missing,) = _look(Expected(), IDS - {"gpu0"}, 3)
    _, (resolved,) = _look(state, IDS, 4)
    opened = MISSING.after([_event(missing)], {})
    (cond,) = MISSING.conditions(opened)
    assert (cond.type, cond.status, cond.reason) == ("NvidiaGpuDevicesMissing", "True", "DevicesMissing")
    assert cond.message.startswith(OWNER_MARK) and "3 of 4" in cond.message
    assert is_owned(cond.type, cond.message) and not is_owned(cond.type, "another writer's")
    # A restart: the state saved by the sink carries it, so a start's prune keeps it True.
    assert MISSING.conditions(MISSING.after([], opened)) == [cond]
    (back,) = MISSING.conditions(MISSING.after([_event(resolved)], opened))
    assert (back.type, back.status, back.reason) == ("NvidiaGpuDevicesMissing", "False", "DevicesAsExpected")


def test_a_pending_pods_extended_limits_are_what_it_waits_for() -> None:
    from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2
    from watcher.sources.pods_api.decoding import pod_meta

    pod = core_v1_pb2.Pod(metadata=meta_v1_pb2.ObjectMeta(name="train-0", namespace="ml", uid="u-9"))
    main = pod.spec.containers.add(name="main")
    for name in (GPU, "cpu", "memory", "hugepages-2Mi"):
        main.resources.limits[name].string = "1"
    pod.spec.initContainers.add(name="init").resources.limits["example.com/nic"].string = "1"
    main.resources.limits["example.com/fpga"].string = "0"  # asks nothing
    pod.status.phase = "Pending"
    assert pod_meta(pod.SerializeToString(), labels=()).wants == ("example.com/nic", GPU)
    pod.status.phase = "Running"  # admitted: it holds what it asked for, and decodes as before
    assert pod_meta(pod.SerializeToString(), labels=()).wants == ()


def test_a_shortfall_the_devices_own_pages_cover_pages_no_second_time() -> None:
    """Every device that left allocatable while the agent watched has its own page (device.removed,
    open while it is gone): a device.missing for the same GPUs is told, never paged again. One the
    agent did not see happen, or one that pods wait for, pages."""
    state, _ = _look(Expected(), IDS, 4)
    state, (seen,) = _look(state, IDS - {"gpu2"}, 3)
    assert seen.details["pages"] is False and condition_of(_event(seen)) is None
    _, (back,) = _look(state, IDS, 4)
    assert back.details["pages"] is False and condition_of(_event(back)) is None
    assert Expected.from_json(state.to_json()).open == state.open  # a restart keeps the choice
    # Never seen complete: which devices went is unknown, so nothing else paged for them.
    _, (unseen,) = _look(Expected(), IDS - {"gpu2"}, 3)
    assert unseen.details["pages"] is True and condition_of(_event(unseen)) is not None
    # Pods wait for the resource: critical, and a page of its own.
    state, _ = _look(Expected(), IDS, 4)
    _, (waited,) = _look(state, IDS - {"gpu2"}, 3, waiting=1)
    assert waited.details["pages"] is True and condition_of(_event(waited)) is not None
