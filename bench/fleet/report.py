"""The fleet section's part of BENCHMARKS.md (section 10): the phases, the sustained capacity, the
leader kill, the goals and any profiles."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from bench.figures import dur, pct, rerun, verdict
from bench.fleet.goals import render_goals
from bench.fleet.results import Capacity, FleetResult, Phase

__all__ = ["render_fleet"]


def _made_late(capacity: Sequence[Capacity]) -> str:
    """What the capacity rows say of events made while their clock ran (older results: unknown)."""
    late = [c for c in capacity if c.made_late]
    if not late:
        known = all(c.made_late is not None for c in capacity)
        return (
            "no node ran out of them in any row" if known else "older results do not say whether any ran out"
        )
    rows = ", ".join(f"{c.sink} {c.nodes:,} nodes: {c.made_late:,}" for c in late)
    return f"nodes that ran out made more while the clock ran ({rows})"


def _runs(c: Capacity) -> str:
    """A capacity row's events/s: its median run, and the range when there were several."""
    runs = c.runs or (c.per_s,)
    if len(runs) == 1:
        return f"{c.per_s:,.0f}"
    return f"{c.per_s:,.0f} ({min(runs):,.0f}-{max(runs):,.0f})"


def _opt(x: Any, fmt: str = "{:,}") -> str:
    return "—" if x is None else fmt.format(x)


def _fleet_row(label: str, row: Phase) -> str:
    lat = row.latency
    p50 = dur(statistics.median(lat)) if lat else "—"
    p99 = dur(pct(lat, 99)) if lat else "—"
    top = dur(max(lat)) if lat else "—"
    return (
        f"| {label} | {row.sink} | {row.nodes:,} | {row.connections:,} | {row.events:,} | "
        f"{row.per_s:,.0f} | {p50} | {p99} | {top} | {_opt(row.lag_max)} | {_opt(row.lag_end)} | "
        f"{row.lost:,} | {row.duplicated:,} | {row.retries:,} |"
    )


def render_fleet(f: FleetResult) -> list[str]:
    lines = [*_intro(f), *_phases(f), *_capacity(f), *_failover(f), *render_goals(f)]
    if f.plan.quick and not f.profiles:
        lines += ["(A --quick run takes no profiles.)", ""]
    for name, rows in f.profiles.items():
        lines += [f"Profile ({name}; cProfile, top entries by own time):", "", "```", *rows, "```", ""]
    return [*lines, rerun("fleet"), ""]


def _intro(f: FleetResult) -> list[str]:
    """What the section measures and how."""
    p = f.plan
    rate = p.per_node_rate * 1000
    steady_kinds = "; ".join(" + ".join(c) for c in f.script.steady)
    lines = [
        "## 10. Fleet: NATS JetStream beside one webhook receiver",
        "",
        "Simulated nodes play the agent's own events (the simulated node's inventories diffed by the agent's "
        f"model, one seq per node; steady re-queries: {steady_kinds}) through the sinks' own delivery code: "
        "each node has its own queue and its own nats sink (`NatsSink.deliver`, with the sink's `Publisher` "
        "at its defaults: max_in_flight 1, the publish timeout; everything queued up to its max_batch in "
        "one delivery, what is not `done` sent again after the worker's backoff) into a real "
        "3-node JetStream cluster on loopback (three `nats-server` processes, the stream made by the sink's "
        "`ensure_stream`: 3 replicas, file storage, duplicate window one day); or its own "
        "`WebhookSink.deliver` (batch on) into one aiohttp receiver on loopback. Steady state: "
        f"{rate:g} events/s per 1,000 nodes as Poisson re-queries over the fleet for {p.steady_s:g} s; "
        f"then the burst: {p.burst_share:.0%} of the nodes each lose a GPU that a pod holds at the same "
        f"instant ({' + '.join(f.script.burst)}). Publish to consumer: from the node's first "
        "delivery of the event to its arrival at a durable pull consumer (each message acknowledged) in this "
        "process; for the webhook, from `deliver` to the receiver. Consumer lag: the stream's last "
        "sequence minus the consumer's acknowledgement floor, sampled every 250 ms. Lost and duplicated: "
        "the stream read back whole after each run (ids sent but absent; ids stored twice); for the "
        "webhook, what the receiver got. Everything, the three servers included, shares this "
        "machine's two cores; `bench/fleet/` says how each figure is made.",
        "",
    ]
    if f.plan.quick:
        lines += ["(A --quick run: tiny fleets and windows, not for the record.)", ""]
    return lines


def _phases(f: FleetResult) -> list[str]:
    """How the nodes start, and the steady and burst phases' table."""
    p = f.plan
    lines: list[str] = []
    conn = "; ".join(
        f"{c.nodes:,} nodes"
        + (f" sharing {c.connections:,} connections" if c.shared else "")
        + f" in {c.start_s:.1f} s (+{c.rss_mib:.0f} MiB RSS in this process)"
        for c in f.connect
    )
    hooks = f.webhook.steady
    lines += [
        "Each simulated node starts as an agent does: its first delivery (watcher.started) connects its "
        "own nats sink (`NatsSink`, the agent's, one connection per node), checks the stream and publishes, "
        f"a few hundred nodes at a time, before the clock starts; beyond {p.max_connections:,} nodes, "
        "nodes would share connections round-robin, each with its own JetStream context and `Publisher` "
        f"as the sink makes them. Started: {conn}. Webhook: {hooks.nodes:,} nodes share "
        f"{hooks.connections:,} sinks (an aiohttp session each, made beforehand in "
        f"{hooks.open_s:.1f} s: a session's TLS context costs tens of ms of CPU, which an agent pays "
        "once when it starts).",
        "",
        "| phase | sink | nodes | connections | events | events/s | publish to consumer p50 | p99 | max "
        "| consumer lag, max | at the end | lost | duplicated | retries |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in [*f.fleets, f.webhook]:
        steady, burst = run.steady, run.burst
        lines.append(_fleet_row(f"{steady.nodes:,} nodes, steady", steady))
        lines.append(
            _fleet_row(f"{burst.nodes:,} nodes, burst ({burst.burst_nodes:,} nodes lose a GPU)", burst)
        )
    return lines


def _capacity(f: FleetResult) -> list[str]:
    """The sustained capacity's table."""
    p = f.plan
    lines: list[str] = []
    lines += [
        "",
        "Events/s: steady, what arrived over the window (the offered rate); burst, the burst's events "
        "over the time from its start to its last arrival.",
        "",
        "### Sustained capacity",
        "",
        f"Simulated nodes deliver full batches back to back; after {p.warmup_s:g} s of warm-up, "
        f"what the stream holds (stream info; for the webhook, what the receiver got) is counted over "
        f"{p.capacity_s:g} s. CPU over the same time, in cores (the machine has 2): the generator "
        "processes (this one, or those it started) and the three servers. The nodes' events are made "
        "before the clock starts, as an agent makes them in its own cycle on its own node, so what is "
        "timed is the sink's publishing (serialization, headers, the client library, the "
        "acknowledgements), not one process building envelopes for hundreds of nodes; "
        + _made_late(f.capacity)
        + ". "
        + (
            f"Each row ran {p.capacity_runs} times, a fresh stream each time: its events/s is the "
            "median run's, with the range of the runs in brackets (one run varies by a fifth or more "
            "here, where the three servers share two cores with the generators), and its CPU the "
            "median run's."
            if p.capacity_runs > 1
            else "Each row ran once."
        ),
        "",
        "| sink | nodes | connections | generator processes | max_in_flight | batch | events/s "
        "| generators (cores) | 3 servers (cores) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in f.capacity:
        servers = "—" if c.server_cores is None else f"{c.server_cores:.2f}"
        conns = f"{c.connections:,}" + (" sinks" if c.sink == "webhook" else "")
        lines.append(
            f"| {c.sink} | {c.nodes:,} | {conns} | {c.processes} | {c.max_in_flight} | "
            f"{c.batch} | {_runs(c)} | {c.generator_cores:.2f} | {servers} |"
        )
    lines += [
        "",
        "A Python process runs on one core at most: a row whose generators are near 1.0 per process "
        "is bounded by its load generator (the sink's serialization, the client library), not by the "
        "cluster; every row is a lower bound of what the cluster takes. The "
        "webhook's receiver runs in the generator's process. Goal: >= 5,000 events/s into the cluster "
        "at the sink's defaults (max_in_flight 1), judged on the best such row.",
        "",
    ]
    return lines


def _failover(f: FleetResult) -> list[str]:
    """The stream's leader killed mid-load."""
    lines: list[str] = []
    o = f.failover
    lines += ["### The stream leader killed mid-load", ""]
    if o.killed is None:
        lines += ["(No kill in this run.)", ""]
    else:
        lat = o.latency
        lines += [
            f"{o.nodes:,} nodes ({o.connections:,} connections) at {o.rate:,.0f} events/s for "
            f"{o.seconds:g} s; {o.kill_at_s:.1f} s in, the stream's leader ({o.killed}) is killed "
            f"(SIGKILL), restarted {o.down_s:.1f} s later on its store (healthy {o.rejoin_s:.1f} s "
            f"after that); the leader then: {o.new_leader}. Every node retries until its events are "
            "stored. Longest stall: from an event's first publish to its acknowledgement (the worker's "
            "backoff included); no acknowledgement at all: the longest time in which the cluster "
            "acknowledged nothing.",
            "",
            "| events | longest stall | no acknowledgement at all | publish to consumer p50 | p99 "
            "| consumer lag, max | retries | lost | duplicated | out of order | goal |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {o.events:,} | {o.max_stall:.1f} s | {o.ack_gap:.1f} s | "
            f"{dur(statistics.median(lat)) if lat else '—'} | {dur(pct(lat, 99)) if lat else '—'} | "
            f"{o.lag_max:,} | {o.retries:,} | {o.lost:,} | {o.duplicated:,} | "
            f"{o.out_of_order:,} | {verdict(o.lost == 0 and o.duplicated == 0)} (0 and 0) |",
            "",
            f"The consumer received {o.received:,} of the {o.events:,} events "
            f"({o.deliveries - o.received:,} deliveries again, after a lost one). Why retries failed: "
            + (", ".join(f"{k} ({v:,})" for k, v in o.errors.items()) or "none")
            + "."
            + (
                f" Examples: lost {', '.join(o.examples['lost']) or '-'}; "
                f"stored twice {', '.join(o.examples['duplicated']) or '-'}."
                if o.lost or o.duplicated
                else ""
            ),
            "",
        ]
    return lines
