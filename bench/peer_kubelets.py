"""The two kubelets bench/peer_beside.py runs both tools against, one interface for each:
kubelet-lite (upstream's device manager and pod-resources server, our device plugin) and the fake
kubelet in a process of its own (`python bench/peer_kubelets.py ROOT`), driven through its stdin.
Each admits pod bench/gpu-N with one GPU, removes it, turns a GPU unhealthy or healthy, and says
the pod-resources calls so far by client (the fake only: kubelet-lite counts nothing)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.peers import PEERS_BIN

__all__ = ["DEVICES", "GPU", "NAMESPACE", "NODE", "FakeChild", "Lite", "serve"]

NODE = "bench-node"
NAMESPACE = "bench"
GPU = "example.com/gpu"
DEVICES = ("gpu0", "gpu1", "gpu2", "gpu3")


def serve(root: Path) -> None:
    """Four GPUs on NUMA node 0 and the host's CPUs 0-1; commands on stdin, one answer line each:
    `add N DEV` (pod bench/gpu-N's container main given DEV), `remove N`, `health DEV 0|1`, `calls`."""
    from grpc import aio

    from watcher.sim.fake_kubelet import FakeKubelet
    from watcher.sim.fake_node import FakeDevice, FakeNode

    class Kubelet(FakeKubelet):
        by_client: dict[str, Counter[str]]

        async def _serve(
            self,
            method: str,
            request: bytes,
            context: aio.ServicerContext[bytes, bytes],
            build: Callable[[bytes], Any],
        ) -> bytes:
            answer = await super()._serve(method, request, context, build)
            agent = dict(context.invocation_metadata() or ()).get("user-agent", "")
            self.by_client["nfd" if "grpc-go" in str(agent) else "ours"][method] += 1
            return answer

    async def main() -> None:
        node = FakeNode(cpu_ids={0, 1})
        for device in DEVICES:
            node.add_device(FakeDevice(GPU, device, (0,)))
        kubelet = Kubelet(root, node, seed=1, node_name=NODE)
        kubelet.by_client = {"ours": Counter(), "nfd": Counter()}
        await kubelet.start()
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            words = line.split()
            if words[0] == "add":
                kubelet.allocate(NAMESPACE, f"gpu-{words[1]}", "main", devices={GPU: [words[2]]})
            elif words[0] == "remove":
                kubelet.free(NAMESPACE, f"gpu-{words[1]}")
            elif words[0] == "health":
                kubelet.set_healthy(GPU, words[1], words[2] == "1")
            print(json.dumps({k: dict(v) for k, v in kubelet.by_client.items()}), flush=True)
        await kubelet.stop(remove_socket=True)

    asyncio.run(main())


class FakeChild:
    """The fake kubelet's process, driven through its stdin."""

    def __init__(self, root: Path) -> None:
        self.root = root
        command = [sys.executable, __file__, str(root)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    async def start(self) -> None:
        assert self.proc.stdout is not None
        if await asyncio.to_thread(self.proc.stdout.readline) != "ready\n":
            raise RuntimeError("the fake kubelet did not start")

    async def admit(self, n: int) -> str:
        device = DEVICES[n % len(DEVICES)]
        await asyncio.to_thread(self._ask, f"add {n} {device}")
        return device

    async def remove(self, n: int) -> None:
        await asyncio.to_thread(self._ask, f"remove {n}")

    async def health(self, device: str, healthy: bool) -> None:
        await asyncio.to_thread(self._ask, f"health {device} {int(healthy)}")

    async def calls(self) -> dict[str, dict[str, int]] | None:
        answer: dict[str, dict[str, int]] = json.loads(await asyncio.to_thread(self._ask, "calls"))
        return answer

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.to_thread(self.proc.wait, 30)


class Lite:
    """kubelet-lite with one device plugin serving the four GPUs (NUMA node 0)."""

    def __init__(self, root: Path) -> None:
        from testkit.kubelet_lite import DevicePlugin, KubeletLite

        self.root = root
        self.kubelet = KubeletLite(
            PEERS_BIN / "kubelet-lite", PEERS_BIN / "device-plugin", root, numa_nodes=1
        )
        self.plugin: DevicePlugin | None = None

    async def start(self) -> None:
        await self.kubelet.start()
        self.plugin = await self.kubelet.add_plugin(GPU, {d: [0] for d in DEVICES})

    async def admit(self, n: int) -> str:
        held = await self.kubelet.admit(NAMESPACE, f"gpu-{n}", {"main": {GPU: 1}})
        return held["main"][GPU][0]

    async def remove(self, n: int) -> None:
        await self.kubelet.remove(NAMESPACE, f"gpu-{n}")

    async def health(self, device: str, healthy: bool) -> None:
        assert self.plugin is not None
        await self.plugin.set_healthy(device, healthy)

    async def calls(self) -> dict[str, dict[str, int]] | None:
        return None  # kubelet-lite counts nothing

    async def stop(self) -> None:
        await self.kubelet.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
