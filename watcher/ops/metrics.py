"""Prometheus metrics, in a registry of their own (one per agent, so tests never share one)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watcher.model.changes import Kind
from watcher.model.events import Event
from watcher.model.inventory import Inventory
from watcher.store.outbox import SinkStats

__all__ = ["Metrics", "CONTENT_TYPE", "DEVICE_LABEL_MAX", "device_label"]

log = structlog.get_logger("watcher.ops.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = "pod_resources_watcher"
HTTP_CLOSE_REASONS = ("header_timeout", "request_timeout", "idle_timeout", "evicted", "tls_handshake")


# Device ids (and resource names) are chosen by device plugins and have no length limit: a label
# value longer than this is cut, with a digest of the whole so that distinct ids stay distinct.
DEVICE_LABEL_MAX = 128
_DIGEST_CHARS = 8


def _numa(node: int | None) -> str:
    return "none" if node is None else str(node)


def device_label(value: str) -> str:
    """`value` if it has at most DEVICE_LABEL_MAX characters; else its first characters, `~` and the
    first 8 hex digits of its SHA-256, DEVICE_LABEL_MAX characters in all."""
    if len(value) <= DEVICE_LABEL_MAX:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:_DIGEST_CHARS]
    return f"{value[: DEVICE_LABEL_MAX - _DIGEST_CHARS - 1]}~{digest}"


# (resource, device, numa) labels and the value (1 healthy, 0 failed or missing).
DeviceSample = tuple[str, str, str, float]


class _DeviceHealthCollector(Collector):
    """Device health, replaced whole on each inventory (a scrape never sees half of one)."""

    def __init__(self) -> None:
        self.samples: tuple[DeviceSample, ...] = ()
        self.omitted = 0
        self.numa_omitted = 0

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            f"{P}_device_healthy",
            "1 if the device is allocatable, 0 if it is allocated to a pod but absent from allocatable "
            "(failed or vanished in use); per resource, device and NUMA node(s).",
            labels=["resource", "device", "numa"],
        )
        for resource, device, numa, value in self.samples:
            healthy.add_metric([resource, device, numa], value)
        omitted = GaugeMetricFamily(
            f"{P}_device_series_omitted",
            "Devices left out of device_healthy by [http] max_device_series (0: none).",
        )
        omitted.add_metric([], self.omitted)
        numa_omitted = GaugeMetricFamily(
            f"{P}_numa_series_omitted",
            "(resource or memory type, NUMA node) pairs left out of the per-NUMA resource_* and memory_* "
            "series by [http] max_device_series (0: none).",
        )
        numa_omitted.add_metric([], self.numa_omitted)
        yield from (healthy, omitted, numa_omitted)


def _device_samples(inv: Inventory) -> list[DeviceSample]:
    """Failed devices first (an alert needs them most), then the healthy ones, each sorted, so a
    cap keeps the same series from one inventory to the next. In List-only mode nothing is known
    about health: no samples. A device that left allocatable and is held by no pod is no longer in
    the inventory: its series goes (its `device.removed` event and `resource_allocatable` say it)."""
    if not inv.allocatable_known:
        return []
    failed = [
        (device_label(m.resource), device_label(m.id), _numa_set(m.numa), 0.0) for m in inv.missing_devices
    ]
    healthy = [
        (device_label(d.resource), device_label(d.id), _numa_set(d.numa), 1.0)
        for d in sorted(inv.devices, key=lambda d: (d.resource, d.id))
    ]
    return failed + healthy


def _same_figures(a: Inventory, b: Inventory) -> bool:
    """Whether the gauges would show `a` as they show `b`: the same allocatable side (the same
    devices object: carried over by a change that touched only pods) and the same figures."""
    return (
        _same_devices(a, b)
        and a.capacity == b.capacity
        and a.cpus == b.cpus
        and a.memory_capacity == b.memory_capacity
    )


def _same_devices(a: Inventory, b: Inventory) -> bool:
    """Whether device_healthy would show the same samples for `a` as for `b`."""
    return (
        a.devices is b.devices
        and a.allocatable_known == b.allocatable_known
        and a.missing_devices == b.missing_devices
    )


def _numa_set(numa: Sequence[int]) -> str:
    # 64 NUMA ids at most (the model's bound) still make a label of up to 320 characters: cut too.
    return device_label(",".join(map(str, numa))) or "none"


class _OutboxCollector(Collector):
    """Outbox figures read at scrape time (the database is the truth, not a copy of it)."""

    def __init__(self) -> None:
        self.stats: Mapping[str, SinkStats] = {}

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(f"{P}_outbox_depth", "Events queued per sink.", labels=["sink"])
        oldest = GaugeMetricFamily(
            f"{P}_outbox_oldest_age_seconds", "Age of the oldest queued event per sink.", labels=["sink"]
        )
        dead = GaugeMetricFamily(
            f"{P}_dead_letters", "Events in the dead-letter table per sink.", labels=["sink"]
        )
        dropped = CounterMetricFamily(
            f"{P}_outbox_dropped_events",
            "Queued events dropped by a sink's caps (max_queue, max_age).",
            labels=["sink"],
        )
        dead_dropped = CounterMetricFamily(
            f"{P}_dead_letters_dropped",
            "Dead letters dropped by a sink's caps (max_dead_letters, max_dead_letter_age).",
            labels=["sink"],
        )
        disabled = GaugeMetricFamily(
            f"{P}_sink_disabled", "1 if the sink was disabled (410 Gone).", labels=["sink"]
        )
        for name, st in sorted(self.stats.items()):
            depth.add_metric([name], st.depth)
            oldest.add_metric([name], st.oldest_age or 0.0)
            dead.add_metric([name], st.dead_letters)
            dropped.add_metric([name], st.dropped)
            dead_dropped.add_metric([name], st.dead_dropped)
            disabled.add_metric([name], 1.0 if st.disabled else 0.0)
        yield from (depth, oldest, dead, dropped, dead_dropped, disabled)


def _per_state(registry: CollectorRegistry, name: str, doc: str, label: str) -> dict[str, Gauge]:
    """One gauge per state (allocatable, allocated, free), labelled by `label` and NUMA node."""
    return {
        state: Gauge(f"{P}_{name.format(state)}", doc.format(state), [label, "numa"], registry=registry)
        for state in ("allocatable", "allocated", "free")
    }


class Metrics:
    def __init__(self, *, max_device_series: int = 1024) -> None:
        """`max_device_series`: the [http] setting of that name (its default here too)."""
        r = self.registry = CollectorRegistry()
        self.max_device_series = max_device_series
        # In this order on the page: the kubelet's, the deliveries' and the state's, the outbox's
        # and the HTTP server's (the inventory's have a registry of their own).
        self._kubelet_metrics(r)
        self._delivery_and_state_metrics(r)
        self._inventory_metrics()
        self._outbox_and_http_metrics(r)

    def _kubelet_metrics(self, r: CollectorRegistry) -> None:
        self.requeries = Counter(
            f"{P}_requeries", "Re-queries of the kubelet by result.", ["result"], registry=r
        )
        self.requery_duration = Histogram(
            f"{P}_requery_duration_seconds",
            "Time of one re-query: both RPCs, parsing, diffing and committing.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.kubelet_up = Gauge(f"{P}_kubelet_up", "1 if the last re-query succeeded.", registry=r)
        self.reconnects = Counter(f"{P}_reconnects", "Fresh channels dialled for a new socket.", registry=r)
        self.events = Counter(f"{P}_events", "Events emitted by kind.", ["kind"], registry=r)
        # Every kind from 0: Prometheus' increase() cannot see a series' first increment, so an
        # alert on the first `device.flapping` of a run needs the series to exist before it.
        for kind in Kind:
            self.events.labels(str(kind))

    def _delivery_and_state_metrics(self, r: CollectorRegistry) -> None:
        self.deliveries = Counter(
            f"{P}_deliveries", "Events handled by sink and result.", ["sink", "result"], registry=r
        )
        self.delivery_latency = Histogram(
            f"{P}_delivery_latency_seconds",
            "From an event's creation to its delivery, per sink.",
            ["sink"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=r,
        )
        self.commit_failures = Counter(
            f"{P}_state_commit_failures",
            "Cycles whose events and state could not be stored (state directory full, read-only, broken).",
            registry=r,
        )
        self.commit_duration = Histogram(
            f"{P}_state_commit_duration_seconds",
            "Time to store a cycle's events and state durably (one transaction and its fsync): "
            "a slow disk shows here, and every event waits for it.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.state_writable = Gauge(
            f"{P}_state_writable", "0 while the last attempt to store events and state failed.", registry=r
        )
        self.state_writable.set(1)
        self.last_success = Gauge(
            f"{P}_last_successful_requery_timestamp_seconds",
            "Unix time of the last successful re-query.",
            registry=r,
        )

    def _inventory_metrics(self) -> None:
        # The inventory's gauges are most of a large node's page (hundreds of device series) and
        # change only with the inventory: they live in a registry of their own whose text is kept
        # between scrapes, so a scrape renders the few live figures only.
        inv = self._inventory_registry = CollectorRegistry()
        self._inventory_page: bytes | None = None  # None: render it again at the next scrape
        self.resource = _per_state(
            inv,
            "resource_{}",
            "Devices (or CPUs) {} per resource and NUMA node (numa=all: the total).",
            "resource",
        )
        self.memory = _per_state(inv, "memory_{}_bytes", "Memory {} per type and NUMA node(s).", "type")
        self._shown: Inventory | None = None  # what the inventory gauges show
        self.device_health = _DeviceHealthCollector()
        inv.register(self.device_health)

    def _outbox_and_http_metrics(self, r: CollectorRegistry) -> None:
        self.outbox = _OutboxCollector()
        r.register(self.outbox)
        self.http_connections = Gauge(f"{P}_http_connections", "HTTP connections open now.", registry=r)
        self.http_closed = Counter(
            f"{P}_http_connections_closed",
            "HTTP connections the agent closed, by reason: header_timeout, request_timeout, "
            "idle_timeout, evicted (the connection cap), tls_handshake (a failed handshake).",
            ["reason"],
            registry=r,
        )
        for reason in HTTP_CLOSE_REASONS:
            self.http_closed.labels(reason)
        self.inventory_renders = Counter(
            f"{P}_inventory_renders",
            "Times /inventory's answer was serialised: once per inventory version, however many ask.",
            registry=r,
        )

    def set_inventory(self, inv: Inventory) -> None:
        """Show `inv` in the inventory gauges; nothing to do if they show it already."""
        shown, self._shown = self._shown, inv
        if inv is shown or (shown is not None and _same_figures(inv, shown)):
            return  # a pod's change that moved no figure (most of them): the gauges are right
        self._inventory_page = None
        for g in (*self.resource.values(), *self.memory.values()):
            g.clear()
        # Per-NUMA pairs, like device_healthy's devices, are bounded by [http] max_device_series:
        # the totals (numa="all") always come first and are never left out.
        budget = self.max_device_series
        pairs = 0
        for cap in inv.capacity:
            self._resource(cap.resource, "all", cap.allocatable, cap.allocated, cap.free)
        for cap in inv.capacity:
            for n in cap.per_numa:
                pairs += 1
                if pairs <= budget:
                    self._resource(cap.resource, _numa(n.numa), n.allocatable, n.allocated, n.free)
        cpus = inv.cpus
        self._resource("cpu", "all", cpus.allocatable, cpus.allocated, cpus.free)
        for m in inv.memory_capacity:
            pairs += 1
            if pairs > budget:
                continue
            labels = (device_label(m.type), _numa_set(m.numa))
            for state, value in (
                ("allocatable", m.allocatable),
                ("allocated", m.allocated),
                ("free", m.free),
            ):
                if value is not None:
                    self.memory[state].labels(*labels).set(value)
        omitted = max(0, pairs - budget)
        if omitted and not self.device_health.numa_omitted:  # once per crossing, not per inventory
            log.warning(
                "more (resource, NUMA node) pairs than [http] max_device_series: the per-NUMA "
                "resource_* and memory_* series leave some out (the totals are kept)",
                pairs=pairs,
                max_device_series=budget,
                omitted=omitted,
            )
        self.device_health.numa_omitted = omitted
        if shown is None or not _same_devices(inv, shown):
            self._set_device_health(inv)

    def _set_device_health(self, inv: Inventory) -> None:
        samples = _device_samples(inv)
        kept = samples[: self.max_device_series]
        omitted = len(samples) - len(kept)
        if omitted and not self.device_health.omitted:  # once per crossing, not per inventory
            log.warning(
                "more devices than [http] max_device_series: device_healthy leaves some out "
                "(failed devices are kept first)",
                devices=len(samples),
                max_device_series=self.max_device_series,
                omitted=omitted,
            )
        self.device_health.samples = tuple(kept)
        self.device_health.omitted = omitted

    def _resource(self, resource: str, numa: str, *values: int | None) -> None:
        labels = (device_label(resource), numa)
        for state, value in zip(("allocatable", "allocated", "free"), values, strict=True):
            if value is not None:
                self.resource[state].labels(*labels).set(value)

    def set_outbox(self, stats: Mapping[str, SinkStats]) -> None:
        self.outbox.stats = dict(stats)
        # Each sink's dead-letter count from 0, so an alert's increase() sees its first dead letter.
        for sink in stats:
            self.deliveries.labels(sink, "dead_letter")

    def observe_delivery(
        self, sink: str, result: str, events: Sequence[Event], _seconds: float = 0.0
    ) -> None:
        """A delivery observer: counts what each sink did and, when delivered, how late."""
        self.deliveries.labels(sink, result).inc(len(events))
        if result == "delivered":
            now = datetime.now(UTC)
            for event in events:
                created = datetime.fromisoformat(event.time.replace("Z", "+00:00"))
                self.delivery_latency.labels(sink).observe(max(0.0, (now - created).total_seconds()))

    # -- the HTTP server's figures (watcher.ops.http.HttpFigures) --

    def http_connection_closed(self, reason: str) -> None:
        self.http_closed.labels(reason).inc()

    def http_connections_open(self, count: int) -> None:
        self.http_connections.set(count)

    def inventory_rendered(self) -> None:
        self.inventory_renders.inc()

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` (without the prefix) whose labels include `labels`,
        e.g. `value("requeries_total", result="failed")` or `value("events_total")` for every
        kind: what tests and the demo read, so there is one set of counters."""
        full = f"{P}_{name}"
        return sum(
            s.value
            for registry in (self.registry, self._inventory_registry)
            for family in registry.collect()
            for s in family.samples
            if s.name == full and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def render(self) -> bytes:
        """The exposition page: the live figures rendered now, then the inventory's as last shown
        (the two registries share no metric name, so the page is one valid exposition)."""
        if self._inventory_page is None:
            self._inventory_page = generate_latest(self._inventory_registry)
        return generate_latest(self.registry) + self._inventory_page
