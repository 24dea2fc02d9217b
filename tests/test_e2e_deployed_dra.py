"""A DRA device failing at its driver, seen by the agent as users deploy it: the Helm chart installed
with `helm install` on a node whose kubelet (upstream v1.37) runs pods on containerd and runc
(testkit.container_node), its events at a signed webhook receiver and its pages at a PagerDuty
receiver, both on the node's network.

The chart mounts none of the kubelet's root directory but device-plugins and plugins_registry, so
dra_manager_state is no trigger in the pod: the device's health reaches the agent through the Pods
API (the kubelet's DRA manager writes the driver's report into the pod's status). The events must be those the
host-process agent gives (tests/test_e2e_real_node_dra.py,
test_a_claims_device_failing_at_the_driver_is_one_page_with_its_words_and_heals), exactly once. A
driver restart that "heals" the device is a reset there too (plugins_registry is mounted): no
resolve follows."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from testkit.container_node import ContainerNode
from testkit.deployed import USER_SECRET, Release, agent_config, quiet, user_secret
from testkit.real_dra import (
    add_dra_driver,
    allocated_device,
    claim_job,
    claim_of,
    job_pod,
    restart_driver_healthy,
    until_status_health,
)
from testkit.receivers import PagerDutyReceiver, WebhookReceiver

# The node and its cluster are the module's (tests/conftest.py: container_node). A first image build
# (make image) takes minutes: CI's make e2e builds it first.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]

# The driver's words, as in the host-process test: the event must carry them.
XID = "critical XID 79 reported by NVML: GPU has fallen off the bus"
# The sinks' secrets, handed to the agent as users do: their Secret, its keys the pod's environment
# (`secrets.existingSecret`), read by the config as ${NAME}.
SIGNING_SECRET = "whsec_" + "ZHJhLXNlY3JldC1mb3ItdGhlLWRlcGxveWVkLWFnZW50"
PD_KEY = "R0UT1NGKEY0123456789ABCDEFGHIJKL"


def _values(hook: WebhookReceiver, pager: PagerDutyReceiver) -> dict[str, Any]:
    """The documented values of a user with a signed webhook and the shipped config's PagerDuty
    sink (its commented template, uncommented), sending to the test's receiver; the resolve sent
    at once (`resolve_hold_down = 0`) as in the host-process test, not after the default 60 s."""
    pagerduty = (
        "\n[sinks.pagerduty]\n"
        'type = "pagerduty"\n'
        'routing_key = "${PAGERDUTY_ROUTING_KEY}"\n'
        'min_severity = "warning"\n'
        f'endpoint = "{pager.url("/v2/enqueue")}"\n'
        "resolve_hold_down = 0\n"
    )
    config = agent_config(
        hook.url("/events"), extra='signing_secret = "${HOOK_SIGNING_SECRET}"\n' + pagerduty
    )
    return {"config": config, "secrets": {"existingSecret": USER_SECRET, "optional": False}}


def _kinds(hook: WebhookReceiver, since: int = 0) -> list[str]:
    return [r.json()["kind"] for r in hook.accepted[since:]]


def _events(hook: WebhookReceiver, since: int = 0) -> list[dict[str, Any]]:
    return [r.json() for r in hook.accepted[since:]]


async def test_a_claims_device_failing_at_the_driver_reaches_the_webhook_once_with_its_words_and_heals(
    image_node: ContainerNode, tmp_path: Path
) -> None:
    node = image_node
    dra = await add_dra_driver(node, f"dd{uuid.uuid4().hex[:6]}")
    release = Release(node.cluster, "prw", tmp_path / "helm")
    hook, pager = WebhookReceiver(secret=SIGNING_SECRET), PagerDutyReceiver()
    # On the host side of the node's veth: the pod reaches them there.
    hook.host = pager.host = node.host_ip
    await user_secret(
        node, release.namespace, HOOK_SIGNING_SECRET=SIGNING_SECRET, PAGERDUTY_ROUTING_KEY=PD_KEY
    )
    async with hook, pager:
        await release.install(_values(hook, pager))
        try:
            agent = await release.ready_pod()
            await hook.wait_for(1, timeout=30)
            # The health path in the pod: the Pods API through its mount, watched.
            ready = json.loads(await node.http_get(agent["status"]["podIP"], 9108, "/readyz"))
            assert ready["ok"] is True and ready["pods_api"]["state"] == "watching", ready

            # A Job's pod with a claim from a template: the resourceclaim controller makes the
            # claim, the scheduler allocates a device of the driver's, the kubelet prepares it.
            namespace = await node.namespace(f"dra-{uuid.uuid4().hex[:6]}")
            await claim_job(node, dra, namespace, "llm")
            pod = await job_pod(node, namespace, "llm", timeout=90)
            name = pod["metadata"]["name"]
            claim = await claim_of(node, pod)
            device = allocated_device(claim)
            await hook.wait_for(lambda _: "allocation.added" in _kinds(hook), timeout=60)
            await quiet(hook)
            assert _kinds(hook) == ["watcher.started", "allocation.added"], _kinds(hook)
            added = _events(hook)[1]["details"]
            assert (added["namespace"], added["pod"]) == (namespace, name), added
            assert added["pod_uid"] == pod["metadata"]["uid"], added
            assert added["owner"]["kind"] == "Job" and added["owner"]["name"] == "llm", added
            assert pager.events == []  # info: below the pager's min_severity

            # The driver reports the device Unhealthy, in its words: one critical event.
            mark = len(hook.accepted)
            await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
            await until_status_health(node, namespace, name, "Unhealthy")
            await hook.wait_for(lambda _: "device.unhealthy" in _kinds(hook, mark), timeout=60)
            await quiet(hook)
            assert _kinds(hook, mark) == ["device.unhealthy"], _kinds(hook, mark)
            (event,) = _events(hook, mark)
            assert event["severity"] == "critical" and event["node"] == node.name, event
            d = event["details"]
            assert (d["driver"], d["pool"], d["device_name"], d["claim"], d["message"]) == (
                dra.name, dra.pool, device, claim["metadata"]["name"], XID,
            ), d  # fmt: skip
            assert XID in event["summary"], event
            # Learned from the Pod status (the Pods API): the one health source in the pod.
            assert d["sources"] == ["pod-status"], d
            (holder,) = d["pods"]
            assert (holder["namespace"], holder["name"], holder["uid"]) == (
                namespace, name, pod["metadata"]["uid"],
            ), holder  # fmt: skip
            assert holder["owner"]["kind"] == "Job" and holder["owner"]["name"] == "llm", holder
            # One page, in the driver's words.
            await pager.wait_for(1, timeout=30)
            (page,) = pager.events
            assert page["event_action"] == "trigger" and XID in page["payload"]["summary"], page
            assert page["payload"]["severity"] == "critical", page

            # Healthy again: the heal, once.
            await dra.driver.set_health(dra.pool, device, "Healthy")
            await until_status_health(node, namespace, name, "Healthy")
            await hook.wait_for(lambda _: "device.healthy" in _kinds(hook, mark), timeout=60)
            await quiet(hook)
            assert _kinds(hook, mark) == ["device.unhealthy", "device.healthy"], _kinds(hook, mark)
            healed = _events(hook, mark)[1]
            assert healed["severity"] == "info", healed
            assert (healed["details"]["device_name"], healed["details"]["claim"]) == (
                device, claim["metadata"]["name"],
            )  # fmt: skip
            # The page resolved, nothing more sent to either.
            await pager.wait_for(2, timeout=30)
            await quiet(pager)
            assert [p["event_action"] for p in pager.events] == ["trigger", "resolve"], pager.events
            assert pager.events[1]["dedup_key"] == page["dedup_key"]
            assert _kinds(hook, mark) == ["device.unhealthy", "device.healthy"], _kinds(hook, mark)
            assert hook.violations == [] and pager.violations == [], (hook.violations, pager.violations)

            # Failed again, then the driver restarts and its new process calls the device Healthy.
            # The chart's plugins_registry mount shows the restart (a new registration socket):
            # a reset, not a heal, so the page stays open past this test (the default 600 s).
            mark = len(hook.accepted)
            await dra.driver.set_health(dra.pool, device, "Unhealthy", XID)
            await until_status_health(node, namespace, name, "Unhealthy")
            await pager.wait_for(3, timeout=60)
            await restart_driver_healthy(node, dra, namespace, name, device)
            await hook.wait_for(lambda _: "device.reset" in _kinds(hook, mark), timeout=60)
            await quiet(hook)
            await quiet(pager)
            assert _kinds(hook, mark) == ["device.unhealthy", "device.reset"], _kinds(hook, mark)
            reset = _events(hook, mark)[1]
            assert reset["severity"] == "warning" and reset["details"]["device_name"] == device, reset
            actions = [p["event_action"] for p in pager.events]
            assert actions == ["trigger", "resolve", "trigger"], pager.events
            assert hook.violations == [] and pager.violations == [], (hook.violations, pager.violations)
        finally:
            await release.uninstall()
            await node.kubectl_async("delete", "secret", USER_SECRET, "-n", release.namespace)
