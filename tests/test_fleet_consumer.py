"""examples/fleet_consumer.py, the reference consumer of the NATS sink, run as a process against a
real three-node JetStream cluster (tests/nats_cluster.py).

Its input is the agent's own events: built by the agent's model as the committer builds them
(`watcher.started` first, then `diff` of the kubelet's answers before and after each change, wrapped
by `envelope` with the node's next seq), published by the NATS sink's own `Publisher`
(subject `<prefix>.<node with '.' as '_'>.<kind>`, `Nats-Msg-Id` and `Prw-*` headers, the envelope
as compact JSON), so the example reads exactly what the sink writes.
"""

from __future__ import annotations

import ast
import asyncio
import random
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient

from testkit.nats_cluster import running_cluster
from watcher.model import lifecycle
from watcher.model.build import build
from watcher.model.changes import Change
from watcher.model.diff import diff
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.model.inventory import Inventory
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.sim.send_test import synthetic_events
from watcher.sinks.nats import Publisher

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fleet_consumer.py"
STREAM, PREFIX = "POD_RESOURCES", "pod-resources"
GPU = "nvidia.com/gpu"
_NODE = default_node()
TRAINER_GPU = _NODE.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
INFERENCE_GPU = _NODE.pods[("ml", "inference-7f9c")].container("server").devices[GPU][0]

# The example with a kill point: on the N-th batch it commits, it says so and hangs before acking
# it, so the test can SIGKILL it where a crash hurts the most (applied, but the stream does not know).
KILL_POINT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import fleet_consumer
real, nth, count = fleet_consumer.apply_batch, int(sys.argv[2]), 0
def apply_batch(db, messages):
    global count
    done = real(db, messages)
    count += 1
    if count == nth:
        print("holding", flush=True)
        time.sleep(60)
    return done
fleet_consumer.apply_batch = apply_batch
sys.exit(fleet_consumer.main(sys.argv[3:]))
"""


class NodeStory:
    """The events an agent on node `name` commits as its kubelet changes, in seq order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kubelet = FakeKubelet("/nonexistent", default_node(), shuffle=False)  # never started
        self.inventory = self._inventory()
        self.events: list[Event] = []
        self._wrap([lifecycle.started(self.inventory, baseline="fresh", changes=0, error=None)], None)

    def _inventory(self) -> Inventory:
        return build(self.kubelet.allocatable_response(), self.kubelet.list_response())

    def _wrap(self, changes: Sequence[Change], before: str | None) -> list[Event]:
        cycle, after, seq = new_cycle_id(), self.inventory.content_hash, len(self.events)
        new = [
            envelope(c, seq=seq + i, node=self.name, cycle=cycle, before=before, after=after)
            for i, c in enumerate(changes, start=1)
        ]
        self.events += new
        return new

    def step(self, change: Callable[[FakeKubelet], object]) -> list[Event]:
        change(self.kubelet)
        before, self.inventory = self.inventory, self._inventory()
        return self._wrap(diff(before, self.inventory), before.content_hash)


def _fail(gpu: str) -> Callable[[FakeKubelet], object]:
    return lambda k: k.make_unhealthy(GPU, gpu)


def _heal(gpu: str) -> Callable[[FakeKubelet], object]:
    return lambda k: k.heal(GPU, gpu)


async def _publish(
    nc: NatsClient, events: Sequence[Event], stream: str = STREAM, prefix: str = PREFIX
) -> None:
    """As the sink publishes them; every one newly stored (none dropped as a duplicate)."""
    publisher = Publisher(
        nc.jetstream(), stream=stream, prefix=prefix, timeout=10, max_in_flight=16, max_payload=nc.max_payload
    )
    # Retried from where it stopped, as the agent's worker does: right after a stream is created,
    # the server a client is on may not know yet that the stream takes the subject (no responders).
    rest, duplicates = list(events), 0
    for _ in range(50):
        published = await publisher.publish(rest)
        rest, duplicates = rest[published.done :], duplicates + published.duplicates
        if not rest:
            break
        await asyncio.sleep(0.1)
    assert (rest, duplicates) == ([], 0), published.error


async def _once(servers: list[str], db: Path, *args: str) -> tuple[str, str]:
    """The example run to completion with `--once`: (its table, its summary line on stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--once", "--servers", ",".join(servers), "--db", str(db), *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute(sql).fetchall())


def _failed(db: Path) -> set[tuple[Any, ...]]:
    return set(_query(db, "SELECT node, resource, device FROM devices WHERE state != 'present'"))


def _hit(db: Path) -> set[tuple[Any, ...]]:
    sql = """SELECT node, holder FROM holders JOIN devices USING (node, resource, device)
             WHERE held AND state != 'present'"""
    return set(_query(db, sql))


def _state(db: Path) -> list[list[tuple[Any, ...]]]:
    return [_query(db, f"SELECT * FROM {table}") for table in ("events", "devices", "holders")]


def _row(table: str, node: str) -> list[str]:
    """The cells of `node`'s line: node, failed devices, pods hit, seq, gaps, last event time."""
    lines = [line for line in table.splitlines() if line.split("  ")[0] == node]
    assert len(lines) == 1, table
    return re.split(r"\s{2,}", lines[0])


async def test_the_fleet_shows_a_failed_gpu_and_its_pod_until_healed_in_any_order(tmp_path: Path) -> None:
    seven, eight = NodeStory("gpu.node-7"), NodeStory("gpu-node-8")  # a dot: the subject says gpu_node-7
    seven.step(_fail(TRAINER_GPU))
    eight.step(_fail(INFERENCE_GPU))
    eight.step(lambda k: k.free("ml", "inference-7f9c"))  # the pod ends: its failed GPU hits no one
    db = tmp_path / "fleet.sqlite3"
    async with running_cluster(tmp_path / "nats") as cluster:
        await cluster.add_stream(STREAM, [f"{PREFIX}.>"])
        await cluster.stream_leader(STREAM)  # elected: publishing now finds the stream
        nc = await cluster.connect()
        try:
            # A send-test event in the stream (a device.removed marked as a test) changes nothing.
            await _publish(nc, seven.events + eight.events + synthetic_events("gpu-node-9", paging=False))
            table, _ = await _once(cluster.urls, db)
            assert "gpu-node-9" not in table
            assert _failed(db) == {("gpu.node-7", GPU, TRAINER_GPU), ("gpu-node-8", GPU, INFERENCE_GPU)}
            assert _hit(db) == {("gpu.node-7", "ml/trainer-0/trainer")}
            last = seven.events[-1]
            assert _row(table, "gpu.node-7") == [
                "gpu.node-7", f"{GPU} {TRAINER_GPU}", "ml/trainer-0", str(last.seq), "-", last.time
            ]  # fmt: skip
            assert _row(table, "gpu-node-8")[1:3] == [f"{GPU} {INFERENCE_GPU}", "-"]

            healed = seven.step(_heal(TRAINER_GPU))
            await _publish(nc, healed)
            table, summary = await _once(cluster.urls, db)
            assert f"applied {len(healed)} event(s), skipped 0" in summary  # from the durable position
            assert _failed(db) == {("gpu-node-8", GPU, INFERENCE_GPU)} and _hit(db) == set()
            assert _row(table, "gpu.node-7")[1:4] == ["-", "-", str(seven.events[-1].seq)]

            # The same events newest first, then again in random order (a publisher's retry after
            # the dedup window, which the stream keeps): another consumer ends in the same state.
            everything = seven.events + eight.events
            await cluster.add_stream("SHUFFLED", ["shuffled.>"], duplicate_window=0.1)
            await cluster.stream_leader("SHUFFLED")
            await _publish(nc, everything[::-1], "SHUFFLED", "shuffled")
            await asyncio.sleep(0.25)  # past the dedup window (100 ms, the server's least)
            await _publish(nc, random.Random(17).sample(everything, len(everything)), "SHUFFLED", "shuffled")
            info = await nc.jetstream().stream_info("SHUFFLED")
            assert info.state.messages == 2 * len(everything)
            other = tmp_path / "shuffled.sqlite3"
            shuffled, summary = await _once(
                cluster.urls, other, "--stream", "SHUFFLED", "--prefix", "shuffled", "--durable", "other"
            )
            assert f"applied {len(everything)} event(s), skipped {len(everything)} duplicate(s)" in summary
            assert _state(other) == _state(db) and shuffled == table
        finally:
            await nc.close()


async def test_a_consumer_killed_between_commit_and_ack_resumes_without_loss_or_double_apply(
    tmp_path: Path,
) -> None:
    stories = [NodeStory(f"gpu-node-{n}") for n in range(3)]
    gpus = sorted(d for r, d in _NODE.devices if r == GPU)
    for story in stories:
        for i in range(40):
            story.step(_fail(gpus[i % len(gpus)]))
            story.step(_heal(gpus[i % len(gpus)]))
        story.step(_fail(TRAINER_GPU))
    events = [e for story in stories for e in story.events]
    db, clean = tmp_path / "fleet.sqlite3", tmp_path / "uninterrupted.sqlite3"
    async with running_cluster(tmp_path / "nats") as cluster:
        await cluster.add_stream(STREAM, [f"{PREFIX}.>"])
        await cluster.stream_leader(STREAM)  # elected: publishing now finds the stream
        nc = await cluster.connect()
        try:
            await _publish(nc, events)
        finally:
            await nc.close()
        options = ("--batch", "50", "--ack-wait", "2")
        servers = ",".join(cluster.urls)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", KILL_POINT, str(EXAMPLE.parent), "4",
            "--once", "--servers", servers, "--db", str(db), *options,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"holding\n"
        finally:
            proc.kill()
            await proc.wait()
        assert len(_query(db, "SELECT id FROM events")) == 200  # four batches committed, one not acked

        # Restarted: the fourth batch comes back (after the ack wait) and changes nothing; the rest
        # is read from where the durable consumer stood, each event applied once.
        _, summary = await _once(cluster.urls, db, *options)
        assert f"applied {len(events) - 200} event(s), skipped 50 duplicate(s)" in summary
        await _once(cluster.urls, clean, "--durable", "uninterrupted")
        assert _state(db) == _state(clean)
        assert _failed(db) == {(story.name, GPU, TRAINER_GPU) for story in stories}
        assert _hit(db) == {(story.name, "ml/trainer-0/trainer") for story in stories}


def test_the_example_stands_alone() -> None:
    """It is what an inventory system would write: the stdlib and nats-py, never this package."""
    tree = ast.parse(EXAMPLE.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    foreign = {name for name in imported if name.split(".")[0] not in (*sys.stdlib_module_names, "nats")}
    assert not foreign and "nats" in imported
