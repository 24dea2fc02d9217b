"""Section 13 (bench/sections/real_kubelet.py) at a tiny size: upstream's kubelet with our device
plugin and upstream's DRA test driver, the agent's events timed and split at the Pods API, the
agent as a process measured idle, and the same flip at kubelet-lite and the fake, all in one run.
Marked e2e: it needs the Go peers (a skip without them, a failure under CI, testkit.peers)."""

from __future__ import annotations

import pytest

from bench.real_kubelet import NEEDED, RealKubeletPlan, bench_real_kubelet
from bench.registry import Results
from bench.sections.real_kubelet import REAL_KUBELET, render
from testkit.peers import peer

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
async def test_the_real_kubelet_section_measures_every_round_and_reports_them() -> None:
    for name in NEEDED:
        peer(name)
    run = await bench_real_kubelet(RealKubeletPlan(flips=1, pods=2, idle_s=2.0, ref_flips=1))
    assert run.errors == {}
    assert set(run.flips) == {"plugin", "dra", "lite", "fake"}
    for key, ways in run.flips.items():
        for way in ("unhealthy", "healthy"):
            series = ways[way]
            assert len(series.total) == len(series.reasons) == 1, (key, way)
            assert 0 < series.total[0] < 30, (key, way)
    # On the real kubelet the holding pod's status shows each flip on the Pods API, and a DRA
    # verdict reaches the agent only that way: its kubelet part comes before the stored event.
    for key in ("plugin", "dra"):
        for way in ("unhealthy", "healthy"):
            assert run.flips[key][way].kubelet[0] is not None, (key, way)
    dra = run.flips["dra"]["unhealthy"]
    assert dra.kubelet[0] is not None and dra.kubelet[0] < dra.total[0]
    assert run.pods is not None and len(run.pods.stored) == 2
    assert run.idle is not None
    assert run.idle.pods == 3  # the two GPU pods and the Job's pod
    assert run.idle.rss_mib > 0 and run.idle.cpu_s >= 0
    text = "\n".join(render(Results({REAL_KUBELET.name: run})))
    assert "| real kubelet | device plugin GPU held by a pod | to unhealthy | 1 |" in text
    assert "| real kubelet | DRA device of a Job's claim | back to healthy | 1 |" in text
    assert "| kubelet-lite | device plugin GPU held by a pod | to unhealthy | 1 |" in text
    assert "| fake | GPU held by a pod | back to healthy | 1 |" in text
    assert "| real kubelet | 3 (2 holding a GPU, 1 a DRA claim) |" in text
    assert "not measured" not in text
