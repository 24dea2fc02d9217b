"""DRA through upstream code on a real node: upstream's DRA test driver registered with upstream's
kubelet, claims from templates made by the resourceclaim controller and allocated by the real
kube-scheduler for a Job's pod, prepared by the kubelet through the driver; the device's health
from the driver's health stream, through the kubelet's DRA manager into the Pod status, to the
agent's events and pages. Each scenario counts the agent's events exactly."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.agent import AgentRun, agent_against, make_settings
from testkit.real_dra import (
    add_dra_driver,
    allocated_device,
    claim_job,
    claim_of,
    job_pod,
    until_status_health,
)
from testkit.real_node import RealNode
from testkit.receivers import PagerDutyReceiver
from watcher.settings_file import parse_settings

pytestmark = pytest.mark.e2e

GPU = "example.com/gpu"
GPUS = {"gpu0": (0,), "gpu1": (1,)}
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"
PD_KEY = "R0UT1NGKEY0123456789ABCDEFGHIJKL"


def _tag() -> str:
    return f"t{uuid.uuid4().hex[:6]}"


@asynccontextmanager
async def _agent(
    short_tmp: Path, node: RealNode, pager: PagerDutyReceiver, **pods: Any
) -> AsyncIterator[AgentRun]:
    parsed = parse_settings(
        {
            "sinks": {
                "pager": {
                    "type": "pagerduty",
                    "routing_key": PD_KEY,
                    "endpoint": pager.url("/v2/enqueue"),
                    "resolve_hold_down": 0,
                }
            },
            "pods": pods,
        }
    )
    base = make_settings(short_tmp, kubelet_root=node.root, node=node.name)
    settings = dataclasses.replace(base, sinks=(*base.sinks, *parsed.sinks), pods=parsed.pods)
    async with agent_against(settings) as run:
        await run.pods_watching(timeout=30)
        await run.released()
        yield run


async def test_a_jobs_pod_scheduled_with_a_plugin_gpu_is_one_allocation_added_naming_uid_and_job(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    await node.add_plugin(GPU, GPUS)
    namespace = await node.namespace(f"job-{uuid.uuid4().hex[:6]}")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        mark = len(run.recorder.events)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "trainer", "namespace": namespace},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": node.name},
                        "containers": [{"name": "main", "image": "registry.test/trainer:1",
                                        "resources": {"limits": {GPU: 1}}}],
                    }
                },
            },
        }  # fmt: skip
        await node.apply(job)
        pod = await job_pod(node, namespace, "trainer")
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark), timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["allocation.added", "capacity.changed"]
        added = run.recorder.events[mark]
        assert added.details["pod_uid"] == pod["metadata"]["uid"]
        assert added.details["owner"]["kind"] == "Job" and added.details["owner"]["name"] == "trainer"
        assert pager.events == []


async def test_a_claims_device_failing_at_the_driver_is_one_page_with_its_words_and_heals(
    scheduled_node: RealNode, short_tmp: Path
) -> None:
    node = scheduled_node
    dra = await add_dra_driver(node, _tag())
    namespace = await node.namespace(f"dra-{uuid.uuid4().hex[:6]}")
    async with PagerDutyReceiver() as pager, _agent(short_tmp, node, pager) as run:
        await claim_job(node, dra, namespace, "llm")
        pod = await job_pod(node, namespace, "llm")
        claim = await claim_of(node, pod)
        device = allocated_device(claim)
        await run.quiet_cycle()
        mark = len(run.recorder.events)
        await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
        await until_status_health(node, namespace, pod["metadata"]["name"], "Unhealthy")
        await pager.wait_for(1, timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.unhealthy"]
        event = run.recorder.events[mark]
        assert event.severity.value == "critical"
        d = event.details
        assert (d["driver"], d["pool"], d["device_name"], d["claim"], d["message"]) == (
            dra.name, dra.pool, device, claim["metadata"]["name"], XID,
        )  # fmt: skip
        assert (
            d["pods"][0]["owner"] == {"kind": "Job", "name": "llm"} or d["pods"][0]["owner"]["name"] == "llm"
        )
        (page,) = pager.events
        assert page["event_action"] == "trigger" and XID in page["payload"]["summary"]

        await dra.driver.set_health(dra.pool, device, "Healthy")
        await pager.wait_for(2, timeout=15)
        await run.quiet_cycle()
        assert run.recorder.kinds(mark) == ["device.unhealthy", "device.healthy"]
        assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"]
