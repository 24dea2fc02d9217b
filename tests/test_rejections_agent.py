"""Pods the node rejects at admission, through the whole agent against the fake kubelet (which
fails them as the real one does: phase Failed, UnexpectedAdmissionError, the device manager's
words): one pod.rejected per pod naming it and its Job, never twice (a restart, a resync), none for
pods rejected before the first look, no page for one, and one page for a burst resolved once the
window passes quiet. The same against the upstream kubelet: tests/test_e2e_real_node_pods.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from testkit.agent import Running, make_settings, running_agent, with_config
from testkit.http_sinks import pd_table
from testkit.receivers import PagerDutyReceiver
from testkit.waiting import wait_until
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeOwner, FakePod
from watcher.sim.fake_pod_objects import rejected
from watcher.sim.fake_script import ScriptError, parse_script, play

GPU = "nvidia.com/gpu"
WINDOW = 1.5  # seconds: the incident's end is awaited, so short enough to wait for


def _pod(name: str) -> FakePod:
    return FakePod("ml", name, owners=[FakeOwner("Job", "llm-pretrain", api_version="batch/v1")])


@asynccontextmanager
async def _agent(
    root: Path, fake: FakeKubelet, pager: PagerDutyReceiver, threshold: int = 3
) -> AsyncIterator[Running]:
    rejections = {"rejections_threshold": threshold, "rejections_window": WINDOW}
    # make_settings' audit log too: what was stored across restarts.
    settings = with_config(make_settings(root), {"sinks": {"pager": pd_table(pager)}, "pods": rejections})
    async with running_agent(settings, fake) as run:
        await run.pods_watching()
        yield run


async def test_one_rejected_pod_is_one_warning_naming_pod_and_job_never_repeated_and_no_page(
    short_tmp: Path,
) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=5)
    fake.add_pod(
        rejected(fake.node, _pod("before-0"), GPU, 8)
    )  # rejected before the agent's first look: old news
    async with fake, PagerDutyReceiver() as pager:
        async with _agent(short_tmp, fake, pager) as run:
            mark = len(run.recorder.events)
            fake.add_pod(rejected(fake.node, _pod("worker-0"), GPU, 8))
            await run.recorder.until(lambda: "pod.rejected" in run.recorder.kinds(mark))
            await run.quiet_cycle()
            assert run.recorder.kinds(mark) == ["pod.rejected"]
            event = run.recorder.events[mark]
            d = event.details
            assert (d["namespace"], d["pod"], d["resource"]) == ("ml", "worker-0", GPU)
            assert d["pod_uid"] == fake.node.pods[("ml", "worker-0")].uid
            assert (d["owner"]["kind"], d["owner"]["name"]) == ("Job", "llm-pretrain")
            assert d["reason"] == "UnexpectedAdmissionError"
            # Eight asked for, three free: the device manager's words for that.
            assert "requested number of devices unavailable for nvidia.com/gpu. Requested: 8" in d["message"]
            # The watch's stream lost and taken again (a fresh snapshot of every pod, as after a
            # resync found it stale): nothing is told twice.
            watch, api = run.agent.pods_watch, fake.pods_api
            assert watch is not None and api is not None
            connects = watch.connects
            await api.stop()
            await api.start()
            await wait_until(
                lambda: watch.connects > connects and watch.state == "watching", what="a new stream"
            )
            await run.quiet_cycle()
            assert run.recorder.kinds(mark) == ["pod.rejected"]
        # A restart with the same saved state: the pod is not news again.
        async with _agent(short_tmp, fake, pager) as run:
            await run.quiet_cycle()
            assert "pod.rejected" not in run.recorder.kinds()
        assert pager.events == []
        lines = (short_tmp / "state" / "events.jsonl").read_text().splitlines()
        audited = [json.loads(line).get("event") or {} for line in lines]
        told = [e["details"]["pod"] for e in audited if e.get("kind") == "pod.rejected"]
        assert told == ["worker-0"]


async def test_twelve_rejected_pods_are_one_page_resolved_after_the_window(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=6)
    async with fake, PagerDutyReceiver() as pager, _agent(short_tmp, fake, pager) as run:
        mark = len(run.recorder.events)
        for i in range(12):
            fake.add_pod(rejected(fake.node, _pod(f"worker-{i}"), GPU, 8))
        await run.recorder.until(lambda: "node.rejecting_pods_ended" in run.recorder.kinds(mark), timeout=15)
        kinds = run.recorder.kinds(mark)
        assert kinds.count("pod.rejected") == 12, kinds
        assert kinds.count("node.rejecting_pods") == 1 and kinds.count("node.rejecting_pods_ended") == 1
        await pager.wait_for(2, timeout=5)
        assert [e["event_action"] for e in pager.events] == ["trigger", "resolve"]
        trigger = pager.events[0]
        assert trigger["payload"]["summary"].startswith("Job ml/llm-pretrain")
        assert "node keeps rejecting nvidia.com/gpu pods" in trigger["payload"]["summary"]
        assert pager.events[1]["dedup_key"] == trigger["dedup_key"]


async def test_rejected_pods_gone_from_the_pods_api_a_while_are_not_told_again(short_tmp: Path) -> None:
    """As a restarted kubelet's Pods API shows its failed pods again only once it has read them back
    from the API server: they leave the agent's view (DELETED), a look passes without them, and they
    come back (ADDED). None is told again and nothing pages again."""
    fake = FakeKubelet(short_tmp / "kubelet", seed=7)
    async with fake, PagerDutyReceiver() as pager, _agent(short_tmp, fake, pager) as run:
        mark = len(run.recorder.events)
        keys = [("ml", f"worker-{i}") for i in range(4)]
        for _, name in keys:
            fake.add_pod(rejected(fake.node, _pod(name), GPU, 8))
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("pod.rejected") == 4)
        await pager.wait_for(1, timeout=5)
        uids = {fake.node.pods[key].uid for key in keys}
        watch, api = run.agent.pods_watch, fake.pods_api
        assert watch is not None and api is not None
        after = len(run.recorder.events)
        fake.plugins.hidden_pods.update(keys)
        api.changed()
        await run.recorder.until(lambda: not uids & watch.index.uids())
        await run.quiet_cycle()  # a look without them
        fake.plugins.hidden_pods.difference_update(keys)
        api.changed()
        await run.recorder.until(lambda: uids <= watch.index.uids())
        await run.quiet_cycle()
        kinds = run.recorder.kinds(after)
        assert not {"pod.rejected", "node.rejecting_pods"} & set(kinds), kinds
        assert [e["event_action"] for e in pager.events] == ["trigger"]


async def test_a_scenario_files_reject_step_is_one_pod_rejected(short_tmp: Path) -> None:
    """`fake-kubelet --script`'s `reject` (docs/cli.md): the same pod, reason and words."""
    steps = parse_script("0 reject ml/job-2 nvidia.com/gpu 2\n")
    with pytest.raises(ScriptError, match="usage: AT reject"):
        parse_script("0 reject ml/job-2 nvidia.com/gpu 0\n")
    fake = FakeKubelet(short_tmp / "kubelet", seed=8)
    async with fake, PagerDutyReceiver() as pager, _agent(short_tmp, fake, pager) as run:
        mark = len(run.recorder.events)
        await play(fake, steps)
        await run.recorder.until(lambda: "pod.rejected" in run.recorder.kinds(mark))
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["pod.rejected"]
        d = run.recorder.events[mark].details
        assert (d["namespace"], d["pod"], d["resource"], d["reason"]) == (
            "ml",
            "job-2",
            GPU,
            "UnexpectedAdmissionError",
        )
        assert "Requested: 2, Available: 3" in d["message"]
