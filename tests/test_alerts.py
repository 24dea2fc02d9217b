"""deploy/prometheus/alerts.yaml: valid rules, each unit-tested firing and not firing by promtool, each
with a severity and annotations, a `for:` that its tests show matters, and only metrics the agent
really exports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from testkit.promql import PROMETHEUS_METRICS, metric_names, promtool, sample_names, scrape_running_agent

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


def _rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", UNIT_TESTS)
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
        result = promtool("test", "rules", tmp_path / "tests" / UNIT_TESTS.name)
        assert result.returncode != 0, f"{alert} without its for: still passes its unit tests"
        assert f"alertname: {alert}," in result.stdout + result.stderr


def test_the_metric_name_extraction_is_not_fooled() -> None:
    expr = 'max by (sink) (rate(a_total{kind="or b"}[5m])) > 0 unless ignoring(result) c == bool 1e3'
    assert metric_names(expr) == {"a_total", "c"}


async def test_rules_use_only_metrics_the_agent_exports(short_tmp: Path) -> None:
    text = await scrape_running_agent(short_tmp)
    exported = sample_names(text)
    used = set().union(*(metric_names(rule["expr"]) for rule in _rules()))
    assert {"pod_resources_watcher_device_healthy", "pod_resources_watcher_kubelet_up"} <= used
    assert "pod_resources_watcher_dead_letters" in exported  # the scrape is the agent's, with a sink
    assert used - exported == PROMETHEUS_METRICS
    # The flapping alert's increase() needs the series before the first device.flapping of a run.
    assert 'pod_resources_watcher_events_total{kind="device.flapping"} 0.0' in text
