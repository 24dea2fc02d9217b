"""The agent's one directory watch: one inotify instance for every directory it needs, and a
change in each of them still reaches the re-query loop (and the Pods API watch)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from testkit.agent import make_settings, running_agent
from testkit.waiting import wait_until
from watcher.kubelet.watching import DirectoryWatches
from watcher.sim.fake_kubelet import FakeKubelet


def _inotify_instances() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    async with FakeKubelet(short_tmp / "kubelet", seed=7) as fake:
        yield fake


async def test_the_agent_runs_one_inotify_instance_for_every_directory(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    before = _inotify_instances()
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        pods = run.agent.pods_watch
        await run.recorder.until(lambda: pods is not None and pods.state == "watching")
        watches = run.agent.notifier.watches
        await run.recorder.until(lambda: watches.installs >= 1 and _inotify_instances() > before)
        assert {s.name for s in watches.subscriptions} >= {"socket", "device-plugins", "kubelet-root"}
        assert _inotify_instances() - before == 1
        assert watches.installs == 1


@pytest.mark.parametrize(
    "where", ["device-plugins/kubelet_internal_checkpoint", "cpu_manager_state", "device-plugins/new.sock"]
)
async def test_a_change_in_each_watched_directory_triggers_a_requery(
    kubelet: FakeKubelet, short_tmp: Path, where: str
) -> None:
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        await run.quiet_cycle()
        mark = len(run.recorder.reasons)
        (kubelet.root / where).write_bytes(b"{}")
        name = Path(where).name

        def triggered() -> bool:
            return any(
                r.startswith("state-file:") and name in r for rs in run.recorder.reasons[mark:] for r in rs
            )

        await run.recorder.until(triggered, timeout=5)


async def test_the_sockets_directory_and_the_pods_api_directory_see_a_restart(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    async with running_agent(make_settings(short_tmp), kubelet) as run:
        await run.recorder.kinds_after(0, 1)
        pods = run.agent.pods_watch
        assert pods is not None
        await run.recorder.until(lambda: pods.state == "watching")
        connects = pods.connects
        mark = len(run.recorder.events)
        await kubelet.restart()
        assert await run.recorder.kinds_after(mark, 1) == ["kubelet.restarted"]
        await run.recorder.until(lambda: pods.connects > connects and pods.state == "watching")
        assert run.agent.notifier.watches.installs == 1  # the same watch throughout


@pytest.mark.slow  # waits out the watch's real steps: seconds
async def test_after_a_hurry_an_idle_watch_steps_long_again(short_tmp: Path) -> None:
    # Nothing changes in the directory: the look begun on the short step must still end, or an
    # idle agent ticks at the short step (ten times the CPU) until some file happens to change.
    stop = asyncio.Event()
    watches = DirectoryWatches(stop=stop, step_ms=200, hurry_step_ms=10, look_ms=1500, hurry_look_ms=500)
    (short_tmp / "quiet").mkdir()
    watches.subscribe(short_tmp / "quiet", lambda _name: True, "quiet")
    task = asyncio.create_task(watches.run())
    try:
        await wait_until(lambda: watches.stepping_ms == 200, 5, what="the long step")
        watches.hurry("restart-awaited")
        await wait_until(lambda: watches.stepping_ms == 10, 5, what="the short step")
        watches.hurry("restart-awaited", on=False)
        await wait_until(lambda: watches.stepping_ms == 200, 5, what="the long step again")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
