"""The agent's whole CPU share at steady state: a real `python -m watcher run` process with
default settings (the timer at its default interval, state-file triggers on, the default sink)
against the large node served by `python -m watcher fake-kubelet` in another process, its
/metrics scraped every 15 s by a real HTTP client (aiohttp, as Prometheus would).

The share is the agent process's utime + stime (/proc/PID/stat, every thread) over the window,
divided by the window's wall time. The window opens once /readyz answers 200 and the start-up
(the first full decode, watcher.started delivered) has settled, and lasts PRW_BENCH_STEADY_S
seconds (default 300; `make bench` uses the default).

    python -c 'import asyncio, bench.steady as s; print(asyncio.run(s.bench_steady(300)))'
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from testkit.ports import free_port
from testkit.processes import fake_kubelet_process
from testkit.waiting import wait_until
from watcher.settings import WatchSettings

__all__ = ["STEADY_ENV", "Steady", "bench_steady", "cpu_seconds", "steady_seconds"]

ROOT = Path(__file__).resolve().parent.parent
STEADY_ENV = "PRW_BENCH_STEADY_S"
SCRAPE_EVERY_S = 15.0
# After /readyz: the first full decode is done; let what it started (delivery of
# watcher.started, the first timer period's scheduling) finish before the window opens.
SETTLE_S = 5.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Steady:
    """The agent process's CPU over the window, and where it went."""

    cpu_s: float
    wall_s: float
    share: float  # of one core
    scrapes: int
    requeries: float
    clk_tck: int
    threads: dict[str, float]  # CPU seconds by thread (name and id), the busiest first
    # Baselines in the same window (bench/idle_floor.py): one gRPC channel held open, and
    # watchfiles' watch at the agent's step, each alone in a process: their share of one core.
    floors: dict[str, float] = field(default_factory=dict)


def steady_seconds(default: float = 300.0) -> float:
    """The window's length: PRW_BENCH_STEADY_S, else `default`."""
    value = os.environ.get(STEADY_ENV)
    return float(value) if value else default


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLK_TCK


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus' text format."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _config(root: Path, port: int, watch: Mapping[str, float] | None = None) -> Path:
    """Defaults everywhere, except where the files are, a free loopback port for /metrics and
    `watch` (the idle curve's steps)."""
    path = root / "config.toml"
    kubelet = root / "kubelet"
    table = "".join(f"{k} = {v!r}\n" for k, v in (watch or {}).items())
    path.write_text(
        f"""node = "bench-node"
state_dir = "{root / "state"}"
[kubelet]
socket = "{kubelet / "pod-resources" / "kubelet.sock"}"
root_dir = "{kubelet}"
[http]
listen = "127.0.0.1:{port}"
[watch]
{table}"""
    )
    return path


def _start(root: Path, *args: str) -> subprocess.Popen[bytes]:
    """`python -m watcher ARGS`, its output in files under `root` (read when it fails)."""
    name = args[0]
    with open(root / f"{name}.out", "wb") as out, open(root / f"{name}.err", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "watcher", *args], stdout=out, stderr=err, cwd=ROOT)


def _floor(root: Path, *args: str) -> subprocess.Popen[str]:
    """bench/idle_floor.py ARGS, once it said it is set up."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "idle_floor.py"), *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the baseline {args[0]} did not start")
    return proc


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of `pid`, by thread name and id ("python" is the event loop's thread
    and every other thread Python started)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name} {task.name}"] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


async def bench_steady(
    seconds: float,
    scrape_every: float = SCRAPE_EVERY_S,
    settle_s: float = SETTLE_S,
    watch: Mapping[str, float] | None = None,
) -> Steady:
    with tempfile.TemporaryDirectory(prefix="prw-b3s-", dir="/tmp") as tmp:
        root = Path(tmp)
        with fake_kubelet_process(root / "kubelet", node="large"):
            port = free_port()
            agent = _start(root, "run", "--config", str(_config(root, port, watch)))
            base = f"http://127.0.0.1:{port}"
            floors: dict[str, subprocess.Popen[str]] = {}
            try:
                async with aiohttp.ClientSession() as http:
                    await _until_ready(agent, http, base, root)
                    step_ms = str(round(1000 * (watch or {}).get("step", WatchSettings.step)))
                    floors |= {
                        "grpc": _floor(
                            root,
                            "grpc",
                            str(root / "kubelet" / "pod-resources" / "kubelet.sock"),
                            str(root / "kubelet" / "pods-api" / "pods-api.sock"),
                        ),
                        "watch": _floor(root, "watch", str(root / "kubelet"), step_ms),
                    }
                    await asyncio.sleep(settle_s)
                    steady = await _window(agent.pid, http, base, floors, seconds, scrape_every)
            finally:
                _stop(agent, floors)
    return steady


async def _until_ready(
    agent: subprocess.Popen[bytes], http: aiohttp.ClientSession, base: str, root: Path
) -> None:
    async def ready() -> bool:
        if agent.poll() is not None:
            raise RuntimeError(
                f"the agent exited ({agent.returncode}): " + (root / "run.err").read_text()[-2000:]
            )
        try:
            async with http.get(f"{base}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, 60, interval=0.2, what="the agent's /readyz")


async def _window(
    pid: int,
    http: aiohttp.ClientSession,
    base: str,
    floors: Mapping[str, subprocess.Popen[str]],
    seconds: float,
    scrape_every: float,
) -> Steady:
    """The agent's CPU (and the floors') over `seconds`, scraping /metrics every `scrape_every`."""
    floor0 = {k: cpu_seconds(p.pid) for k, p in floors.items()}
    scrapes: list[str] = []
    threads0 = thread_cpu(pid)
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    k = 0
    while (at := t0 + k * scrape_every) < t0 + seconds:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 200, r.status
            scrapes.append(await r.text())
        k += 1
    await asyncio.sleep(max(0.0, t0 + seconds - time.monotonic()))
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    floor1 = {k: cpu_seconds(p.pid) for k, p in floors.items()}
    threads1 = thread_cpu(pid)
    async with http.get(f"{base}/metrics") as r:
        last = await r.text()
    requeries = "pod_resources_watcher_requeries_total"
    cpu, wall = cpu1 - cpu0, t1 - t0
    return Steady(
        cpu_s=cpu,
        wall_s=wall,
        share=cpu / wall,
        scrapes=len(scrapes),
        requeries=_metric(last, requeries) - _metric(scrapes[0], requeries),
        clk_tck=_CLK_TCK,
        floors={k: (floor1[k] - floor0[k]) / wall for k in floor0},
        threads={
            name: cpu - threads0.get(name, 0.0)
            for name, cpu in sorted(threads1.items(), key=lambda kv: -(kv[1] - threads0.get(kv[0], 0.0)))
        },
    )


def _stop(agent: subprocess.Popen[bytes], floors: Mapping[str, subprocess.Popen[str]]) -> None:
    for proc in floors.values():
        proc.kill()
        proc.communicate()  # reaps it and closes its pipe
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(20)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
