"""How long building the inventory model and its hash takes on a very large node.

Not a test: a measurement. The node: 512 CPUs, 8 NUMA nodes, 4 resources x 64
devices, 250 pods x 4 containers (see watcher.sim.fake_node.large_node). The
responses are serialized once, as the kubelet would send them, and each round
parses them, builds the model, and hashes it from scratch.

    .venv/bin/python bench/inventory_build.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import large_node


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    fake = FakeKubelet("/nonexistent", large_node(), seed=1)  # never started: only builds responses
    alloc_raw = fake.allocatable_response().SerializeToString()
    list_raw = fake.list_response().SerializeToString()

    parse_ms, build_ms, total_ms = [], [], []
    digest = None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        alloc = api_pb2.AllocatableResourcesResponse.FromString(alloc_raw)
        pods = api_pb2.ListPodResourcesResponse.FromString(list_raw)
        t1 = time.perf_counter()
        inv = build(alloc, pods)
        h = inv.content_hash
        t2 = time.perf_counter()
        assert digest in (None, h)
        digest = h
        parse_ms.append((t1 - t0) * 1e3)
        build_ms.append((t2 - t1) * 1e3)
        total_ms.append((t2 - t0) * 1e3)

    containers = sum(len(p.containers) for p in inv.pods)
    print(
        f"node: {len(inv.cpu_ids)} CPUs, {len(inv.devices)} devices, {len(inv.pods)} pods, "
        f"{containers} containers; responses {len(alloc_raw) + len(list_raw)} bytes"
    )
    for name, xs in (("parse", parse_ms), ("build+hash", build_ms), ("total", total_ms)):
        print(
            f"{name:>10}: median {statistics.median(xs):6.2f} ms  min {min(xs):6.2f} ms  "
            f"max {max(xs):6.2f} ms  ({args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
