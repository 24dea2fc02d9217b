"""`demo --kubernetes`: what the kubernetes sink puts where operators look, in seconds.

A simulated kubelet, the agent with a console sink and the kubernetes sink, and a local fake API
server that holds the agent to the real API's contract (the events.k8s.io rules, RBAC from the
shipped ClusterRole, which the package carries as data; the OpenAPI schemas when a schema check is
passed in, as the tests do). A GPU fails while a pod holds it, then heals; after
each step the demo prints what `kubectl describe pod` and `kubectl describe node` show (with the
real kubectl when it is installed, else the objects as the API server holds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from watcher.app import Agent
from watcher.ops.logs import configure_logging
from watcher.settings import HttpSettings, KubeletSettings, LogSettings, Settings, WatchSettings
from watcher.sim.apiserver import (
    FakeApiServer,
    SchemaCheck,
    grants_for,
    kubectl,
    pod_bound_user,
    shipped_rbac,
)
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.kubernetes import KubernetesSinkSettings
from watcher.sinks.kubernetes.condition_plan import condition_type
from watcher.sinks.stdout import StdoutSinkSettings

__all__ = ["run_kubernetes_demo"]

NODE = "demo-node"
GPU = "nvidia.com/gpu"
CONDITION = condition_type(GPU)
STEP_TIMEOUT_S = 15.0
NAMESPACE = "pod-resources-watcher"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:pod-resources-watcher"


class _Waiter:
    """Wakes on every delivery of the agent, to re-check what the API server holds."""

    def __init__(self, agent: Agent) -> None:
        self._changed = asyncio.Event()
        agent.subscribe_deliveries(lambda *_: self._changed.set())

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


async def run_kubernetes_demo(*, out: TextIO | None = None, schema: SchemaCheck | None = None) -> int:
    """Play the story; `schema` is the API server's schema check (none: the demo needs only what
    the package ships)."""
    out = out if out is not None else sys.stdout
    configure_logging("warning", "console")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prw-k8s-demo-") as tmp:
        root = Path(tmp)
        fake = FakeKubelet(root / "kubelet")
        rules = {
            "agent": grants_for(shipped_rbac(), service_account="pod-resources-watcher", namespace=NAMESPACE)
        }
        users = {"agent": pod_bound_user(SERVICE_ACCOUNT, node=NODE, pod=f"pod-resources-watcher-{NODE}")}
        api = FakeApiServer(root / "api", users=users, rules=rules, schema=schema)
        await api.start()
        api.add_node(NODE)
        for (namespace, name), pod in sorted(fake.node.pods.items()):
            api.add_pod(namespace, name, NODE, uid=pod.uid)  # the kubelet's pod is the API server's
        admin = api.write_kubeconfig(root / "admin.kubeconfig", "admin")
        settings = Settings(
            node=NODE,
            state_dir=root / "state",
            kubelet=KubeletSettings(socket=fake.socket_path, root_dir=root / "kubelet"),
            watch=WatchSettings(interval=10),
            log=LogSettings(level="warning"),
            http=HttpSettings(enabled=False),
            sinks=(
                StdoutSinkSettings(name="console", format="text", kinds=("device.*", "watcher.*")),
                KubernetesSinkSettings(
                    name="kubernetes", kubeconfig=api.write_kubeconfig(root / "agent.kubeconfig", "agent")
                ),
            ),
        )
        print(f"Simulated kubelet: {fake.socket_path}", file=out)
        print(f"Fake Kubernetes API server: {api.url} (node {NODE}, the pods the kubelet runs)", file=out)
        shipped = "the shipped ClusterRole (deploy/kubernetes/reporting/rbac.yaml)"
        print(f"The agent's credentials: {shipped}", file=out)
        tool = shutil.which("kubectl")
        await fake.start()
        agent = Agent(settings)
        waiter = _Waiter(agent)
        task = asyncio.create_task(agent.run(), name="demo-agent")
        try:
            print("\n== Baseline: the agent starts and sets its Node condition", file=out, flush=True)
            await waiter.until(lambda: _condition(api) is not None)
            await _show_node(api, admin, tool, out)

            trainer_gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
            print(f"\n== {trainer_gpu} fails while allocated to ml/trainer-0", file=out, flush=True)
            fake.make_unhealthy(GPU, trainer_gpu)
            await waiter.until(
                lambda: (_condition(api) or {}).get("status") == "True" and _has(api, "DeviceFailed")
            )
            await _show_pod(api, admin, tool, out)
            await _show_node(api, admin, tool, out)

            print(f"\n== {trainer_gpu} heals", file=out, flush=True)
            fake.heal(GPU, trainer_gpu)
            await waiter.until(
                lambda: (_condition(api) or {}).get("status") == "False" and _has(api, "DeviceRecovered")
            )
            await _show_pod(api, admin, tool, out)
            await _show_node(api, admin, tool, out)
        finally:
            agent.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
            await fake.stop(remove_socket=True)
            await api.stop()
        mine = [r for r in api.requests if r.user == SERVICE_ACCOUNT]
        refused = sum(1 for r in mine if r.status >= 400)
        print("\n== Summary", file=out)
        written = len(api.events())
        print(
            f"API requests by the agent: {len(mine)} ({refused} refused), Events written: {written}", file=out
        )
        print(f"demo finished in {time.monotonic() - started:.1f} s", file=out)
    return 0


def _condition(api: FakeApiServer) -> dict[str, Any] | None:
    found = [c for c in api.node(NODE)["status"].get("conditions", []) if c["type"] == CONDITION]
    return found[0] if found else None


def _has(api: FakeApiServer, reason: str) -> bool:
    return any(e["reason"] == reason for e in api.events())


async def _show_pod(api: FakeApiServer, admin: Path, tool: str | None, out: TextIO) -> None:
    if tool is None:
        print("  Events on pod ml/trainer-0 (kubectl not found: as the API server holds them):", file=out)
        for e in api.events():
            if e["regarding"]["kind"] == "Pod" and e["regarding"]["name"] == "trainer-0":
                print(f"    {e['type']:<8} {e['reason']:<16} {e['note']}", file=out)
        return
    text = await _kubectl(admin, "describe", "pod", "-n", "ml", "trainer-0")
    print("  $ kubectl describe pod -n ml trainer-0   (its Events)", file=out)
    _print_section(text, "Events:", out)


async def _show_node(api: FakeApiServer, admin: Path, tool: str | None, out: TextIO) -> None:
    if tool is None:
        print(f"  Conditions of node {NODE} (kubectl not found: as the API server holds them):", file=out)
        for c in api.node(NODE)["status"]["conditions"]:
            print(
                f"    {c['type']:<30} {c['status']:<6} {c.get('reason', '')}: {c.get('message', '')}",
                file=out,
            )
        return
    text = await _kubectl(admin, "describe", "node", NODE)
    print(f"  $ kubectl describe node {NODE}   (Conditions, and its Events)", file=out)
    _print_section(text, "Conditions:", out)
    _print_section(text, "Events:", out)


async def _kubectl(admin: Path, *args: str) -> str:
    rc, text, err = await kubectl(admin, *args)
    return text if rc == 0 else f"kubectl failed: {err.strip()}\n"


def _print_section(text: str, header: str, out: TextIO) -> None:
    """The lines of `header`'s section in kubectl describe's output (up to the next header)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(header))
    except StopIteration:
        print(f"    ({header} not shown)", file=out)
        return
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines)
    )
    for line in lines[start:end]:
        print(f"    {line}", file=out)
