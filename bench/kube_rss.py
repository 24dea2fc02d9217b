"""The agent's memory with the kubernetes sink on, side by side with the same agent without it.

Each run is a real `python -m watcher run` process against the built-in node of a fake kubelet;
the "with" runs add a kubernetes sink that reports into a local fake API server (the contract-
enforcing one the tests use). Each run waits for the start-up to be delivered, fails a GPU held by
a pod, heals it, waits until that is delivered, and then reads the process's VmRSS (now) and VmHWM
(peak) from /proc. Runs alternate without/with, `--rounds` times each, and the medians are printed.

    .venv/bin/python bench/kube_rss.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.kube_schemas import strict_schemas
from testkit.waiting import wait_until
from watcher.sim.apiserver import FakeApiServer
from watcher.sim.fake_kubelet import FakeKubelet

NODE = "bench-node"
GPU = "nvidia.com/gpu"
TIMEOUT_S = 30.0


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _audit_kinds(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["event"]["kind"] for line in path.read_text().splitlines() if '"event"' in line]


async def _one(root: Path, fake: FakeKubelet, api: FakeApiServer | None) -> dict[str, float]:
    audit = root / "state" / "audit.jsonl"
    sink = ""
    if api is not None:
        kubeconfig = api.write_kubeconfig(root / "agent.kubeconfig", "admin")
        sink = f'[sinks.k8s]\ntype = "kubernetes"\nkubeconfig = "{kubeconfig}"\n'
    config = root / "config.toml"
    config.write_text(
        f'node = "{NODE}"\nstate_dir = "{root / "state"}"\n'
        f'[kubelet]\nsocket = "{fake.socket_path}"\nroot_dir = "{fake.root}"\n'
        f'[http]\nenabled = false\n[log]\nlevel = "warning"\n'
        f'[sinks.audit]\ntype = "file"\npath = "{audit}"\n{sink}'
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "watcher", "run", "--config", str(config),
        cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]

        def condition(status: str) -> bool:
            if api is None:
                return True
            found = [
                c for c in api.node(NODE)["status"].get("conditions", []) if c["type"].startswith("NvidiaGpu")
            ]
            return bool(found) and found[0]["status"] == status

        await wait_until(
            lambda: "watcher.started" in _audit_kinds(audit) and condition("False"), TIMEOUT_S, what="start"
        )
        fake.make_unhealthy(GPU, gpu)
        await wait_until(
            lambda: "device.removed" in _audit_kinds(audit) and condition("True"), TIMEOUT_S, what="failure"
        )
        fake.heal(GPU, gpu)
        await wait_until(
            lambda: "device.added" in _audit_kinds(audit) and condition("False"), TIMEOUT_S, what="recovery"
        )
        if api is not None:
            await wait_until(
                lambda: any(e["reason"] == "DeviceRecovered" for e in api.events()), TIMEOUT_S, what="events"
            )
        return {"rss_mib": _status_mib(proc.pid, "VmRSS"), "peak_mib": _status_mib(proc.pid, "VmHWM")}
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)


async def bench(rounds: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(rounds):
        for variant in ("without", "with"):
            with tempfile.TemporaryDirectory(prefix="prw-kube-rss-") as tmp:
                root = Path(tmp)
                async with FakeKubelet(root / "kubelet") as fake:
                    api = None
                    if variant == "with":
                        api = FakeApiServer(root / "api", users={}, rules={}, schema=strict_schemas())
                        await api.start()
                        api.add_node(NODE)
                        for namespace, name in sorted(fake.node.pods):
                            api.add_pod(namespace, name, NODE)
                    try:
                        results[variant].append(await _one(root, fake, api))
                    finally:
                        if api is not None:
                            await api.stop()
    out: dict[str, Any] = {}
    for variant, runs in results.items():
        out[variant] = {k: round(statistics.median(r[k] for r in runs), 1) for k in ("rss_mib", "peak_mib")}
    out["difference_mib"] = {k: round(out["with"][k] - out["without"][k], 1) for k in ("rss_mib", "peak_mib")}
    out["rounds"] = rounds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args.rounds)), indent=2))


if __name__ == "__main__":
    main()
