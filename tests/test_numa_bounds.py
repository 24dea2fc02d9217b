"""A device plugin's NUMA topology is its own choice: bounded in the model, the capacity figures, the
metrics and the agent's memory, whatever an answer under the receive limit lists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from watcher.kubelet.client import DEFAULT_MAX_RECEIVE_BYTES
from watcher.kubelet.decoding import Decoder, Outcome
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.capacity import NUMA_FIGURES_MAX
from watcher.model.records import NUMA_ID_LIMIT, NUMA_IDS_MAX
from watcher.ops.metrics import DEVICE_LABEL_MAX, Metrics

ROOT = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"
MIB = 1024 * 1024


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 on the wire: two's complement, ten bytes when negative
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _device_entry(resource: str, device_ids: list[str], numa: list[int]) -> bytes:
    """A ContainerDevices, encoded by hand: a million NUMANode messages built as objects first
    would cost the test more than the agent."""
    nodes = b"".join(_field(1, b"\x08" + _varint(i)) for i in numa)
    ids = b"".join(_field(2, d.encode()) for d in device_ids)
    return _field(1, resource.encode()) + ids + _field(3, nodes)


def _allocatable(*entries: bytes) -> bytes:
    return b"".join(_field(1, e) for e in entries)


def test_a_device_listing_100000_numa_ids_keeps_its_64_lowest_valid_ones_in_any_order() -> None:
    ids = [-5, 2**62, *range(100_000)]
    decoder = Decoder()
    inv, _ = decoder.decode(_allocatable(_device_entry(GPU, ["GPU-0"], ids)), b"")
    (device,) = inv.devices
    assert device.numa == tuple(range(NUMA_IDS_MAX))
    # The kubelet's order (a Go map) is no change; nor is splitting the ids over several entries.
    again = _allocatable(*(_device_entry(GPU, ["GPU-0"], ids[i::3][::-1]) for i in range(3)))
    same, outcome = decoder.decode(again, b"")
    assert outcome is Outcome.REORDERED and same is inv
    # Only ids outside what Linux numbers are dropped: a device on those alone has no topology.
    nowhere, _ = Decoder().decode(_allocatable(_device_entry(GPU, ["GPU-1"], [NUMA_ID_LIMIT, -1])), b"")
    assert nowhere.devices[0].numa == ()
    (cap,) = inv.capacity
    assert len(cap.per_numa) == NUMA_IDS_MAX and cap.allocatable == 1


def _spread_node(resources: int, devices: int) -> bytes:
    """`devices` devices per resource, each on 64 NUMA ids of its own in 0..1023: every
    (resource, NUMA node) pair there can be."""
    entries = []
    for r in range(resources):
        for d in range(devices):
            first = (d * NUMA_IDS_MAX) % NUMA_ID_LIMIT
            entries.append(_device_entry(f"r{r}", [f"d{d}"], list(range(first, first + NUMA_IDS_MAX))))
    return _allocatable(*entries)


def test_per_numa_figures_and_series_are_capped_and_the_totals_stay_exact() -> None:
    inv, _ = Decoder().decode(_spread_node(resources=40, devices=16), b"")
    caps = inv.capacity
    assert [c.allocatable for c in caps] == [16] * 40  # the totals: exact
    assert sum(len(c.per_numa) for c in caps) == NUMA_FIGURES_MAX < 40 * NUMA_ID_LIMIT
    metrics = Metrics(max_device_series=1024)
    metrics.set_inventory(inv)
    text = metrics.render().decode()
    per_numa = re.findall(r'^pod_resources_watcher_resource_allocatable\{numa="(\d+)"', text, re.M)
    totals = re.findall(r'^pod_resources_watcher_resource_allocatable\{numa="all"', text, re.M)
    assert len(per_numa) == 1024 and len(totals) == 40 + 1  # and the CPUs' total
    omitted = metrics.value("numa_series_omitted")
    assert omitted == NUMA_FIGURES_MAX - 1024


def test_every_label_value_is_cut() -> None:
    long_name = "vendor.example/" + "x" * 10_000
    memory = api_pb2.ContainerMemory(
        memory_type="hugepages-" + "y" * 10_000,
        size=1,
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=i) for i in range(1000)]),
    )
    alloc = _allocatable(_device_entry(long_name, ["d" * 10_000], list(range(1000)))) + _field(
        3, memory.SerializeToString()
    )
    inv, _ = Decoder().decode(alloc, b"")
    metrics = Metrics()
    metrics.set_inventory(inv)
    values = re.findall(r'="([^"]*)"', metrics.render().decode())
    assert values and max(map(len, values)) <= DEVICE_LABEL_MAX


# The cycle the agent runs on an answer, in a process of its own so that its peak RSS is the
# cycle's: decode, the capacity figures, the diff's events as JSON, the saved state's canonical
# JSON and /metrics. The answer's bytes are read before the peak is reset.
_CYCLE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from watcher.kubelet.decoding import Decoder
    from watcher.kubeletapi.v1 import api_pb2
    from watcher.model.diff import diff
    from watcher.ops.metrics import Metrics

    def status(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    decoder, metrics = Decoder(), Metrics()
    small = api_pb2.AllocatableResourcesResponse(
        devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-0"])]
    ).SerializeToString()
    before, _ = decoder.decode(small, b"")
    metrics.set_inventory(before)
    metrics.render()
    answer = Path(sys.argv[1]).read_bytes()
    floor = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    after, _ = decoder.decode(answer, b"")
    _ = after.capacity, after.missing_devices, after.memory_capacity, after.content_hash
    events = [json.dumps(dict(c.details)) for c in diff(before, after)]
    state = after.canonical_bytes
    metrics.set_inventory(after)
    scrape = metrics.render()
    print(json.dumps({"floor": floor, "peak": status("VmHWM"), "events": len(events),
                      "state": len(state), "scrape": len(scrape)}))
    """
)


def _worst_shape(shape: str) -> bytes:
    limit = DEFAULT_MAX_RECEIVE_BYTES - 4096
    if shape == "one_device":
        return _allocatable(_one_device(limit))
    return _allocatable(*_many_devices(limit))


def _one_device(limit: int) -> bytes:
    # One device on every id an answer can hold: 1.6 M of them, most outside what Linux numbers.
    one = _device_entry(GPU, ["GPU-0"], list(range(2**21)))
    per_id = len(one) / 2**21
    return _device_entry(GPU, ["GPU-0"], list(range(int(limit / per_id))))


def _many_devices(limit: int) -> list[bytes]:
    # As many devices as fit, each on 64 ids of its own (so no NUMA set is shared), over resources
    # that between them hold every (resource, NUMA node) pair.
    entry = len(_device_entry("r0000", ["d0000"], list(range(1000, 1064))))
    devices = limit // entry
    spread = []
    for n in range(devices):
        first = (n * 7) % (NUMA_ID_LIMIT - NUMA_IDS_MAX)
        spread.append(_device_entry(f"r{n % 4000:04}", [f"d{n:04}"], list(range(first, first + 64))))
    return spread


@pytest.mark.chaos  # long: `make chaos` runs it (CI runs both), `make test` leaves it out
@pytest.mark.parametrize("shape", ["one_device", "many_devices"])
def test_the_worst_numa_topology_the_limit_admits_stays_within_the_memory_formula(
    shape: str, tmp_path: Path
) -> None:
    """The documented formula: memory limit ~ 60 MiB + 16 x max_receive_bytes (16 bytes of the
    agent for each byte of the answer, over a floor of 60 MiB)."""
    answer = _worst_shape(shape)
    assert DEFAULT_MAX_RECEIVE_BYTES - 128 * 1024 < len(answer) <= DEFAULT_MAX_RECEIVE_BYTES
    path = tmp_path / "answer.bin"
    path.write_bytes(answer)
    done = subprocess.run(
        [sys.executable, "-c", _CYCLE, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(done.stdout.splitlines()[-1])  # after any log line
    assert figures["peak"] <= 60 * MIB + 16 * DEFAULT_MAX_RECEIVE_BYTES, figures
    assert figures["peak"] - figures["floor"] <= 16 * len(answer), figures
    assert figures["scrape"] < 2 * MIB, figures  # 4,000 resources: their totals are most of it
