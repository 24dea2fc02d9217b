"""The /metrics page: the inventory's series are rendered once per inventory, not per scrape, and
every scrape still shows the figures as they are now."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from testkit.inventories import inventory_of
from watcher.ops.metrics import Metrics

P = "pod_resources_watcher"


def _samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page.decode())
        for s in family.samples
    }


def _gpu(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], state: str) -> float:
    return samples[(f"{P}_resource_{state}", (("numa", "all"), ("resource", "nvidia.com/gpu")))]


def test_each_scrape_shows_live_figures_and_the_inventory_as_it_is_now() -> None:
    metrics = Metrics()
    metrics.set_inventory(inventory_of(["GPU-0", "GPU-1"], {"ml/a": ["GPU-0"]}))
    first = _samples(metrics.render())
    assert _gpu(first, "allocated") == 1
    assert (
        first[(f"{P}_device_healthy", (("device", "GPU-1"), ("numa", "0"), ("resource", "nvidia.com/gpu")))]
        == 1
    )

    metrics.requeries.labels("ok").inc()  # a live figure moves between two scrapes
    second = _samples(metrics.render())
    assert second[(f"{P}_requeries_total", (("result", "ok"),))] == 1
    assert {k: v for k, v in second.items() if "resource_" in k[0]} == {
        k: v for k, v in first.items() if "resource_" in k[0]
    }

    # The inventory changes: a second pod holds GPU-1, then GPU-0 leaves allocatable.
    metrics.set_inventory(inventory_of(["GPU-0", "GPU-1"], {"ml/a": ["GPU-0"], "ml/b": ["GPU-1"]}))
    assert _gpu(_samples(metrics.render()), "allocated") == 2
    metrics.set_inventory(inventory_of(["GPU-1"], {"ml/b": ["GPU-1"]}))
    third = _samples(metrics.render())
    assert _gpu(third, "allocatable") == 1
    assert (
        f"{P}_device_healthy",
        (("device", "GPU-0"), ("numa", "0"), ("resource", "nvidia.com/gpu")),
    ) not in third
    assert metrics.value("resource_allocatable", resource="nvidia.com/gpu", numa="all") == 1


def test_the_page_is_one_exposition_each_family_once() -> None:
    metrics = Metrics()
    metrics.set_inventory(inventory_of(["GPU-0"], {}))
    names = [f.name for f in text_string_to_metric_families(metrics.render().decode())]
    assert len(names) == len(set(names))
    assert f"{P}_device_healthy" in names and f"{P}_requeries" in names
