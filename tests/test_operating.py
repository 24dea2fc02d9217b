"""Operating the agent: HTTP endpoints and metrics, reload, send-test, snapshots and logs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from testkit.agent import Running, make_settings, running_agent
from testkit.changes import Changes
from testkit.fake_kubelets import StartKubelet
from testkit.http_server import HttpServer
from testkit.planted_secret import PLANTED_SECRET
from testkit.processes import fake_kubelet_process
from testkit.tools import tool
from watcher.cli import main
from watcher.secrets import Secret
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.sinks.webhook import WebhookSinkSettings

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parent.parent


def _url(run: Running, path: str) -> str:
    assert run.agent.http is not None
    return f"http://127.0.0.1:{run.agent.http.bound_port}{path}"


async def _get(run: Running, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    await run.recorder.until(lambda: run.agent.http is not None and run.agent.http.bound_port is not None)
    async with aiohttp.ClientSession() as session, session.get(_url(run, path), headers=headers) as response:
        return response.status, await response.text()


def _sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        if "{" in metric:
            base, _, rest = metric.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(",")))
        else:
            base, got = metric, ""
        if base == name and got == want:
            return float(value)
    raise AssertionError(f"no sample {name}{{{want}}}")


def _promtool(text: str) -> None:
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_metrics_pass_promtool_and_show_the_scenario(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        fake.add_device(GPU, "GPU-new", (1,))
        await run.recorder.kinds_after(mark, 2)
        inference_gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
        fake.make_unhealthy(GPU, inference_gpu)
        await run.recorder.kinds_after(mark, 4)
        await run.quiet_cycle()
        await run.recorder.until(lambda: run.agent.dispatcher.workers["audit"].counts["delivered"] == 5)
        status, text = await _get(run, "/metrics")
    assert status == 200
    _promtool(text)
    p = "pod_resources_watcher"
    # 8 GPUs + the hot-plugged one - the failed one.
    assert _sample(text, f"{p}_resource_allocatable", resource=GPU, numa="all") == 8
    assert _sample(text, f"{p}_resource_allocatable", resource=GPU, numa="1") == 4
    assert _sample(text, f"{p}_resource_free", resource=GPU, numa="all") == 4
    assert _sample(text, f"{p}_resource_allocatable", resource="cpu", numa="all") == 92
    assert _sample(text, f"{p}_memory_allocatable_bytes", type="hugepages-1Gi", numa="0") == 32 * 1024**3
    assert _sample(text, f"{p}_events_total", kind="device.added") == 1
    assert _sample(text, f"{p}_events_total", kind="device.removed") == 1
    assert _sample(text, f"{p}_events_total", kind="capacity.changed") == 2
    assert _sample(text, f"{p}_requeries_total", result="changed") >= 3
    assert _sample(text, f"{p}_requeries_total", result="unchanged") >= 1
    assert _sample(text, f"{p}_kubelet_up") == 1
    assert _sample(text, f"{p}_deliveries_total", sink="audit", result="delivered") == 5
    assert _sample(text, f"{p}_outbox_depth", sink="audit") == 0
    assert _sample(text, f"{p}_dead_letters", sink="audit") == 0
    assert _sample(text, f"{p}_delivery_latency_seconds_count", sink="audit") == 5
    assert _sample(text, f"{p}_requery_duration_seconds_count") >= 4
    assert _sample(text, f"{p}_last_successful_requery_timestamp_seconds") > 1.7e9


def _device_series(text: str) -> dict[tuple[str, str, str], float]:
    """Every device_healthy sample of a scrape: (resource, device, numa) -> value."""
    return {
        (s.labels["resource"], s.labels["device"], s.labels["numa"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pod_resources_watcher_device_healthy"
    }


async def test_device_health_shows_a_gpu_failing_while_allocated_and_healing(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        status, text = await _get(run, "/metrics")
        assert status == 200
        _promtool(text)
        held = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
        series = _device_series(text)
        gpus = {k: v for k, v in series.items() if k[0] == GPU}
        assert len(gpus) == 8 and set(gpus.values()) == {1.0}  # the built-in node's 8 healthy GPUs
        assert next(k for k in gpus if k[1] == held)[2] in ("0", "1")  # named with its NUMA node
        assert _sample(text, "pod_resources_watcher_device_series_omitted") == 0

        mark = len(run.recorder.events)
        fake.make_unhealthy(GPU, held)
        await run.recorder.until(
            lambda: "device.removed" in [str(e.kind) for e in run.recorder.events[mark:]]
        )
        _, text = await _get(run, "/metrics")
        _promtool(text)
        failed = {k: v for k, v in _device_series(text).items() if k[1] == held}
        assert list(failed.values()) == [0.0]  # allocated, gone from allocatable: 0, not absent
        assert sum(v for k, v in _device_series(text).items() if k[0] == GPU) == 7

        mark = len(run.recorder.events)
        fake.heal(GPU, held)
        await run.recorder.until(lambda: "device.added" in [str(e.kind) for e in run.recorder.events[mark:]])
        _, text = await _get(run, "/metrics")
        assert [v for k, v in _device_series(text).items() if k[1] == held] == [1.0]


async def test_inventory_gauges_survive_an_agent_restart_with_nothing_changed(short_tmp: Path) -> None:
    """The restarted agent finds the saved inventory unchanged: its gauges must still show it, or a
    GPU that failed in use would drop out of device_healthy (and its alert resolve) on a restart."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    held = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
    fake.make_unhealthy(GPU, held)
    async with fake:
        for _ in range(2):
            async with running_agent(make_settings(short_tmp), fake) as run:
                await run.recorder.kinds_after(0, 1)
                await run.quiet_cycle()
                _, text = await _get(run, "/metrics")
            assert [v for k, v in _device_series(text).items() if k[1] == held] == [0.0]
            assert _sample(text, "pod_resources_watcher_resource_allocatable", resource=GPU, numa="all") == 7
    assert [str(e.kind) for e in run.recorder.events] == ["watcher.started"]  # nothing changed


async def test_device_health_series_are_capped_and_long_ids_bounded(short_tmp: Path) -> None:
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(settings, http=dataclasses.replace(settings.http, max_device_series=3))
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    long_id = "GPU-" + "x" * 300
    fake.add_device(GPU, long_id, (0,))
    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        held = fake.node.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]
        mark = len(run.recorder.events)
        fake.make_unhealthy(GPU, held)
        await run.recorder.until(
            lambda: "device.removed" in [str(e.kind) for e in run.recorder.events[mark:]]
        )
        _, text = await _get(run, "/metrics")
        _promtool(text)
        inventory = run.agent.inventory
        assert inventory is not None
        total = len(inventory.devices) + len(inventory.missing_devices)
        series = _device_series(text)
        assert len(series) == 3  # the cap holds
        assert [v for k, v in series.items() if k[1] == held] == [0.0]  # the failed one is kept first
        assert (
            _sample(text, "pod_resources_watcher_device_series_omitted") == total - 3 == 16
        )  # 9 GPUs, 6 NICs, 4 fuse
    # Without a cap in the way, a plugin's 304-character id is cut to a bounded, distinct label.
    uncapped = make_settings(short_tmp / "uncapped")
    fake = FakeKubelet(short_tmp / "uncapped" / "kubelet", seed=1)
    fake.add_device(GPU, long_id, (0,))
    fake.add_device(GPU, long_id + "y", (0,))
    async with fake, running_agent(uncapped, fake) as run:
        await run.recorder.kinds_after(0, 1)
        _, text = await _get(run, "/metrics")
        _promtool(text)
    long_labels = [k[1] for k in _device_series(text) if k[1].startswith("GPU-xxx")]
    assert len(long_labels) == 2 and len(set(long_labels)) == 2
    assert all(len(label) == 128 and label[-9] == "~" for label in long_labels)


async def test_readyz_fails_while_the_kubelet_is_down_and_recovers(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=1)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        assert (await _get(run, "/readyz"))[0] == 200
        assert (await _get(run, "/healthz"))[0] == 200
        await fake.stop()
        run.agent.wake("test")
        await run.recorder.until(lambda: run.agent.metrics.value("requeries_total", result="failed") > 0)
        status, body = await _get(run, "/readyz")
        assert status == 503
        assert "not answering" in json.loads(body)["reason"]
        assert (await _get(run, "/healthz"))[0] == 200  # alive, just not ready
        await fake.start()
        await run.recorder.until(
            lambda: (
                run.agent.metrics.value("requeries_total", result="failed") > 0
                and run.agent.kubelet_health.failing_since is None
            )
        )
        status, body = await _get(run, "/readyz")
        assert status == 200, body


async def test_readyz_names_each_watched_directory_and_a_missing_mount(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    # As in a pod whose device-plugins directory is not mounted: the kubelet's pod-resources socket
    # is there, device-plugins/ is not. /readyz must say what is watched and what is missing.
    fake = await start_kubelet(seed=1)
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        status, body = await _get(run, "/readyz")
        watches = json.loads(body)["watches"]
        assert status == 200
        assert watches["socket"]["state"] == "watching"
        assert watches["socket"]["files"] == ["kubelet.sock"]
        assert watches["device-plugins"]["state"] == "watching"
    bare = short_tmp / "bare"
    (bare / "kubelet" / "pod-resources").mkdir(parents=True)
    fake = FakeKubelet(short_tmp / "kubelet2", seed=1)
    settings = make_settings(bare)
    settings = dataclasses.replace(
        settings, kubelet=dataclasses.replace(settings.kubelet, socket=fake.socket_path)
    )
    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        status, body = await _get(run, "/readyz")
        watches = json.loads(body)["watches"]
        assert status == 200  # a missing trigger directory costs triggers, not readiness
        assert watches["device-plugins"] == {
            "directory": str(bare / "kubelet" / "device-plugins"),
            "state": "missing",
            "files": [],
            "more_files": 0,
        }
        assert watches["kubelet-root"]["state"] == "watching"
        assert watches["kubelet-root"]["files"] == []


async def test_inventory_endpoint_serves_the_canonical_inventory(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    # /inventory is off by default and needs a token when on (tests/test_http.py): turned on here.
    token = short_tmp / "inventory-token"
    token.write_text("token-for-the-inventory-test\n")
    settings = make_settings(short_tmp)
    http = dataclasses.replace(settings.http, inventory=True, inventory_token=Secret(file=token))
    fake = await start_kubelet(seed=1)
    async with running_agent(dataclasses.replace(settings, http=http), fake) as run:
        await run.recorder.kinds_after(0, 1)
        auth = {"Authorization": "Bearer token-for-the-inventory-test"}
        status, body = await _get(run, "/inventory", auth)
    doc = json.loads(body)
    assert status == 200
    assert doc["inventory"] == run.agent.inventory.canonical  # type: ignore[union-attr]
    assert doc["hash"] == run.agent.inventory.content_hash  # type: ignore[union-attr]
    assert doc["seq"] == run.agent.seq
    assert doc["node"] == "node-a"
    assert doc["derived"]["cpus"]["allocatable"] == 92


async def test_inventory_snapshot_events_on_an_interval(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    fake = await start_kubelet(seed=1)
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(settings, watch=dataclasses.replace(settings.watch, snapshot_interval=0.3))
    async with running_agent(settings, fake) as run:
        await run.recorder.until(lambda: run.recorder.kinds().count("inventory.snapshot") >= 2)
    snap = next(e for e in run.recorder.events if e.kind == "inventory.snapshot")
    assert snap.details["hash"] == snap.inventory_after
    assert snap.details["inventory"]["allocatable"]["cpu_ids"]


class _Flaky:
    """A webhook receiver that can be down (503) or up."""

    def __init__(self) -> None:
        self.up = False
        self.ids: list[str] = []
        self.arrived = Changes()

    async def handle(self, request: web.Request) -> web.Response:
        if not self.up:
            return web.Response(status=503, headers={"Retry-After": "0"})
        self.ids.append((await request.json())["id"])
        self.arrived.notify()
        return web.Response(status=204)

    async def until(self, count: int) -> None:
        await self.arrived.until(lambda: len(set(self.ids)) >= count, timeout=20)


async def test_reload_keeps_the_queued_events_of_unchanged_sinks(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    receiver = _Flaky()
    async with HttpServer(receiver.handle) as server:
        hook = WebhookSinkSettings(
            name="hook",
            url=Secret(value=server.url()),
            bearer_token=Secret(value=PLANTED_SECRET),
            retry_max_delay=0.2,
        )
        audit = FileSinkSettings(name="audit", path=short_tmp / "a.jsonl")
        fake = await start_kubelet(seed=1)
        settings = dataclasses.replace(make_settings(short_tmp), sinks=(hook, audit))
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            await run.add_devices(GPU, [(f"GPU-r{i}", (0,)) for i in range(3)])
            queued = (await run.agent.outbox.stats("hook")).depth
            assert queued == len(run.recorder.events)  # the receiver is down: all queued
            # The audit sink goes, a console sink comes, the webhook stays as it was.
            new = dataclasses.replace(settings, sinks=(hook, StdoutSinkSettings(name="console")))
            await run.agent.reload(new)
            assert sorted(run.agent.dispatcher.workers) == ["console", "hook"]
            receiver.up = True
            await receiver.until(len(run.recorder.events))
            assert [str(e.id) for e in run.recorder.events] == list(dict.fromkeys(receiver.ids))


async def test_reload_to_another_socket_reconnects(short_tmp: Path) -> None:
    first = FakeKubelet(short_tmp / "k1", seed=1)
    second = FakeKubelet(short_tmp / "k2", seed=2)
    second.add_device(GPU, "GPU-only-on-the-second", (0,))
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(
        settings,
        kubelet=dataclasses.replace(settings.kubelet, socket=first.socket_path, root_dir=short_tmp / "k1"),
    )
    async with first, second, running_agent(settings, first) as run:
        await run.recorder.kinds_after(0, 1)
        mark = len(run.recorder.events)
        moved = dataclasses.replace(
            settings,
            kubelet=dataclasses.replace(
                settings.kubelet, socket=second.socket_path, root_dir=short_tmp / "k2"
            ),
        )
        await run.agent.reload(moved)
        await run.recorder.kinds_after(mark, 2)
        assert "device.added" in run.recorder.kinds(mark)
        assert second.calls["List"] > 0


def test_sighup_reloads_the_config_file(short_tmp: Path) -> None:
    root = short_tmp / "kubelet"
    config = short_tmp / "w.toml"
    base = (
        f'node = "node-a"\nstate_dir = "{short_tmp / "state"}"\n'
        f'[kubelet]\nsocket = "{root / "pod-resources" / "kubelet.sock"}"\nroot_dir = "{root}"\n'
        '[http]\nlisten = "127.0.0.1:0"\n[log]\nformat = "json"\n'
    )
    config.write_text(base)
    with fake_kubelet_process(root):
        agent = subprocess.Popen(
            [sys.executable, "-m", "watcher", "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert agent.stdout is not None and agent.stderr is not None
        assert json.loads(agent.stdout.readline())["kind"] == "watcher.started"
        # A sink whose URL carries the planted secret and whose receiver is not there: its
        # errors are logged, and the secret must not be in them.
        config.write_text(
            base.replace("[log]", "[watch]\nsnapshot_interval = 0.3\n[log]")
            + f'[sinks.audit]\ntype = "file"\npath = "{short_tmp / "audit.jsonl"}"\n'
            + f'[sinks.gone]\ntype = "webhook"\nurl = "http://127.0.0.1:9/{PLANTED_SECRET}"\n'
            + "retry_max_delay = 0.1\n"
        )
        agent.send_signal(signal.SIGHUP)
        seen: list[str] = []
        for line in agent.stderr:
            seen.append(line)
            entry = json.loads(line)
            assert entry["node"] == "node-a"
            assert "component" in entry
            if entry["event"] == "configuration reloaded":
                assert entry["sinks_changed"] == ["audit", "gone", "stdout"]
            if entry["event"] == "delivery failed; will retry" and entry.get("sink") == "gone":
                break
        config.write_text("[watch]\ninterval = -5\n")  # a broken config must not take the agent down
        agent.send_signal(signal.SIGHUP)
        for line in agent.stderr:
            seen.append(line)
            entry = json.loads(line)
            if entry["event"].startswith("reload failed"):
                assert "watch.interval" in entry["error"]
                break
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
        assert agent.returncode == 0, err
        logged = "".join(seen) + err
        assert "delivery failed" in logged  # the sink's failures were logged ...
        assert PLANTED_SECRET not in logged  # ... without the secret in its URL


class _Echo:
    def __init__(self, status: int) -> None:
        self.status = status
        self.bodies: list[dict[str, object]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.Response(status=self.status, text="nope" if self.status >= 400 else "ok")


@pytest.mark.parametrize(("status", "code"), [(200, 0), (400, 1)])
async def test_send_test_reports_the_receivers_answer(
    short_tmp: Path, capfd: pytest.CaptureFixture[str], status: int, code: int
) -> None:
    echo = _Echo(status)
    config = short_tmp / "w.toml"
    async with HttpServer(echo.handle) as server:
        config.write_text(
            f'state_dir = "{short_tmp}"\n[sinks.team]\ntype = "webhook"\nurl = "{server.url()}"\n'
        )
        rc = await asyncio.to_thread(main, ["send-test", "team", "--config", str(config)])
    out = capfd.readouterr().out
    assert rc == code
    assert f"HTTP {status}" in out
    assert echo.bodies[0]["details"]["test"] is True  # type: ignore[index]
    assert await asyncio.to_thread(main, ["send-test", "nobody", "--config", str(config)]) == 2
    assert "no sink named 'nobody'" in capfd.readouterr().err
