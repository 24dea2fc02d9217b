"""The source seam (watcher/sources/base.py): a source is one module plus one line where the agent
is composed. A toy source, written here as a newcomer would, reads device taints from a file; the
agent supervises it, `/readyz` shows its status, and its evidence reaches the cycle's conclusion as
a slice taint's would: one device.unhealthy naming the holder, one device.healthy when it clears."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import make_settings, running_agent
from watcher.config import ConfigError
from watcher.model.devicehealth.taints import DeviceTaint
from watcher.model.inventory import Inventory
from watcher.settings import PodsSettings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeClaim, FakeClaimDevice, FakeContainer, FakePod
from watcher.sources.base import Evidence, merged
from watcher.supervision import sleep_or_stop

DRIVER, POOL, DEVICE = "gpu.nvidia.com", "node-a", "gpu-3"


class FileTaints:
    """The toy: device taints as a JSON list in a file, read every 50 ms."""

    name = "file-taints"
    status_key = "file_taints"

    def __init__(self, path: Path, stop: asyncio.Event) -> None:
        self.path = path
        self.stop = stop
        self.taints: tuple[DeviceTaint, ...] | None = None
        self.wake: Callable[[str], None] = lambda _: None  # the agent's, once it runs
        self.reads = 0

    async def run(self) -> None:
        while not self.stop.is_set():
            taints = tuple(DeviceTaint(**t) for t in json.loads(self.path.read_text()))
            self.reads += 1
            if taints != self.taints:
                self.taints = taints
                self.wake("file-taints")
            await sleep_or_stop(self.stop, 0.05)

    async def first_look(self) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"taints": None if self.taints is None else len(self.taints), "reads": self.reads}

    def evidence(self, after: Inventory) -> Evidence:
        return Evidence(taints=self.taints)


def _dra_pod() -> FakePod:
    gpu = FakeClaimDevice(DRIVER, POOL, DEVICE, [f"nvidia.com/gpu={DEVICE}"])
    claim = FakeClaim("ml", "llm-pretrain-0-gpu", [gpu], request="gpu")
    return FakePod("ml", "llm-pretrain-0-abcde", [FakeContainer("trainer", claims=[claim])])


async def test_a_toy_source_is_one_module_and_one_line(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=21)
    fake.node.add_pod(_dra_pod())
    file = short_tmp / "taints.json"
    file.write_text("[]")
    stop = asyncio.Event()
    toy = FileTaints(file, stop)
    settings = dataclasses.replace(make_settings(short_tmp), pods=PodsSettings())
    async with fake, running_agent(settings, fake, sources=[toy]) as run:  # the one line
        toy.wake = run.agent.wake
        try:
            await run.recorder.kinds_after(0, 1)
            await run.recorder.until(lambda: toy.taints == () and run.agent.pods_watch is not None, 10)
            await run.quiet_cycle()
            assert "file-taints" in run.agent.status.liveness().details["tasks"]
            assert run.agent.status.readiness().details["file_taints"]["taints"] == 0
            mark = len(run.recorder.events)

            def health() -> list[Any]:
                return [e for e in run.recorder.events[mark:] if e.kind.startswith("device.")]

            taint = {"driver": DRIVER, "pool": POOL, "device": DEVICE, "key": "example.com/bad"}
            file.write_text(json.dumps([{**taint, "effect": "NoExecute"}]))
            await run.recorder.until(lambda: len(health()) >= 1, 5)
            (failed,) = health()
            assert failed.kind == "device.unhealthy"
            assert failed.details["pods"][0]["name"] == "llm-pretrain-0-abcde"
            assert run.agent.status.readiness().details["file_taints"]["taints"] == 1
            file.write_text("[]")
            await run.recorder.until(lambda: len(health()) >= 2, 5)
            await run.quiet_cycle()
            assert [e.kind for e in health()] == ["device.unhealthy", "device.healthy"]
        finally:
            stop.set()


def test_evidence_merges_what_each_source_says() -> None:
    t = DeviceTaint(DRIVER, POOL, DEVICE, "k")
    assert merged([]) == Evidence()
    both = merged([Evidence(taints=(t,)), Evidence(gone={("ml", "a"): None})])  # type: ignore[dict-item]
    assert both.taints == (t,) and set(both.gone) == {("ml", "a")} and both.pods is None


def test_the_api_connection_is_set_in_one_place() -> None:
    from watcher.settings_file import parse_settings

    sink = {"type": "kubernetes", "server": "https://127.0.0.1:6443"}
    assert parse_settings({"sinks": {"k8s": sink}}).kubernetes.api == "auto"
    both = {"kubernetes": {"server": "https://127.0.0.1:6443"}, "sinks": {"k8s": sink}}
    with pytest.raises(ConfigError, match=r"^sinks\.k8s\.server: .*not in both"):
        parse_settings(both)
    with pytest.raises(ConfigError, match=r"^pods\.resource_slices: moved; set \[resource_slices\] enabled"):
        parse_settings({"pods": {"resource_slices": False}})


def test_the_kubernetes_section_connects_every_kubernetes_sink_and_is_checked() -> None:
    from watcher.settings_file import config_warnings, parse_settings

    settings = parse_settings(
        {"kubernetes": {"server": "http://127.0.0.1:8001"}, "sinks": {"k8s": {"type": "kubernetes"}}}
    )
    (sink,) = settings.sinks
    assert getattr(sink, "server", None) == "http://127.0.0.1:8001"  # what send-test and cleanup use too
    assert any(w.startswith("sinks.k8s.server: ") and "clear text" in w for w in config_warnings(settings))
    alone = parse_settings({"kubernetes": {"api": "on", "server": "http://127.0.0.1:8001"}, "sinks": {}})
    assert any(w.startswith("kubernetes.server: ") for w in config_warnings(alone))
    with pytest.raises(ConfigError, match=r"^kubernetes\.server: .*not an https:// URL"):
        parse_settings({"kubernetes": {"server": "ftp://127.0.0.1"}})


def test_a_second_kubernetes_sink_with_its_own_connection_keeps_its_own_client(tmp_path: Path) -> None:
    from watcher.kubeapi.api import KubeApi
    from watcher.settings_file import parse_settings
    from watcher.sinks.registry import build_sinks
    from watcher.store.store import Store

    here = {"type": "kubernetes", "server": "https://127.0.0.1:6443"}
    there = {"type": "kubernetes", "server": "https://127.0.0.1:7443"}
    settings = parse_settings({"sinks": {"here": here, "there": there}})
    shared = KubeApi(settings.sinks[0], field_manager="test")  # type: ignore[arg-type]
    store = Store(tmp_path / "outbox.db")
    first, second = build_sinks(settings.sinks, node="n", state_dir=tmp_path, store=store, kube_api=shared)
    assert getattr(first, "kube_api", None) is shared
    assert getattr(second, "kube_api", None) is not shared  # another server: never the first's credentials


def test_every_sources_taints_count() -> None:
    a, b = DeviceTaint(DRIVER, POOL, DEVICE, "k"), DeviceTaint(DRIVER, POOL, "gpu-1", "rule")
    assert merged([Evidence(taints=(a,)), Evidence(taints=(b, a))]).taints == (a, b)
    assert merged([Evidence(), Evidence(taints=())]).taints == ()
    assert merged([Evidence(), Evidence()]).taints is None


async def test_a_reload_gives_the_kubernetes_sink_its_new_connection(short_tmp: Path) -> None:
    """SIGHUP with a kubernetes sink's server changed: the reloaded sink uses the new connection
    through the agent's client (nothing else reads through the old one, which is replaced)."""
    from watcher.app import Agent
    from watcher.settings import ResourceSlicesSettings
    from watcher.settings_file import parse_settings
    from watcher.sources.taint_rule_settings import DeviceTaintRulesSettings

    def settings(port: int) -> Any:
        sinks = parse_settings(
            {"sinks": {"k8s": {"type": "kubernetes", "server": f"https://127.0.0.1:{port}"}}}
        )
        return dataclasses.replace(
            make_settings(short_tmp),
            sinks=sinks.sinks,
            resource_slices=ResourceSlicesSettings(enabled=False),
            device_taint_rules=DeviceTaintRulesSettings(enabled=False),
        )

    agent = Agent(settings(6443))
    try:
        assert await agent.open()
        before = agent.kube_api
        assert before is not None and before.connection.server == "https://127.0.0.1:6443"
        agent.started.set()
        await agent.reload(settings(7443))
        after = agent.kube_api
        assert (
            after is not None and after is not before and after.connection.server == "https://127.0.0.1:7443"
        )
        sink = agent.dispatcher.workers["k8s"].sink
        assert getattr(sink, "kube_api", None) is after
    finally:
        await agent.close()
