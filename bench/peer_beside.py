"""Our agent and node-feature-discovery's nfd-topology-updater side by side in one run, against
the same kubelet: kubelet-lite (upstream's device manager and pod-resources server, our device
plugin), then the fake kubelet (a process of its own). Both tools run at once as processes of
their own; the API server they need (nfd reads every listed pod from it) is kube-testcluster.

    python bench/peer_beside.py [--changes 3] [--idle 120] [--sleep-interval 60] [--kubelets lite,fake]

Per kubelet and tool (JSON on stdout):
  added_s       a pod given a GPU: from the request to the kubelet to the tool's output showing
                it (ours: the stdout sink's event line, written once the event is stored; nfd: the
                first zones record whose available counts differ from the one before); None: none
                within its -sleep-interval + 15 s
  removed_s     the same pod removed (kubelet-lite, like a kubelet, rewrites no state file then)
  unhealthy_s   an allocated GPU turning unhealthy: to ours' event; for nfd to its next zones
                record (it rescans: the checkpoint was rewritten), with `unhealthy_shown` saying
                whether that record differs at all
  idle_cpu_pct  the process's own utime + stime (/proc/PID/stat) over the idle window, % of a core
  rss_mib       VmRSS at the window's end
  rpcs_per_min  pod-resources calls at the kubelet over the idle window, per method (the fake
                only: it tells its clients apart by gRPC user-agent; kubelet-lite counts nothing)
  calls         the same, over the whole round (start-up and changes included)
Ours runs with default settings (`python -m watcher run`, the stdout sink); nfd with -no-publish,
its -sleep-interval as given (its default is 60 s). A tool that fails is reported with its error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.nfd_peer import NFD, NfdOutput, kubelet_config, nfd_argv, outputs, scan_errors
from bench.peer_kubelets import GPU, NAMESPACE, NODE, FakeChild, Lite
from bench.stamped import StampedProcess, rss_mib
from bench.steady import cpu_seconds
from testkit.peers import PEERS_BIN
from testkit.ports import free_port

START_S = 60.0
EVENT_S = 30.0
# Changes are spaced: what is measured is a change to output, not our own RPC cap (5 calls/s)
# refilling after the change before.
SPACING_S = 1.0
NEEDED = ("kube-testcluster", "kubelet-lite", "device-plugin", "nfd-topology-updater")


# --- the tools ---


class Ours:
    """`python -m watcher run`, defaults but for where the files are; its stdout events, stamped."""

    def __init__(self, root: Path, kubelet_root: Path) -> None:
        config = root / "config.toml"
        config.write_text(
            f'node = "{NODE}"\nstate_dir = "{root / "state"}"\n[kubelet]\n'
            f'socket = "{kubelet_root / "pod-resources" / "kubelet.sock"}"\nroot_dir = "{kubelet_root}"\n'
            f'[http]\nlisten = "127.0.0.1:{free_port()}"\n'
        )
        argv = [sys.executable, "-m", "watcher", "run", "--config", str(config)]
        self.process = StampedProcess(argv, root / "agent.err", cwd=ROOT)

    def events(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        out = []
        for at, line in self.process.lines:
            if at >= since and line.startswith("{"):
                out.append((at, json.loads(line)))
        return out

    async def seen(self, since: float, kinds: set[str], about: str) -> float:
        """When an event of one of `kinds` mentioning `about` came out after `since`."""

        def found() -> float | None:
            hits = [at for at, e in self.events(since) if e["kind"] in kinds and about in json.dumps(e)]
            return hits[0] if hits else None

        await self.process.until(lambda: found() is not None, EVENT_S, f"ours: {sorted(kinds)} {about}")
        at = found()
        assert at is not None
        return at - since


class Nfd:
    """nfd-topology-updater, publishing nothing; its zones records, stamped."""

    def __init__(self, root: Path, kubelet_root: Path, kubeconfig: Path, sleep_interval: float) -> None:
        uri = kubelet_config(root / "kubelet-config.yaml")
        argv = nfd_argv(kubelet_root, kubeconfig, uri, sleep_interval)
        env = {"PATH": "/usr/bin:/bin", "NODE_NAME": NODE, "KUBERNETES_NAMESPACE": "default"}
        self.process = StampedProcess(argv, root / "nfd.out", stream="stderr", env=env)
        self.sleep_interval = sleep_interval
        self.error: str | None = None

    def outputs(self) -> list[NfdOutput]:
        return outputs(self.process.lines)

    def before(self, t: float) -> dict[str, dict[str, str]] | None:
        earlier = [o for o in self.outputs() if o.at < t]
        return earlier[-1].zones if earlier else None

    async def next_output(self, since: float, *, changed: bool, timeout: float) -> tuple[float, bool] | None:
        """The first record after `since` (that differs from the one before, if `changed`):
        its delay and whether it differs; None if none came within `timeout` s."""
        old = self.before(since)

        def found() -> NfdOutput | None:
            after = [o for o in self.outputs() if o.at >= since and (not changed or o.zones != old)]
            return after[0] if after else None

        try:
            await self.process.until(lambda: found() is not None, timeout, "nfd: a zones record")
        except AssertionError:
            return None
        hit = found()
        assert hit is not None
        return hit.at - since, hit.zones != old

    def fail(self, err: BaseException) -> None:
        errors = scan_errors(self.process.lines)
        self.error = f"{err}" + (f"; its errors: {errors[-3:]}" if errors else "")


# --- one kubelet, both tools ---


async def _api_pod(client: Any, n: int) -> None:
    """The pod in the API server before the kubelet admits it, as a scheduler would have it."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-{n}", "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "image": "registry.invalid/bench", "resources": {"limits": {GPU: "1"}}}
            ],
        },
    }
    try:
        await client.create(codecs.from_dict(pod))
    except ApiError as err:
        if err.status.code != 409:  # already there from the other kubelet's round
            raise


async def _start(kubelet: Any, ours: Ours, nfd: Nfd) -> None:
    """The kubelet, then our agent until its first event, then nfd until it watches."""
    await kubelet.start()  # inside: a kubelet that half started is stopped too
    await ours.process.start()
    await ours.process.until(
        lambda: any(e["kind"] == "watcher.started" for _, e in ours.events(0)), START_S, "watcher.started"
    )
    await nfd.process.start()
    # Its fsnotify watch is in place before it logs this; what it sees meanwhile waits for it.
    await nfd.process.until(
        lambda: any("watching all namespaces" in line for _, line in nfd.process.lines),
        START_S,
        "nfd's start",
    )


async def _idle(
    kubelet: Any, ours: Ours, nfd: Nfd, figures: dict[str, dict[str, Any]], seconds: float
) -> None:
    """Each tool still running over an idle window: its CPU, RSS and calls to the kubelet."""
    procs = {"ours": ours.process} | ({} if nfd.process.exited() else {"nfd": nfd.process})
    cpu0 = {t: cpu_seconds(p.pid) for t, p in procs.items()}
    calls0, w0 = await kubelet.calls(), time.monotonic()
    await asyncio.sleep(seconds)
    calls1, w1 = await kubelet.calls(), time.monotonic()
    for tool, p in procs.items():
        figures[tool]["idle_cpu_pct"] = 100 * (cpu_seconds(p.pid) - cpu0[tool]) / (w1 - w0)
        figures[tool]["rss_mib"] = rss_mib(p.pid)
        if calls0 is not None and calls1 is not None:
            figures[tool]["rpcs_per_min"] = {
                m: 60 * (n - calls0[tool].get(m, 0)) / (w1 - w0) for m, n in calls1[tool].items()
            }
            figures[tool]["calls"] = calls1[tool]  # the whole round's, start-up included


async def _round(
    kubelet: Any, root: Path, client: Any, kubeconfig: Path, plan: argparse.Namespace
) -> dict[str, Any]:
    ours = Ours(root, kubelet.root)
    nfd = Nfd(root, kubelet.root, kubeconfig, plan.sleep_interval)
    figures: dict[str, dict[str, Any]] = {
        t: {"warmup": [], "added_s": [], "removed_s": [], "unhealthy_s": [], "unhealthy_shown": []}
        for t in ("ours", "nfd")
    }
    nfd_wait = plan.sleep_interval + 15.0  # a scan that missed the change: the timer's next one
    try:
        await _start(kubelet, ours, nfd)

        async def step(change: Callable[[], Any], kinds: set[str], about: str, key: str) -> None:
            await asyncio.sleep(SPACING_S)
            t0 = time.monotonic()
            await change()
            figures["ours"][key].append(await ours.seen(t0, kinds, about))
            if key == "unhealthy_s":
                figures["ours"]["unhealthy_shown"].append(True)
            if nfd.error is not None:
                return
            shown = key != "unhealthy_s"  # an allocation must show; a health change: any rescan
            try:
                got = await nfd.next_output(t0, changed=shown, timeout=nfd_wait if shown else 10.0)
            except RuntimeError as err:  # it exited
                nfd.fail(err)
                return
            figures["nfd"][key].append(None if got is None else got[0])
            if key == "unhealthy_s":
                figures["nfd"]["unhealthy_shown"].append(bool(got and got[1]))

        # The warm-up pod stays, so that the idle window has an allocated GPU on the node.
        await _api_pod(client, 0)
        await step(partial(kubelet.admit, 0), {"allocation.added"}, "gpu-0", "warmup")
        for i in range(1, plan.changes + 1):
            await _api_pod(client, i)
            held: list[str] = []

            async def admit(i: int = i, held: list[str] = held) -> None:
                held.append(await kubelet.admit(i))

            await step(admit, {"allocation.added"}, f"gpu-{i}", "added_s")
            device = held[0]
            unhealthy = partial(kubelet.health, device, False)
            await step(unhealthy, {"device.removed", "device.unhealthy"}, device, "unhealthy_s")
            t0 = time.monotonic()
            await kubelet.health(device, True)
            await ours.seen(t0, {"device.added", "device.healthy"}, device)
            await step(partial(kubelet.remove, i), {"allocation.removed"}, f"gpu-{i}", "removed_s")
        await asyncio.sleep(2.0)  # what the last change started settles
        await _idle(kubelet, ours, nfd, figures, plan.idle)
        if nfd.process.exited() and nfd.error is None:
            nfd.fail(RuntimeError("nfd-topology-updater exited"))
    finally:
        await nfd.process.stop()
        await ours.process.stop()
        await kubelet.stop()
    for kept in figures.values():
        kept.pop("warmup", None)
    figures["nfd"]["error"] = nfd.error
    figures["nfd"]["outputs"] = len(nfd.outputs())
    return figures


async def run(plan: argparse.Namespace) -> dict[str, Any]:
    from lightkube import AsyncClient, KubeConfig, codecs

    from testkit.kube_testcluster import start_kube_testcluster

    missing = [n for n in NEEDED if not (PEERS_BIN / n).is_file()]
    if missing:
        return {"error": f"not built: {', '.join(missing)} (run `make peers`)"}
    result: dict[str, Any] = {"sleep_interval_s": plan.sleep_interval, "idle_s": plan.idle, "kubelets": {}}
    with tempfile.TemporaryDirectory(prefix="prw-peer-", dir="/tmp") as tmp:
        root = Path(tmp)
        with start_kube_testcluster(root / "cluster") as cluster:
            client = AsyncClient(KubeConfig.from_file(cluster.admin_kubeconfig))
            await client.create(
                codecs.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            )
            sa = {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": NAMESPACE},
            }
            await client.create(codecs.from_dict(sa))  # no controller-manager makes it
            for name in plan.kubelets.split(","):
                where = root / name
                where.mkdir()
                kubelet = Lite(where / "kubelet") if name == "lite" else FakeChild(where / "kubelet")
                label = "kubelet-lite" if name == "lite" else "fake"
                try:
                    figures = await _round(kubelet, where, client, cluster.admin_kubeconfig, plan)
                except (RuntimeError, AssertionError, OSError) as err:  # this kubelet's round failed
                    figures = {"error": f"{type(err).__name__}: {err}"[:600]}
                result["kubelets"][label] = figures
            await client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=3)
    parser.add_argument("--idle", type=float, default=120.0)
    parser.add_argument("--sleep-interval", type=float, default=60.0)
    parser.add_argument("--kubelets", default="lite,fake")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if NFD.is_file():
        version = subprocess.run([str(NFD), "-version"], capture_output=True, text=True, check=False)
        result["nfd_version"] = version.stdout.strip()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
