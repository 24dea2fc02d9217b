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
            await agent._cycle(frozenset({"bench"}))
        assert agent.stats.commit_failures == 0
        assert agent.inventory is not None
        assert agent.stats.events == 1  # watcher.started, then nothing: the node did not change
    finally:
        await agent.client.close()
        await agent.outbox.close()
