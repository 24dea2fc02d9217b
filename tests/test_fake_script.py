"""`fake-kubelet --script FILE`: scenario files parse strictly and drive the simulated kubelet, and the
agent watching it sees exactly the story."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher.sim.fake_script import MAX_BYTES, ScriptError, load_script, parse_script, play

GPU = "nvidia.com/gpu"


def test_a_scenario_parses_into_timed_steps() -> None:
    steps = parse_script(
        """
        # a GPU fails under a job, heals, then the kubelet restarts
        0.5   fail     nvidia.com/gpu GPU-3
        2s    heal     nvidia.com/gpu GPU-3   # back
        3     add      nvidia.com/gpu GPU-9 1
        3     allocate ml/job/main nvidia.com/gpu=GPU-9
        4     free     ml/job
        5s    restart  downtime=0.5 warmup
        6     end
        """
    )
    assert [(s.at, s.action, s.args) for s in steps] == [
        (0.5, "fail", (GPU, "GPU-3")),
        (2.0, "heal", (GPU, "GPU-3")),
        (3.0, "add", (GPU, "GPU-9", "1")),
        (3.0, "allocate", ("ml/job/main", f"{GPU}=GPU-9")),
        (4.0, "free", ("ml/job",)),
        (5.0, "restart", ("downtime=0.5", "warmup")),
        (6.0, "end", ()),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("soon fail a b", r"line 1: 'soon' is not a time"),
        ("1 explode a b", r"line 1: expected an action, one of fail, heal"),
        ("1 fail nvidia.com/gpu", r"line 1: usage: AT fail RESOURCE DEVICE"),
        ("1 add r d numa0", r"line 1: usage: AT add RESOURCE DEVICE \[NUMA\]"),
        ("1 allocate ml/job r=d", r"usage: AT allocate NAMESPACE/POD/CONTAINER"),
        ("1 restart downtime=x", r"usage: AT restart \[downtime=SECONDS\] \[warmup\]"),
        ("2 end\n\n1 fail r d", r"line 3: at 1 s comes before the step above it"),
        ("# nothing\n", r"no steps"),
        # Digits that str.isdigit() takes and int() refuses, and NUMA ids the wire's int64 cannot carry.
        ("1 add r d ²", r"line 1: usage: AT add RESOURCE DEVICE \[NUMA\]"),
        ("1 add r d ٣", r"line 1: usage: AT add RESOURCE DEVICE \[NUMA\]"),
        ("1 add r d 9223372036854775808", r"line 1: NUMA node '9223372036854775808' is larger than"),
        ("1 add r d " + "9" * 5000, r"line 1: NUMA node '9{40}' is larger than 9223372036854775807"),
        ("x" * 5000 + " end", r"line 1: 'x{40}' is not a time"),  # quoted, not echoed whole
        ("1" + "0" * 400 + " end", r"line 1: '10+' is too large a time"),
        ("1 restart downtime=1" + "0" * 400, r"usage: AT restart"),
    ],
)
def test_a_bad_line_is_refused_with_its_number_before_anything_runs(text: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(text)


def test_the_largest_int64_numa_node_and_leading_zeros_are_taken() -> None:
    steps = parse_script("1 add r d 9223372036854775807\n2 add r e " + "0" * 5000 + "1")
    assert [s.args[2][-3:] for s in steps] == ["807", "001"]


def test_a_huge_file_is_refused_after_reading_a_bounded_prefix(tmp_path: Path) -> None:
    """Not read whole into memory first (200 MB once took 680 MB of RSS): refused at MAX_BYTES."""
    script = tmp_path / "huge.txt"
    with script.open("wb") as f:
        f.truncate(2 * MAX_BYTES)  # sparse: no disk, and twice what is ever read
    with pytest.raises(ScriptError, match=r"larger than 4 MiB"):
        load_script(script)
    script.write_text("# fine\n" * ((MAX_BYTES - 100) // 7) + "1 end\n")
    assert [s.action for s in load_script(script)] == ["end"]


async def test_the_agent_sees_exactly_the_scripted_story(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet()
    gpu = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    steps = parse_script(
        f"""
        0    fail     {GPU} {gpu}
        1    heal     {GPU} {gpu}
        2    restart  downtime=0.2 warmup
        """
    )
    async with running_agent(make_settings(short_tmp), fake) as run:
        await run.recorder.until(lambda: "watcher.started" in run.recorder.kinds())
        mark = len(run.recorder.events)
        said: list[str] = []
        await play(fake, steps, say=said.append)
        await run.settled()
        kinds = [k for k in run.recorder.kinds(mark) if k != "capacity.changed"]
    assert said[0] == f"0s fail {GPU} {gpu}"
    # The failure and its healing, then the restart: its warm-up reported as nothing but itself.
    assert kinds == ["device.removed", "device.added", "kubelet.restarted"]


async def test_a_step_for_a_device_the_node_lacks_is_said_and_skipped(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet()
    said: list[str] = []
    await play(fake, parse_script(f"0 fail {GPU} GPU-nope\n0 free ml/nope"), say=said.append)
    assert said[1] == f"  line 1: no such device {GPU} GPU-nope on this node; step skipped"
    assert said[3] == "  line 2: no such pod ml/nope on this node; step skipped"


async def _cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "watcher", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


async def test_the_command_plays_a_file_and_ends_with_it(short_tmp: Path, tmp_path: Path) -> None:
    script = tmp_path / "story.txt"
    script.write_text(f"0 fail {GPU} nope\n0.1 end\n")
    rc, out = await _cli("fake-kubelet", "--root", str(short_tmp / "k"), "--script", str(script))
    assert rc == 0, out
    assert "script: 0s fail" in out and "script: 0.1s end" in out and "fake kubelet stopped" in out
    script.write_text("1 fial nvidia.com/gpu GPU-3\n")
    rc, out = await _cli("fake-kubelet", "--root", str(short_tmp / "k"), "--script", str(script))
    assert rc == 2 and "line 1: expected an action" in out
    # A NUMA node int() refuses, or one over int64: refused before serving, not a traceback or an
    # agent whose every answer fails.
    for numa in ("²", str(2**63)):
        script.write_text(f"0 add {GPU} GPU-x {numa}\n0.1 end\n")
        rc, out = await _cli("fake-kubelet", "--root", str(short_tmp / "k"), "--script", str(script))
        assert rc == 2 and "line 1:" in out and "Traceback" not in out, out
