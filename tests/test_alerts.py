"""deploy/prometheus/alerts.yaml: valid rules, each unit-tested firing and not firing by promtool, each
with a severity and annotations, a `for:` that its tests show matters, and only metrics the agent
really exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_harness import make_settings, running_agent
from watcher.sim.fake_kubelet import FakeKubelet

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
UNIT_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "alerts_test.yaml"
ALERTS = {
    "PodResourcesWatcherDown",
    "PodResourcesWatcherAbsent",
    "PodResourcesWatcherKubeletUnreachable",
    "PodResourcesWatcherDeviceFailedWhileAllocated",
    "PodResourcesWatcherDeviceFlapping",
    "PodResourcesWatcherDeadLettersGrowing",
    "PodResourcesWatcherOutboxEventTooOld",
    "PodResourcesWatcherStateNotWritable",
    "PodResourcesWatcherSinkDeliveryFailing",
}
# What PromQL itself spells; every other word in an expression is a metric name.
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset"}
# Prometheus' own series, not the agent's.
PROMETHEUS_METRICS = {"up"}


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed; .ci/run installs the prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return promtool


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def _rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    result = _run("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _run("test", "rules", UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_severity_annotations_and_a_firing_and_a_quiet_unit_test() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    cases = [
        case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]
    ]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert}: no unit test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert}: no unit test where it stays quiet"


def test_the_unit_tests_catch_every_for_being_dropped(tmp_path: Path) -> None:
    """A `for:` is what keeps a blink from paging: without it, the alert's quiet unit test fails."""
    text = RULES.read_text()
    with_for = [r["alert"] for r in _rules() if "for" in r]
    assert len(with_for) >= 7
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / UNIT_TESTS.name)
    for alert in with_for:
        start = text.index(f"- alert: {alert}\n")
        end = text.find("- alert: ", start + 1)
        end = len(text) if end < 0 else end
        rule = re.sub(r"\n +for: \S+", "", text[start:end], count=1)
        assert rule != text[start:end]
        (tmp_path / RULES.name).write_text(text[:start] + rule + text[end:])
        result = _run("test", "rules", tmp_path / "tests" / UNIT_TESTS.name)
        assert result.returncode != 0, f"{alert} without its for: still passes its unit tests"
        assert f"alertname: {alert}," in result.stdout + result.stderr


def _metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: what is left once strings, label matchers, ranges,
    grouping clauses, functions, keywords and numbers are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b[a-zA-Z_]\w*\s*\(", "(", expr)  # functions and aggregations
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*\b", expr))
    return words - PROMQL_WORDS


def test_the_metric_name_extraction_is_not_fooled() -> None:
    expr = 'max by (sink) (rate(a_total{kind="or b"}[5m])) > 0 unless ignoring(result) c == bool 1e3'
    assert _metric_names(expr) == {"a_total", "c"}


async def test_rules_use_only_metrics_the_agent_exports(short_tmp: Path) -> None:
    fake = FakeKubelet(short_tmp / "kubelet", seed=1)
    async with fake, running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.kinds_after(0, 1)
        # deliveries_total has a series once a sink delivered: wait for the audit sink's first.
        await run.recorder.until(lambda: run.agent.metrics.value("deliveries_total", result="delivered") > 0)
        await run.recorder.until(lambda: run.agent.http is not None and run.agent.http.bound_port is not None)
        assert run.agent.http is not None
        url = f"http://127.0.0.1:{run.agent.http.bound_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            text = await response.text()
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    used = set().union(*(_metric_names(rule["expr"]) for rule in _rules()))
    assert {"pod_resources_watcher_device_healthy", "pod_resources_watcher_kubelet_up"} <= used
    assert "pod_resources_watcher_dead_letters" in exported  # the scrape is the agent's, with a sink
    assert used - exported == PROMETHEUS_METRICS
    # The flapping alert's increase() needs the series before the first device.flapping of a run.
    assert 'pod_resources_watcher_events_total{kind="device.flapping"} 0.0' in text
