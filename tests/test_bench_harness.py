"""The benchmarks' own harness drives a real Agent the way agent.run() would: if it stopped doing
so (as when the outbox gained a separate open step), bench figures would measure a broken agent."""

from __future__ import annotations

from pathlib import Path

from bench.cycles import agent_for_cycles
from watcher.sim.fake_kubelet import FakeKubelet


async def test_the_bench_agent_commits_its_cycles(kubelet: FakeKubelet, short_tmp: Path) -> None:
    agent = await agent_for_cycles(kubelet.socket_path, short_tmp / "bench-state")
    try:
        for _ in range(3):
            await agent.requery(frozenset({"bench"}))
        assert agent.metrics.value("state_commit_failures_total") == 0
        assert agent.inventory is not None
        assert (
            agent.metrics.value("events_total") == 1
        )  # watcher.started, then nothing: the node did not change
    finally:
        await agent.close()


def test_the_bench_script_imports() -> None:
    """`make bench` is not part of the suite: at least its imports must keep up with the package."""
    import bench.run

    assert callable(bench.run.main)
