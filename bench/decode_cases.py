"""The decoder alone on a large node, in this process: a changed answer (one pod's CPU added) and
an unchanged one (the same pods in a new order), in two cases. First the pods' bytes repeat from
answer to answer, as the real kubelet lists a pod (containers in spec order, CPU ids sorted): the
decoder takes those pods unparsed. Then the worst case: every container holds four CPU ids and
every answer reshuffles them, so no pod's bytes repeat and each pod is parsed, its containers too.
Per case, the decode plus what the cycle asks of the result next (its hash, the changed pods, the
carried tally): CPU time p50 and max.

    python bench/decode_cases.py [--pods 10000] [--rounds 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import gc
import statistics
import tempfile
import time

from bench.scale_kubelet import PrebuiltKubelet
from watcher.kubelet.decoding import Decoder, Outcome
from watcher.model.inventory import Inventory, changed_pods
from watcher.sim.fake_node import large_node

__all__ = ["main"]

CASES = ("pods' bytes repeat (the List order shuffled)", "no pod's bytes repeat (every pod reshuffled)")


def _worst(kubelet: PrebuiltKubelet) -> None:
    for pod in kubelet.node.pods.values():
        for c in pod.containers:
            base = min(c.cpu_ids)
            c.cpu_ids |= {(base + i) % 512 for i in (1, 2, 3)}


def _answers(kubelet: PrebuiltKubelet, reshuffle: bool, change: bool) -> tuple[bytes, bytes]:
    if change:
        kubelet.change_one_pod()
    if reshuffle:  # every pod serialized anew, its CPU ids in a fresh order
        kubelet._entries = {key: kubelet._entry(pod) for key, pod in kubelet.node.pods.items()}
        kubelet.rebuild()
    return kubelet._alloc, kubelet.list_response().raw


def _cycle(
    decoder: Decoder, before: Inventory, answers: tuple[bytes, bytes]
) -> tuple[float, Inventory, Outcome]:
    gc.collect()
    t0 = time.process_time()
    after, outcome = decoder.decode(*answers)
    _ = after.content_hash
    if after is not before:
        after.carry_tally(before)
        changed_pods(before, after)
        _ = after.tally
    return time.process_time() - t0, after, outcome


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prw-decode-") as tmp:
        kubelet = PrebuiltKubelet(Path(tmp), large_node(pods=args.pods), seed=1)
        for case in CASES:
            reshuffle = case == CASES[1]
            if reshuffle:
                _worst(kubelet)
            decoder = Decoder()
            last, _ = decoder.decode(*_answers(kubelet, reshuffle, change=False))
            _ = last.tally, last.content_hash
            times: dict[str, list[float]] = {"changed": [], "unchanged": []}
            for _round in range(args.rounds):
                for change in (True, False):
                    dt, last, outcome = _cycle(decoder, last, _answers(kubelet, reshuffle, change))
                    assert outcome is (Outcome.CHANGED if change else Outcome.REORDERED), outcome
                    times["changed" if change else "unchanged"].append(dt)
            for kind, xs in times.items():
                print(
                    f"{args.pods:,} pods, {case}, {kind}: CPU p50 {statistics.median(xs) * 1e3:.1f} ms, "
                    f"max {max(xs) * 1e3:.1f} ms ({len(xs)} cycles; pods parsed {decoder.stats.pods_parsed:,})"
                )


if __name__ == "__main__":
    main()
