"""`snapshot` with the kubelet's Pods API (the fake kubelet serves it on a real unix socket): each
pod's uid, owner and labels, the kubelet's device verdicts with the drivers' words, the non-Healthy
first, in the table and in JSON; without the API, or with an answer that is not protobuf, the
snapshot as before and one line saying why; pods that are not Pod messages named, the others shown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from testkit.fake_kubelets import StartKubelet
from watcher.cli import main
from watcher.kubeletapi.k8s import core_v1_pb2
from watcher.sim.fake_kubelet import FakeKubelet

XID = "critical XID 79 reported by NVML"


async def _snapshot(fake: FakeKubelet, capfd: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    code = await asyncio.to_thread(main, ["snapshot", "--socket", str(fake.socket_path), *args])
    out, err = capfd.readouterr()
    assert code == 0, err
    return out, err


def _failing(fake: FakeKubelet) -> str:
    """The DRA GPU failing with the driver's words, and a device-plugin GPU unhealthy: its id."""
    fake.dra.set_health("gpu.example.com", "node-a", "gpu-8", "Unhealthy", XID)
    gpu = fake.node.pods[("ml", "inference-7f9c")].container("server").devices["nvidia.com/gpu"][0]
    fake.make_unhealthy("nvidia.com/gpu", gpu)
    return gpu


async def test_the_table_shows_each_pods_uid_owner_labels_and_the_failing_devices_first(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    gpu = _failing(kubelet)
    out, _ = await _snapshot(kubelet, capfd)
    lines = out.splitlines()
    pods = lines[lines.index("PODS (Pods API)") + 2 :]
    trainer = next(line for line in pods if line.startswith("ml/trainer-0 "))
    uid = kubelet.node.pods[("ml", "trainer-0")].uid
    assert uid in trainer and "Job/llm-pretrain" in trainer and "team=research" in trainer
    health = lines[lines.index("DEVICE HEALTH (the kubelet's verdicts, not Healthy first)") + 2 :]
    assert health[0].split()[:2] == ["dra/claimed-gpu", "app"]
    assert "Unhealthy" in health[0] and XID in health[0] and "ResourceClaim gpu-claim" in health[0]
    assert gpu in health[1] and "Unhealthy" in health[1]
    assert all("Healthy" in line and "Unhealthy" not in line for line in health[2:])
    assert "not available" not in out


async def test_json_gains_the_pods_and_their_device_verdicts(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    _failing(kubelet)
    out, _ = await _snapshot(kubelet, capfd, "-o", "json")
    api: dict[str, Any] = json.loads(out)["pods_api"]
    assert (api["available"], api["reason"], api["skipped"]) == (True, None, 0)
    by_name = {(p["namespace"], p["name"]): p for p in api["pods"]}
    trainer = by_name[("ml", "trainer-0")]
    assert trainer["uid"] == kubelet.node.pods[("ml", "trainer-0")].uid
    assert (trainer["owner"]["kind"], trainer["owner"]["name"]) == ("Job", "llm-pretrain")
    assert trainer["labels"]["team"] == "research" and "pod-template-hash" not in str(api["pods"])
    first = api["devices"][0]
    assert (first["pod"], first["health"], first["message"], first["claim"]) == (
        "claimed-gpu",
        "Unhealthy",
        XID,
        "gpu-claim",
    )
    assert [d["health"] for d in api["devices"]][:2] == ["Unhealthy", "Unhealthy"]
    assert {d["health"] for d in api["devices"][2:]} == {"Healthy"}


async def test_without_the_socket_it_is_the_snapshot_as_before_and_one_line_why(
    short_tmp: Path, capfd: pytest.CaptureFixture[str], start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(root=short_tmp, seed=3, pods_api=False)
    out, _ = await _snapshot(fake, capfd)
    with_flag, _ = await _snapshot(fake, capfd, "--no-pods-api")
    doc = json.loads((await _snapshot(fake, capfd, "-o", "json"))[0])
    notes = [line for line in out.splitlines() if "Pods API" in line]
    assert notes == [
        f"note: Pods API not available: no socket at {short_tmp / 'pods-api' / 'pods-api.sock'} "
        "(a kubelet before 1.37, or its PodsAPI gate off)"
    ]
    assert "ml/trainer-0" in out and "DEVICE HEALTH" not in out  # pod-resources' part as before
    assert [line for line in with_flag.splitlines() if "Pods API" in line] == [
        "note: Pods API not available: not asked (--no-pods-api)"
    ]
    assert doc["pods_api"]["available"] is False and "no socket" in doc["pods_api"]["reason"]
    assert doc["pods_api"]["pods"] == [] and doc["inventory"]["pods"]


async def test_a_kubelet_refusing_the_api_or_another_socket_given_is_said_in_one_line(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str], short_tmp: Path
) -> None:
    assert kubelet.pods_api is not None
    elsewhere = short_tmp / "elsewhere.sock"
    out, _ = await _snapshot(kubelet, capfd, "--pods-api-socket", str(elsewhere))
    assert [line for line in out.splitlines() if "Pods API" in line] == [
        f"note: Pods API not available: no socket at {elsewhere} "
        "(a kubelet before 1.37, or its PodsAPI gate off)"
    ]
    kubelet.pods_api.refuse(grpc.StatusCode.UNIMPLEMENTED, "unknown service v1alpha1.Pods")
    out, _ = await _snapshot(kubelet, capfd)
    (note,) = [line for line in out.splitlines() if "Pods API not available" in line]
    assert "UNIMPLEMENTED" in note and "unknown service v1alpha1.Pods" in note


async def test_a_list_pods_answer_that_is_not_protobuf_is_one_line_and_the_rest_is_printed(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    assert kubelet.pods_api is not None
    kubelet.pods_api.answer_garbage("ListPods")
    out, _ = await _snapshot(kubelet, capfd)
    doc = json.loads((await _snapshot(kubelet, capfd, "-o", "json"))[0])
    (note,) = [line for line in out.splitlines() if "Pods API" in line]
    assert note.startswith("note: Pods API not available: ") and "not protobuf" in note
    assert str(kubelet.pods_api.socket_path) in note
    assert "ml/trainer-0" in out and "DEVICE HEALTH" not in out  # pod-resources' part as before
    api = doc["pods_api"]
    assert api["available"] is False and "not protobuf" in api["reason"] and api["pods"] == []
    assert doc["inventory"]["pods"]


async def test_pods_that_are_not_pod_messages_are_each_named_and_the_others_shown(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    assert kubelet.pods_api is not None
    real = len(kubelet.node.pods)
    kubelet.pods_api.add_raw_pods(b"\xff\xff garbage", core_v1_pb2.Pod().SerializeToString())
    out, _ = await _snapshot(kubelet, capfd)
    doc = json.loads((await _snapshot(kubelet, capfd, "-o", "json"))[0])
    lines = out.splitlines()
    said = lines.index("(2 pods did not decode and are left out)")
    assert "ml/trainer-0" in "\n".join(lines[:said])  # the readable pods are listed
    first, second = lines[said + 1 : said + 3]
    assert first.startswith(f"  pod {real + 1} of {real + 2} in ListPods' answer: ")
    assert "is not a Pod message (10 bytes: " in first
    assert second.startswith(f"  pod {real + 2} of {real + 2} in ListPods' answer: ")
    assert "has no uid" in second
    api = doc["pods_api"]
    assert (api["available"], api["skipped"], len(api["pods"])) == (True, 2, real)
    assert [u.split(":")[0] for u in api["undecoded"]] == [
        f"pod {real + 1} of {real + 2} in ListPods' answer",
        f"pod {real + 2} of {real + 2} in ListPods' answer",
    ]


async def test_the_table_names_ten_pods_that_did_not_decode_and_json_names_them_all(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    assert kubelet.pods_api is not None
    kubelet.pods_api.add_raw_pods(*[b"\xff\xff garbage"] * 12)
    out, _ = await _snapshot(kubelet, capfd)
    doc = json.loads((await _snapshot(kubelet, capfd, "-o", "json"))[0])
    lines = out.splitlines()
    said = lines.index("(12 pods did not decode and are left out)")
    named = lines[said + 1 : said + 12]
    assert all(" in ListPods' answer: " in line for line in named[:10])
    assert named[10] == "  ... and 2 more (--output json names them all)"
    assert len(doc["pods_api"]["undecoded"]) == doc["pods_api"]["skipped"] == 12


async def test_the_html_page_has_the_verdicts_failing_first_with_the_claim_and_the_drivers_words(
    kubelet: FakeKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    """The page's health table: the only place a DRA device's failure shows on the node."""
    gpu = _failing(kubelet)
    out, _ = await _snapshot(kubelet, capfd, "-o", "html")
    table = out[out.index('<section class="totals health">') :]
    rows = table.split("<tr data-health=")[1:]
    assert rows[0].startswith('"Unhealthy"') and "ResourceClaim gpu-claim" in rows[0] and XID in rows[0]
    assert any(gpu in row and row.startswith('"Unhealthy"') for row in rows[:2])
    assert all(row.startswith('"Healthy"') for row in rows[2:])
