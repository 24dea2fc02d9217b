"""deploy/grafana/pod-resources-watcher.json: an importable dashboard whose every PromQL expression
parses (promtool) and selects only metrics a running agent exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.promql import metric_names, promtool, sample_names, scrape_running_agent

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "pod-resources-watcher.json"
DATASOURCE = "${datasource}"
# A value for each template variable an expression may use, as Grafana would put it in.
SAMPLES = {
    "node": "gpu-node-1|gpu-node-2",
    "resource": ".*",
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "6h",
}
# Every panel of the item: what each must show, by the metric that shows it.
SHOWN = {
    "pod_resources_watcher_resource_allocatable",
    "pod_resources_watcher_resource_allocated",
    "pod_resources_watcher_resource_free",
    "pod_resources_watcher_device_healthy",
    "pod_resources_watcher_events_total",
    "pod_resources_watcher_delivery_latency_seconds_bucket",
    "pod_resources_watcher_outbox_depth",
    "pod_resources_watcher_outbox_oldest_age_seconds",
    "pod_resources_watcher_dead_letters",
    "pod_resources_watcher_reconnects_total",
    "pod_resources_watcher_kubelet_up",
}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _dashboard()["templating"]["list"]}


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def _substitute(expr: str) -> str:
    """`$name`, `${name}` and `[[name]]` replaced by a sample value; an unknown variable fails."""

    def sample(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        assert name in SAMPLES, f"unknown template variable {name} in {expr!r}"
        return SAMPLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", sample, expr)


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable, variables substituted. A
    variable's `label_values(SELECTOR, label)` or `query_result(EXPR)` contributes its PromQL."""
    found = [
        (f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = _variable_query(variable)
        match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*|\s*query_result\((.*)\)\s*", query, re.S)
        assert match, f"variable {variable['name']}: a query promtool cannot check: {query!r}"
        found.append((f"variable {variable['name']}", next(g for g in match.groups() if g)))
    return [(where, _substitute(expr)) for where, expr in found]


def _check(expressions: list[tuple[str, str]], tmp_path: Path) -> tuple[int, str]:
    """`promtool check rules` over one recording rule per expression."""
    rules = [{"record": f"dashboard:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(expressions)]
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", path)
    return result.returncode, result.stdout + result.stderr


def test_the_dashboard_is_importable() -> None:
    dashboard = _dashboard()
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = _variables()
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    node = variables["node"]
    assert node["type"] == "query" and node["datasource"]["uid"] == DATASOURCE
    assert re.fullmatch(r"label_values\(\w+, node\)", _variable_query(node))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_panel_has_a_title_and_the_datasource_variable() -> None:
    panels = _dashboard()["panels"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel.get("title"), panel
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
    # Every query narrows to the chosen nodes (a dashboard of one node must not sum them all).
    for panel in panels:
        for target in panel["targets"]:
            assert 'node=~"$node"' in target["expr"], f"{panel['title']}: not filtered by $node"


def test_every_expression_parses_with_promtool(tmp_path: Path) -> None:
    expressions = _expressions(_dashboard())
    assert len(expressions) >= 20
    for where, expr in expressions:
        assert "$" not in expr and "[[" not in expr, f"{where}: unsubstituted variable in {expr!r}"
    code, output = _check(expressions, tmp_path)
    assert code == 0, output
    assert f"SUCCESS: {len(expressions)} rules found" in output


def test_promtool_would_catch_a_broken_expression(tmp_path: Path) -> None:
    """The check above is not vacuous: one unbalanced expression among the dashboard's fails it."""
    broken = ("broken", "sum(rate(pod_resources_watcher_events_total[1m])")
    expressions = [*_expressions(_dashboard()), broken]
    code, output = _check(expressions, tmp_path)
    assert code != 0, output


def test_an_unknown_template_variable_is_refused() -> None:
    with pytest.raises(AssertionError, match="unknown template variable nod"):
        _substitute('pod_resources_watcher_kubelet_up{node=~"$nod"}')


async def test_the_dashboard_uses_only_metrics_the_agent_exports(short_tmp: Path) -> None:
    exported = sample_names(await scrape_running_agent(short_tmp))
    used = set().union(*(metric_names(expr) for _, expr in _expressions(_dashboard())))
    assert used >= SHOWN
    assert "pod_resources_watcher_delivery_latency_seconds_bucket" in exported  # a sink delivered
    assert used - exported == set()
