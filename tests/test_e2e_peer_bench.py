"""Section 12 (bench/sections/peer.py) at a tiny size: nfd-topology-updater, built by `make peers`,
runs beside our agent against the fake kubelet, and both tools' figures come out of one run.
Marked e2e: it needs the Go peers (a skip without them, a failure under CI, testkit.peers)."""

from __future__ import annotations

import pytest

from bench.registry import Results
from bench.sections.peer import PEER, PeerPlan, bench_peer
from bench.sections.peer import render as render_peer
from testkit.peers import peer

pytestmark = pytest.mark.e2e


async def test_nfd_runs_beside_our_agent_and_both_are_measured() -> None:
    for name in ("nfd-topology-updater", "kube-testcluster", "kubelet-lite", "device-plugin"):
        peer(name)
    run = await bench_peer(PeerPlan(changes=1, idle_s=2.0, sleep_interval_s=2.0, kubelets="fake"))
    assert run.data["nfd_version"] == "nfd-topology-updater v0.17.3"
    ours, nfd = run.data["kubelets"]["fake"]["ours"], run.data["kubelets"]["fake"]["nfd"]
    assert nfd["error"] is None
    # Each change reached both tools' output; nfd's allocation records differ from the one before.
    for tool in (ours, nfd):
        assert len(tool["added_s"]) == len(tool["removed_s"]) == len(tool["unhealthy_s"]) == 1
        assert tool["added_s"][0] is not None
        assert tool["rss_mib"] > 0
    # nfd rescans when the checkpoint is rewritten, but its zones carry no device health.
    assert ours["unhealthy_shown"] == [True]
    assert nfd["unhealthy_shown"] == [False]
    # The fake tells the clients apart: nfd reads allocatable once, at start, and lists per scan.
    assert nfd["calls"]["GetAllocatableResources"] == 1
    assert nfd["calls"]["List"] >= 3  # the warm-up pod, the pod given a GPU, its GPU unhealthy
    assert sum(ours["calls"].values()) >= 1
    text = "\n".join(render_peer(Results({PEER.name: run})))
    assert "| fake | ours |" in text
    assert "| fake | nfd-topology-updater v0.17.3 (-no-publish, -sleep-interval 2s) |" in text
    assert "NVSentinel (documented, not measured)" in text
