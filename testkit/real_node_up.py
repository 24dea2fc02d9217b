"""`python -m testkit.real_node_up start|stop` (`make real-node`, `make real-node-stop`): a node to
try the agent on, from upstream code, in one command; docs/real-node.md says what runs and how.

`start` brings up, under one directory (default /tmp/prw-real-node): kube-testcluster (etcd and
upstream's kube-apiserver), kube-controllers (upstream's scheduler, resourceclaim and Job
controllers), upstream's kubelet on fake-cri registered as a Node (testkit.real_node), a device
plugin with four GPUs on two NUMA nodes, upstream's DRA test driver with health
(testkit.real_dra), and the agent watching the node (an audit log, and the kubernetes sink as its
own ServiceAccount under the shipped RBAC and admission policy). It prints how to reach them and
`real-node ready`, then waits for SIGINT or SIGTERM, or plays testkit/real_node_story.py
(`--play`). On the way out it stops everything it started and removes the directory (`--keep`:
the directory and its logs stay).

`stop` ends a `start` through the pid file in its directory, then makes sure nothing is left: no
process of the peers' binaries or of `start` naming the directory, and no directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from testkit.peers import PEERS_BIN
from testkit.real_node_stop import KEEP_FILE, PID_FILE, READY_FILE, is_start, leftovers, read_pid, stop_node
from testkit.tools import find, missing_message

__all__ = ["READY_FILE", "READY_LINE", "main"]

DEFAULT_DIR = Path("/tmp/prw-real-node")
READY_LINE = "real-node ready"
PEERS = ("kube-testcluster", "kube-controllers", "kubelet", "fake-cri", "device-plugin", "dra-test-driver")
DRA_TAG = "gpu"  # driver gpu.test.example.com, DeviceClass gpu
DRA_DEVICES = ("gpu-0", "gpu-1")
# The deepest socket under the directory: the DRA driver's control socket. Unix socket paths
# hold at most 107 bytes.
DEEPEST_SOCKET = f"node/var-lib/kubelet/plugins/{DRA_TAG}.test.example.com/control.sock"
# The agent's token is bound to its Pod and lives an hour (testkit.kube_testcluster); renewed
# well before that, into the file its kubeconfig names (read per request).
TOKEN_RENEW_S = 20 * 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.real_node_up", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="bring the node up (as root); Ctrl-C or `stop` ends it")
    start.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"where it all lives (default {DEFAULT_DIR})"
    )
    start.add_argument("--node", default="real-node", help="the Node's name (default real-node)")
    start.add_argument("--http", default="127.0.0.1:9108", help="the agent's HTTP address (port 0: any free)")
    start.add_argument("--play", action="store_true", help="play the scripted story, then stop")
    start.add_argument("--stay", action="store_true", help="with --play: keep running after the story")
    start.add_argument("--keep", action="store_true", help="leave the directory (logs, state) behind")
    stop = commands.add_parser("stop", help="stop a running `start` and remove what it left")
    stop.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"its directory (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    directory = args.dir.absolute()
    if args.command == "stop":
        return stop_node(directory)
    problem = _preflight(directory)
    if problem is None:
        problem = _claim(directory, keep=args.keep)
    if problem is not None:
        print(f"real-node: {problem}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(_serve(args, directory))
    finally:
        if args.keep:
            (directory / PID_FILE).unlink(missing_ok=True)
        else:
            shutil.rmtree(directory, ignore_errors=True)


def _preflight(directory: Path) -> str | None:
    """What stands in the way of a start, in one sentence with its fix; None: nothing."""
    if os.geteuid() != 0:
        return (
            "needs root: the kubelet runs in a private mount namespace of its own (unshare --mount), "
            "where it binds its directories over /var/lib, /var/log and six /proc/sys files; "
            "run `sudo make real-node` (nothing on the host is changed: docs/real-node.md)"
        )
    missing = [name for name in PEERS if not os.access(PEERS_BIN / name, os.X_OK)]
    if missing:
        return f"the Go test peers {', '.join(missing)} are not built: run `make peers` (needs Go 1.26+)"
    if find("kubectl") is None:
        return missing_message("kubectl")
    if shutil.which("unshare") is None:
        return "unshare(1) is missing (the kubelet needs it): install util-linux"
    if len(str(directory / DEEPEST_SOCKET).encode()) > 107:
        return f"--dir {directory} is too long for the unix sockets under it: take a short one under /tmp"
    return None


def _claim(directory: Path, *, keep: bool) -> str | None:
    """The directory made ours, with the pid file; a problem if another start holds it or it is
    someone else's (never removed unless our pid file says it was ours)."""
    pid_file = directory / PID_FILE
    if pid_file.exists():
        pid = read_pid(pid_file)
        if pid is not None and is_start(pid):
            return f"already running under {directory} (pid {pid}): stop it with `make real-node-stop`"
        if leftovers(directory):
            return f"a crashed start's peers still run under {directory}: `make real-node-stop` first"
        shutil.rmtree(directory)  # a crashed start's: ours, and nothing runs in it any more
    elif (directory / KEEP_FILE).exists():
        return (
            f"{directory} holds what a --keep run left: remove it (rm -rf {directory}) or give another --dir"
        )
    elif directory.exists() and any(directory.iterdir()):
        return f"{directory} exists and is not a real-node directory: give another --dir"
    directory.mkdir(parents=True, exist_ok=True)
    if keep:
        (directory / KEEP_FILE).touch()
    pid_file.write_text(f"{os.getpid()}\n")
    return None


async def _serve(args: argparse.Namespace, directory: Path) -> int:
    # Here, not at the top: `stop` needs none of it, and it loads the agent.
    from testkit.real_node_story import play
    from watcher.ops.logs import configure_logging
    from watcher.supervision import StoppedError, stop_on_signals, unless_stopped

    out = sys.stdout
    configure_logging("warning", "console")
    stopping = asyncio.Event()
    with stop_on_signals(stopping):
        try:
            async with contextlib.AsyncExitStack() as stack:
                started = time.monotonic()
                stage, ready = await unless_stopped(stopping, _bring_up(stack, args, directory, out))
                ready["seconds"] = round(time.monotonic() - started, 1)
                (directory / READY_FILE).write_text(json.dumps(ready, indent=1) + "\n")
                _banner(ready, directory, out)
                if args.play:
                    await unless_stopped(stopping, play(stage, out))
                if not args.play or args.stay:
                    await stopping.wait()
                print(
                    "\nstopping: the agent, the node's plugins, the kubelet, the controllers, the API server",
                    file=out,
                    flush=True,
                )
        except StoppedError:
            print("\nstopped before it was up", file=out, flush=True)
        except Exception as err:  # a peer that did not start, a story step that never came: say which
            if not stopping.is_set():
                print(f"real-node: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
                return 1
            # Ctrl-C in a terminal reaches every peer too (one process group): they stop on their
            # own, and the teardown's calls to them may find them gone. Nothing is left either way.
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            print(f"  (the peers had stopped on their own first: {first[:200]})", file=out, flush=True)
    print(
        "stopped; nothing left running" + ("" if args.keep else f", {directory} removed"),
        file=out,
        flush=True,
    )
    return 0


async def _bring_up(
    stack: contextlib.AsyncExitStack, args: argparse.Namespace, directory: Path, out: TextIO
) -> tuple[Any, dict[str, Any]]:
    """Everything up, each part entered into `stack` (closed in reverse on the way out); the
    story's stage and what `ready.json` says."""
    import dataclasses

    from testkit.agent import agent_against, make_settings
    from testkit.kube_controllers import start_kube_controllers
    from testkit.kube_testcluster import start_kube_testcluster
    from testkit.real_dra import add_dra_driver
    from testkit.real_node import RealNode
    from testkit.real_node_story import GPU, GPUS, Narrator, Stage
    from watcher.settings import HttpSettings
    from watcher.sinks.kubernetes import KubernetesSinkSettings

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say(f"real-node: starting under {directory} (logs there)")
    say("  the API server: etcd and upstream's kube-apiserver (kube-testcluster)")
    # Blocking, a few seconds: nothing else runs yet on this loop.
    cluster = stack.enter_context(start_kube_testcluster(directory / "cluster"))
    say("  the scheduler, resourceclaim and Job controllers (kube-controllers)")
    stack.enter_context(start_kube_controllers(cluster, directory / "controllers"))
    say(f"  the kubelet on fake-cri, registering Node {args.node}")
    node = await stack.enter_async_context(RealNode(cluster, directory / "node", args.node))
    # No service-account controller runs: a person's pods in `default` need what it would make.
    await node.namespace("default")
    say(f"  a device plugin: {GPU} {', '.join(f'{d} (NUMA {n[0]})' for d, n in GPUS.items())}")
    plugin = await node.add_plugin(GPU, GPUS)
    say(f"  the DRA test driver: {DRA_TAG}.test.example.com, devices {', '.join(DRA_DEVICES)}, health on")
    dra = await add_dra_driver(node, DRA_TAG, DRA_DEVICES, health=True)
    say("  the agent's ServiceAccount, the shipped RBAC and admission policy, its Pod on the node")
    kubeconfig = await _agent_identity(stack, cluster, node.name, directory / "agent")
    say("  the agent")
    base = make_settings(directory / "agent", kubelet_root=node.root, node=node.name, interval=30.0)
    sink = KubernetesSinkSettings(name="kubernetes", kubeconfig=kubeconfig)
    settings = dataclasses.replace(base, http=HttpSettings(listen=args.http), sinks=(*base.sinks, sink))
    run = await stack.enter_async_context(agent_against(settings))
    Narrator(run, out).attach()
    await run.pods_watching(timeout=60)
    await run.released()
    # Bound by now (it starts before the first cycle); read through the agent, which sets it.
    await run.recorder.until(lambda: run.agent.http is not None and run.agent.http.bound_port is not None)
    http = run.agent.http
    assert http is not None
    assert http.bound_port is not None
    host = args.http.rsplit(":", 1)[0].strip("[]")
    ready = {
        "pid": os.getpid(),
        "node": node.name,
        "server": cluster.server,
        "kubeconfig": str(cluster.admin_kubeconfig),
        "kubectl": find("kubectl"),
        "agent": f"http://{host}:{http.bound_port}",
        "audit_log": str(settings.sinks[0].path),  # type: ignore[attr-defined]  # make_settings' file sink
        "kubelet_root": str(node.root),
    }
    return Stage(node, plugin, dra, run), ready


async def _agent_identity(stack: contextlib.AsyncExitStack, cluster: Any, node: str, directory: Path) -> Path:
    """The agent's kubeconfig: its ServiceAccount's token bound to its Pod on `node`, as the
    chart's projected token is, in a file renewed while it runs."""
    from testkit.kube_reporting import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, apply_reporting, pod_manifest

    directory.mkdir(parents=True, exist_ok=True)
    pod = f"pod-resources-watcher-{node}"

    def install() -> None:
        # Not install_reporting: its probe Nodes, Pods and namespaces would stay in a cluster a
        # person looks at (no controller removes them).
        apply_reporting(cluster)
        cluster.apply(pod_manifest(AGENT_NAMESPACE, pod, node, AGENT_SERVICE_ACCOUNT))

    token = directory / "token"

    def renew() -> None:
        fresh = directory / "token.new"
        fresh.write_text(cluster.service_account_token(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, pod))
        fresh.chmod(0o600)
        fresh.replace(token)

    await asyncio.to_thread(install)
    await asyncio.to_thread(renew)

    async def renewing() -> None:
        while True:
            await asyncio.sleep(TOKEN_RENEW_S)  # a clock, not an event: the token's age
            await asyncio.to_thread(renew)

    task = asyncio.create_task(renewing(), name="agent-token-renewal")

    async def cancel() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    stack.push_async_callback(cancel)
    kubeconfig = directory / "kubeconfig"
    user = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "real-node",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"tokenFile": str(token)}}],
        "contexts": [{"name": "agent", "context": {"cluster": "real-node", "user": user}}],
        "current-context": "agent",
    }
    kubeconfig.write_text(json.dumps(config, indent=1))  # JSON is YAML: lightkube and kubectl read it
    kubeconfig.chmod(0o600)
    return kubeconfig


def _banner(ready: dict[str, Any], directory: Path, out: TextIO) -> None:
    kubectl = ready["kubectl"]
    on_path = shutil.which("kubectl") == kubectl
    lines = [
        "",
        f"Up in {ready['seconds']} s. Node {ready['node']}: upstream's kubelet v1.37 on a fake CRI, Ready.",
        "",
        "kubectl, as the cluster's admin:",
        f"  export KUBECONFIG={ready['kubeconfig']}" + ("" if on_path else f"   # kubectl: {kubectl}"),
        "  kubectl get nodes",
        "  kubectl get pods -A -o wide",
        "  kubectl get resourceslices",
        f"  kubectl describe node {ready['node']}",
        "",
        f"The agent: {ready['agent']}/readyz  {ready['agent']}/metrics",
        f"  its audit log: {ready['audit_log']}",
        "  its Events and Node conditions: the kubernetes sink, as the ServiceAccount",
        "  pod-resources-watcher/pod-resources-watcher (the shipped RBAC and admission policy)",
        f"  the kubelet's root dir, as the agent reads it: {ready['kubelet_root']}",
        "",
        "Stop: Ctrl-C here, or `make real-node-stop`",
        f"  (python -m testkit.real_node_up stop --dir {directory}).",
        "The agent's events follow as they arrive.",
        READY_LINE,
    ]
    print("\n".join(lines), file=out, flush=True)


if __name__ == "__main__":
    sys.exit(main())
