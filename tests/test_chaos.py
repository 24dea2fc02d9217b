"""Kubelet chaos: many restarts, both ways, with the inventory changing while it is down.

Every restart warms up like a real kubelet's (devices back as each plugin re-registers, pods
as List fills in). The default run (inside `make test`) does 20 restarts; `make chaos` runs 200
(PRW_CHAOS_RESTARTS). Checks: every restart detected once; the final inventory
equals the fake kubelet's; replaying the device and allocation events onto the
first inventory gives the last one (every change reported exactly once); no
growth in open file descriptors or asyncio tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import Running, make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher.model.build import build
from watcher.model.events import Event
from watcher.model.inventory import Inventory
from watcher.sim.fake_plugins import Warmup

# Long runs: `make chaos` runs them at full size (CI runs it); `make test` leaves them out.
pytestmark = pytest.mark.chaos

GPU = "nvidia.com/gpu"
RESTARTS = int(os.environ.get("PRW_CHAOS_RESTARTS", "20"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _devices(inv: Inventory) -> set[tuple[str, str]]:
    return {(d.resource, d.id) for d in inv.devices}


def _holdings(inv: Inventory) -> dict[str, frozenset[tuple[str, str]]]:
    out = {}
    for pod in inv.pods:
        for c in pod.containers:
            devices = frozenset((d.resource, d.id) for d in c.devices)
            held = devices | frozenset(("cpu", str(i)) for i in c.cpu_ids)
            if held or c.memory or c.claims:
                out[f"{pod.namespace}/{pod.name}/{c.name}"] = held
    return out


def _replay(first: Inventory, events: list[Event]) -> tuple[set[tuple[str, str]], dict[str, frozenset[Any]]]:
    devices = _devices(first)
    holdings = dict(_holdings(first))
    for e in events:
        d = e.details
        if e.kind == "device.added":
            key = (d["resource"], d["device"])
            assert key not in devices, f"device added twice: {key}"
            devices.add(key)
        elif e.kind == "device.removed":
            key = (d["resource"], d["device"])
            assert key in devices, f"device removed twice: {key}"
            devices.remove(key)
        elif e.kind in ("allocation.added", "allocation.removed", "allocation.changed"):
            who = f"{d['namespace']}/{d['pod']}/{d['container']}"

            def held(part: dict[str, Any]) -> frozenset[tuple[str, str]]:
                devs = {(r, i) for r, ids in part["devices"].items() for i in ids}
                return frozenset(devs | {("cpu", str(i)) for i in part["cpu_ids"]})

            if e.kind == "allocation.added":
                assert who not in holdings, f"allocation added twice: {who}"
                holdings[who] = held(d)
            elif e.kind == "allocation.removed":
                assert who in holdings, f"allocation removed twice: {who}"
                del holdings[who]
            else:
                holdings[who] = (holdings[who] | held(d["gained"])) - held(d["lost"])
    return devices, holdings


@pytest.mark.timeout(600)
async def _pods_watch_live(run: Running) -> None:
    """Until the Pods API watch streams again after its snapshot (a restart ends its stream)."""
    watch = run.agent.pods_watch
    assert watch is not None
    await run.recorder.until(lambda: watch.state == "watching", 15)
    await run.quiet_cycle()


async def test_kubelet_chaos(short_tmp: Path, start_kubelet: StartKubelet) -> None:
    rng = random.Random(20261130)
    fake = await start_kubelet(seed=rng.randrange(1 << 30))
    async with running_agent(make_settings(short_tmp, unreachable_grace=60), fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        # Every restart from here on warms up as a real kubelet's does: plugins re-register
        # over a few hundred ms, List fills in.
        fake.plugins.warmup = Warmup(plugin_delay=(0.0, 0.3), pods_delay=(0.0, 0.2))
        first = run.agent.inventory
        assert first is not None
        await _pods_watch_live(run)  # its tasks differ while it connects: count them live
        fds_before, tasks_before = _fds(), len(asyncio.all_tasks())
        mark = len(run.recorder.events)
        extra = 0
        for n in range(RESTARTS):
            restarted = run.recorder.kinds().count("kubelet.restarted")
            delete_first = rng.random() < 0.5
            await fake.stop(remove_socket=delete_first)
            # The node changes while the kubelet is down.
            for _ in range(rng.randrange(3)):
                choice = rng.randrange(4)
                if choice == 0:
                    extra += 1
                    fake.add_device(GPU, f"GPU-chaos-{extra}", (rng.randrange(2),))
                elif choice == 1:
                    mine = [k for k in fake.node.devices if k[1].startswith("GPU-chaos-")]
                    if mine:
                        fake.remove_device(*rng.choice(mine))
                elif choice == 2:
                    fake.allocate("chaos", f"job-{n}", "main", cpu_ids=[rng.randrange(64, 92)])
                else:
                    jobs = [k for k in fake.node.pods if k[0] == "chaos"]
                    if jobs:
                        fake.free(*rng.choice(jobs))
            # 0-500 ms down; some restarts fall inside one debounce window.
            downtime = 0.0 if rng.random() < 0.2 else rng.uniform(0, 0.5)
            if downtime:
                await asyncio.sleep(downtime)
            await fake.start()
            await run.recorder.until(lambda r=restarted: run.recorder.kinds().count("kubelet.restarted") > r)
        await run.settled()
        await run.quiet_cycle()
        events = run.recorder.events[mark:]
        assert [e.kind for e in events].count("kubelet.restarted") == RESTARTS
        last = run.agent.inventory
        truth = build(fake.allocatable_response(), fake.list_response())
        assert last is not None
        assert last.content_hash == truth.content_hash
        devices, holdings = _replay(first, events)
        assert devices == _devices(last)
        assert holdings == _holdings(last)
        # Nothing accumulates: a few fds of slack for sockets mid-close.
        await _pods_watch_live(run)
        fds_after, tasks_after = _fds(), len(asyncio.all_tasks())
        assert fds_after <= fds_before + 5
        assert tasks_after <= tasks_before + 2
        report = os.environ.get("PRW_CHAOS_REPORT")
        if report:
            kinds = Counter(str(e.kind) for e in events)
            Path(report).write_text(
                json.dumps(
                    {
                        "restarts": RESTARTS,
                        "restarts_detected": kinds["kubelet.restarted"],
                        "events_checked": len(events),
                        "events_by_kind": dict(sorted(kinds.items())),
                        "fds": [fds_before, fds_after],
                        "tasks": [tasks_before, tasks_after],
                        "final_hash_matches": last.content_hash == truth.content_hash,
                    },
                    indent=2,
                )
            )
