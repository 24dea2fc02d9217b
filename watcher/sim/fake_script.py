"""Scenario files for `fake-kubelet --script FILE`: drive the simulated kubelet without Python.

One step per line, `AT ACTION ARGS...`, AT in seconds from the start (`2`, `2.5s`), steps in order
of time; `#` starts a comment:

    2s   fail      nvidia.com/gpu GPU-3          # the device turns unhealthy (leaves allocatable)
    4s   heal      nvidia.com/gpu GPU-3
    5s   add       nvidia.com/gpu GPU-new 1      # hot-plug, on NUMA node 1 (optional)
    6s   remove    nvidia.com/gpu GPU-new        # unplug
    7s   allocate  ml/job-1/main nvidia.com/gpu=GPU-4,GPU-5
    8s   free      ml/job-1
    8s   dra-health gpu.example.com/node-a/gpu-8 Unhealthy critical XID 79 reported by NVML
    8s   phase     ml/job-1 Failed                # a Pods API status change (no device moves)
    8s   reject    ml/job-2 nvidia.com/gpu 2      # refused at admission, the device manager's words
    9s   restart   downtime=0.5 warmup           # socket replaced; plugins re-register one by one
    12s  end                                     # stop serving (else it serves until Ctrl-C)

Parsing is pure and strict: a bad line is refused with its number and what was expected, before
anything runs, so a typo never plays half a scenario.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from watcher.sim.fake_dra import HEALTH_STATES
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakePod
from watcher.sim.fake_plugins import Warmup
from watcher.sim.fake_pod_objects import rejected

__all__ = [
    "Step",
    "ScriptError",
    "parse_script",
    "load_script",
    "play",
    "ACTIONS",
    "MAX_STEPS",
    "MAX_BYTES",
    "MAX_NUMA",
]

ACTIONS = {
    "fail": "RESOURCE DEVICE",
    "heal": "RESOURCE DEVICE",
    "add": "RESOURCE DEVICE [NUMA]",
    "remove": "RESOURCE DEVICE",
    "allocate": "NAMESPACE/POD/CONTAINER RESOURCE=ID[,ID...]",
    "free": "NAMESPACE/POD",
    "dra-health": "DRIVER/POOL/DEVICE Healthy|Unhealthy|Unknown [MESSAGE...]",
    "phase": "NAMESPACE/POD PHASE",
    "reject": "NAMESPACE/POD RESOURCE [COUNT]",
    "restart": "[downtime=SECONDS] [warmup]",
    "end": "",
}
# ASCII digits only: `\d` also takes digits such as `²` that int() and float() then refuse.
_AT = re.compile(r"([0-9]+(?:\.[0-9]+)?)s?")
_NUMA = re.compile(r"[0-9]+")
# The wire's NUMA node id is an int64: a larger one would make every answer fail to encode.
MAX_NUMA = 2**63 - 1
# Most steps in one file: a scenario is read whole before it runs.
MAX_STEPS = 10_000
# Most bytes read from one file: ten thousand steps fit many times over, and a huge file is refused
# after reading this much, not held whole in memory first.
MAX_BYTES = 4 * 1024 * 1024


class ScriptError(ValueError):
    """A scenario file that cannot be played; the message names the line."""


@dataclass(frozen=True)
class Step:
    at: float
    action: str
    args: tuple[str, ...]
    line: int


def parse_script(text: str) -> list[Step]:
    steps: list[Step] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"line {number}"
        at = _AT.fullmatch(words[0])
        if at is None:
            raise ScriptError(f"{where}: {words[0][:40]!r} is not a time; expected seconds such as 2 or 2.5s")
        if len(words) < 2 or words[1] not in ACTIONS:
            raise ScriptError(f"{where}: expected an action, one of {', '.join(ACTIONS)}")
        seconds = float(at.group(1))
        if not math.isfinite(seconds):
            raise ScriptError(f"{where}: {words[0][:40]!r} is too large a time")
        step = Step(seconds, words[1], tuple(words[2:]), number)
        _check(step, where)
        if steps and step.at < steps[-1].at:
            raise ScriptError(
                f"{where}: at {step.at:g} s comes before the step above it; keep steps in time order"
            )
        steps.append(step)
        if len(steps) > MAX_STEPS:
            raise ScriptError(f"{where}: more than {MAX_STEPS} steps")
    if not steps:
        raise ScriptError("no steps: one per line, `AT ACTION ARGS`, e.g. `2s fail nvidia.com/gpu GPU-3`")
    return steps


def _check(step: Step, where: str) -> None:
    usage = f"{where}: usage: AT {step.action} {ACTIONS[step.action]}".rstrip()
    n = len(step.args)
    if step.action in ("fail", "heal", "remove") and n != 2:
        raise ScriptError(usage)
    if step.action == "add" and (n not in (2, 3) or (n == 3 and not _NUMA.fullmatch(step.args[2]))):
        raise ScriptError(usage)
    if step.action == "add" and n == 3 and _numa(step.args[2]) is None:
        raise ScriptError(f"{where}: NUMA node {step.args[2][:40]!r} is larger than {MAX_NUMA} (an int64)")
    if step.action == "allocate" and (n != 2 or step.args[0].count("/") != 2 or "=" not in step.args[1]):
        raise ScriptError(usage)
    if step.action == "free" and (n != 1 or step.args[0].count("/") != 1):
        raise ScriptError(usage)
    if step.action == "dra-health" and (
        n < 2 or step.args[0].count("/") != 2 or step.args[1] not in HEALTH_STATES
    ):
        raise ScriptError(usage)
    if step.action == "phase" and (n != 2 or step.args[0].count("/") != 1):
        raise ScriptError(usage)
    if step.action == "reject" and not _reject_ok(step.args):
        raise ScriptError(usage)
    if step.action == "restart":
        for arg in step.args:
            if arg == "warmup":
                continue
            key, _, value = arg.partition("=")
            if key != "downtime" or not (m := _AT.fullmatch(value)) or not math.isfinite(float(m.group(1))):
                raise ScriptError(usage)
    if step.action == "end" and n:
        raise ScriptError(usage)


def _numa(digits: str) -> int | None:
    """The NUMA node id `digits` spell, None above `MAX_NUMA`. Leading zeros are stripped first:
    int() refuses strings over 4,300 digits, and they cannot be an int64 anyway."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MAX_NUMA)) or int(significant) > MAX_NUMA:
        return None
    return int(significant)


def load_script(path: Path) -> list[Step]:
    """The steps of the file at `path`, read as UTF-8, refused unread beyond `MAX_BYTES`."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ScriptError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB; a scenario is a short file")
        text = raw.decode()
    except (OSError, UnicodeDecodeError) as err:
        raise ScriptError(f"cannot read {path}: {err}") from err
    return parse_script(text)


async def play(
    kubelet: FakeKubelet,
    steps: Sequence[Step],
    *,
    say: Callable[[str], None] = lambda _: None,
    clock: Callable[[], float] | None = None,
) -> None:
    """Play `steps` against a running `kubelet`, each at its time from now; returns after the last
    (an `end` step returns at once). A step that names a device the node does not have says so
    and goes on: the scenario is the user's, the node may differ."""
    loop = asyncio.get_running_loop()
    now = clock or loop.time
    start = now()
    for step in steps:
        wait = start + step.at - now()
        if wait > 0:
            await asyncio.sleep(wait)
        say(f"{step.at:g}s {step.action} {' '.join(step.args)}".rstrip())
        if step.action == "end":
            return
        try:
            await (_reject if step.action == "reject" else _do)(kubelet, step)
        except KeyError as err:
            say(f"  line {step.line}: no such {err.args[0]} on this node; step skipped")


def _reject_ok(args: Sequence[str]) -> bool:
    """`reject NAMESPACE/POD RESOURCE [COUNT]`: a pod name, a resource, a count of at least one."""
    count_ok = len(args) == 2 or (
        len(args) == 3 and _NUMA.fullmatch(args[2]) is not None and int(args[2]) > 0
    )
    return len(args) in (2, 3) and args[0].count("/") == 1 and count_ok


async def _reject(kubelet: FakeKubelet, step: Step) -> None:
    namespace, pod = step.args[0].split("/")
    count = int(step.args[2]) if len(step.args) == 3 else 1
    kubelet.add_pod(rejected(kubelet.node, FakePod(namespace, pod), step.args[1], count))


async def _do(kubelet: FakeKubelet, step: Step) -> None:
    a = step.args
    if step.action in ("fail", "heal"):
        if (a[0], a[1]) not in kubelet.node.devices:
            raise KeyError(f"device {a[0]} {a[1]}")
        kubelet.set_healthy(a[0], a[1], step.action == "heal")
    elif step.action == "add":
        numa = _numa(a[2]) if len(a) == 3 else None
        kubelet.add_device(a[0], a[1], () if numa is None else (numa,))
    elif step.action == "remove":
        if (a[0], a[1]) not in kubelet.node.devices:
            raise KeyError(f"device {a[0]} {a[1]}")
        kubelet.remove_device(a[0], a[1])
    elif step.action == "allocate":
        namespace, pod, container = a[0].split("/")
        resource, _, ids = a[1].partition("=")
        kubelet.allocate(namespace, pod, container, devices={resource: [i for i in ids.split(",") if i]})
    elif step.action == "free":
        namespace, pod = a[0].split("/")
        if (namespace, pod) not in kubelet.node.pods:
            raise KeyError(f"pod {a[0]}")
        kubelet.free(namespace, pod)
    elif step.action == "dra-health":
        driver, pool, device = a[0].split("/")
        kubelet.dra.set_health(driver, pool, device, a[1], " ".join(a[2:]))
    elif step.action == "phase":
        namespace, pod = a[0].split("/")
        if (namespace, pod) not in kubelet.node.pods:
            raise KeyError(f"pod {a[0]}")
        kubelet.update_pod(namespace, pod, phase=a[1])
    elif step.action == "restart":
        downtime = 0.0
        for arg in a:
            if arg.startswith("downtime="):
                match = _AT.fullmatch(arg.split("=", 1)[1])
                assert match is not None  # checked when parsed
                downtime = float(match.group(1))
        # As a real kubelet comes back (each device plugin re-registering within a second or two,
        # List filling in), or all at once.
        warm = "warmup" in a
        kubelet.plugins.warmup = Warmup(plugin_delay=(0.5, 2.0), pods_delay=(0.0, 0.5)) if warm else None
        await kubelet.restart(downtime)
