"""Section 4: the agent's path for a changed answer on the large node (decode, hash, diff, the
events' envelopes), beside a full build of every answer."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.figures import p50_p99, pct, verdict
from bench.registry import Results, Section, part, section
from watcher.cycle.answers import gc_paused
from watcher.kubelet.decoding import Decoder
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.diff import diff
from watcher.model.events import envelope
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import large_node

__all__ = ["CHANGED", "Changed", "bench_changed"]


@dataclass(frozen=True)
class Changed:
    times: tuple[float, ...]  # seconds per changed answer, the agent's path
    kinds: dict[str, int]  # the events they made, by kind
    full_build: tuple[float, ...]  # seconds per full build of the same answers


def bench_changed(rounds: int) -> Changed:
    """The agent's path for a changed answer: decode (views, then only what changed), hash, diff
    and the events' envelopes. Every answer is freshly shuffled, as the kubelet sends it; the
    change alternates between a device's health (allocatable side) and a pod's allocation (List)."""
    fake = FakeKubelet("/nonexistent", large_node(), seed=1)
    decoder = Decoder()

    def answers() -> tuple[bytes, bytes]:
        return fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()

    prev, _ = decoder.decode(*answers())
    _ = prev.content_hash
    times: list[float] = []
    kinds: dict[str, int] = {}
    for i in range(rounds):
        if i % 2 == 0:
            fake.set_healthy("vendor1.example.com/dev", "dev-1-7", healthy=i % 4 != 0)
        elif i % 4 == 1:
            fake.allocate("ns-5", "pod-5", "c3", cpu_ids=[500])
        else:
            fake.node.pods[("ns-5", "pod-5")].container("c3").cpu_ids.discard(500)
        wire = answers()
        t0 = time.perf_counter()
        with gc_paused():  # as the agent does
            inv, _ = decoder.decode(*wire)
            _ = inv.content_hash
            changes = diff(prev, inv)
        for c in changes:
            envelope(
                c, seq=i, node="n", cycle="c", before=prev.content_hash, after=inv.content_hash
            ).to_json()
        times.append(time.perf_counter() - t0)
        assert changes, f"round {i}: the change was not seen"
        for c in changes:
            kinds[str(c.kind)] = kinds.get(str(c.kind), 0) + 1
        prev = inv
    # For the record: the old path, a full build of every answer, on the same answers.
    full: list[float] = []
    for _ in range(min(rounds, 50)):
        wire = answers()
        t0 = time.perf_counter()
        with gc_paused():
            inv = build(
                api_pb2.AllocatableResourcesResponse.FromString(wire[0]),
                api_pb2.ListPodResourcesResponse.FromString(wire[1]),
            )
            _ = inv.content_hash
        full.append(time.perf_counter() - t0)
    return Changed(tuple(times), kinds, tuple(full))


async def _run(rounds: int) -> Changed:
    return bench_changed(rounds)


CHANGED = section(
    Section(
        name="changed",
        title="changed re-query (decode, hash, diff, events) on a large node",
        order=90,
        full=300,
        quick=100,
        run=_run,
    )
)


@part((4, 0))
def render(results: Results) -> list[str]:
    c = results.get(CHANGED)
    if c is None:
        return []
    xs, full = c.times, c.full_build
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(c.kinds.items()))
    return [
        "## 4. Changed re-query",
        "",
        "Decode, hash, diff and build the events on the large node (512 CPUs, 8 NUMA nodes, 4 x 64 "
        "devices, 250 x 4 containers, 50 DRA claims), from freshly shuffled answers; the change "
        "alternates between a device's health and a pod's CPU allocation. Events: " + kinds + ".",
        "",
        "| path | n | p50 | p99 | goal |",
        "|---|---|---|---|---|",
        f"| the agent's (incremental decoder) | {len(xs)} | {p50_p99(xs)} | {verdict(pct(xs, 99) <= 0.02)} |",
        f"| for reference: a full build and hash of every answer | {len(full)} | {p50_p99(full)} | |",
        "",
        "Goal: p99 <= 20 ms.",
        "",
    ]
