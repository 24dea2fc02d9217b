"""A fake kubelet for the scale section: the large node's shape at any pod count, its answers
built ahead, once per change, so serving one costs what sending its bytes costs.

A real kubelet (Go) builds a 10,000-pod List answer in milliseconds; the simulated one builds
it in Python per call, which would put the simulator's own time into the agent's wall time per
cycle. So: every pod is serialized once (its devices and CPU ids shuffled, as the kubelet's
maps do), and each answer is those pods in a fresh random order, concatenated (repeated message
fields are concatenated on the wire, so this is byte for byte what protobuf would encode). A
changed pod is serialized again. The allocatable answer is rebuilt (and reshuffled) per change.

Run as a process of its own; it reads commands on stdin and answers on stdout, one line each:

    python bench/scale_kubelet.py --root DIR (--pods N | --fit BYTES) [--seed S]
    -> "serving SOCKET PODS LIST_BYTES"
    change -> "changed NAMESPACE/NAME LIST_BYTES"   (one pod: a CPU added to its container c3)

`--fit BYTES`: the most pods (of the large node's shape) whose List answer stays within BYTES,
less room for the changes to come.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from watcher.sim import fake_answers
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeNode, FakePod, large_node

__all__ = ["PrebuiltKubelet", "pods_to_try", "list_entry"]

# Room left under --fit for the changes a run makes (each adds a CPU id, a few bytes).
FIT_MARGIN = 64 * 1024
# ListPodResourcesResponse.pod_resources is field 1, length-delimited.
_POD_TAG = b"\x0a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def list_entry(pod_bytes: bytes) -> bytes:
    """One serialized PodResources as an entry of a ListPodResourcesResponse."""
    return _POD_TAG + _varint(len(pod_bytes)) + pod_bytes


class _Raw:
    """Bytes served as they are: what FakeKubelet serializes is already serialized."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name, called by FakeKubelet
        return self.raw


class PrebuiltKubelet(FakeKubelet):
    """FakeKubelet whose answers are built when the node changes, not when they are asked for."""

    def __init__(self, root: Path, node: FakeNode, *, seed: int) -> None:
        super().__init__(root, node, rate=1e9, burst=10**9, seed=seed)
        self._entries: dict[tuple[str, str], bytes] = {
            key: self._entry(pod) for key, pod in node.pods.items()
        }
        self._alloc = b""
        self._ready: bytes | None = None  # the next List answer, built ahead
        self.changes = 0
        self.rebuild()

    def _entry(self, pod: FakePod) -> bytes:
        return list_entry(fake_answers.pod_resources(self.node, pod, self._shuffle).SerializeToString())

    def fit(self, budget: int) -> None:
        """Keep the first pods whose List answer fits in `budget` bytes; forget the others."""
        total = 0
        for key, entry in list(self._entries.items()):
            if total + len(entry) > budget:
                del self._entries[key], self.node.pods[key]
            else:
                total += len(entry)
        self.rebuild()

    def rebuild(self, changed: tuple[str, str] | None = None) -> None:
        """After a change: that pod's bytes, the allocatable answer, and the next List answer."""
        if changed is not None:
            self._entries[changed] = self._entry(self.node.pods[changed])
        self._alloc = fake_answers.allocatable_response(self.node, self._shuffle).SerializeToString()
        self._ready = self._fresh_list()

    def forget(self, key: tuple[str, str]) -> None:
        """A pod removed from the node: its bytes go, the answers are built again without it."""
        del self._entries[key]
        self.rebuild()

    def _fresh_list(self) -> bytes:
        entries = list(self._entries.values())
        self._shuffle(entries)
        return b"".join(entries)

    @property
    def list_bytes(self) -> int:
        return sum(len(e) for e in self._entries.values())

    def list_response(self) -> Any:
        # The answer after a change was built with it; any further one is built now (those
        # calls are not the ones measured), each in a fresh order.
        raw, self._ready = self._ready, None
        return _Raw(raw if raw is not None else self._fresh_list())

    def allocatable_response(self) -> Any:
        return _Raw(self._alloc)

    def write_state_files(self, *, checkpoint: bool = True) -> None:
        """None: the scale section drives the agent's cycles itself, no file watch is measured."""

    def change_one_pod(self) -> tuple[str, str]:
        """A small change: one more CPU for one pod's container c3 (a new pod each time)."""
        keys = list(self._entries)
        key = keys[(self.changes * 7919) % len(keys)]
        self.changes += 1
        container = self.node.pods[key].container("c3")
        free = next(c for c in sorted(self.node.cpu_ids) if c not in container.cpu_ids)
        container.cpu_ids.add(free)
        self.rebuild(changed=key)
        return key


def pods_to_try(budget: int) -> int:
    """A few more pods of the large node's shape than fit in `budget` bytes (`fit` trims them)."""
    probe = 2000
    node = large_node(pods=probe)
    sizes = [
        len(list_entry(fake_answers.pod_resources(node, pod, lambda _seq: None).SerializeToString()))
        for pod in node.pods.values()
    ]
    # The later pods' size (their names have more digits), and 1 % over: pod names grow longer.
    per_pod = sum(sizes[probe // 2 :]) / (probe - probe // 2)
    return int(budget / per_pod * 1.01) + 1


async def serve(root: Path, pods: int | None, fit: int | None, seed: int) -> None:
    if pods is None:
        assert fit is not None
        budget = fit - FIT_MARGIN
        pods = pods_to_try(budget)
    node = large_node(pods=pods)
    kubelet = PrebuiltKubelet(root, node, seed=seed)
    if fit is not None:
        kubelet.fit(budget)
    await kubelet.start()
    loop = asyncio.get_running_loop()
    print(f"serving {kubelet.socket_path} {len(node.pods)} {kubelet.list_bytes}", flush=True)
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "quit":
                break
            if line.strip() == "change":
                namespace, name = kubelet.change_one_pod()
                print(f"changed {namespace}/{name} {kubelet.list_bytes}", flush=True)
    finally:
        await kubelet.stop(remove_socket=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True, help="stand-in for /var/lib/kubelet")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--pods", type=int)
    size.add_argument("--fit", type=int, help="the most pods whose List answer fits in this many bytes")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(serve(args.root, args.pods, args.fit, args.seed))


if __name__ == "__main__":
    main()
