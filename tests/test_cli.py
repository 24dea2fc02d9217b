"""The command line: snapshot against a real fake kubelet, clear one-line errors, help."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from testkit.hostile_text import INVISIBLE, LOOK_ALIKE, OVERDRAWN, hidden_in
from testkit.planted_secret import PLANTED_SECRET
from watcher.cli import PROG, build_parser, main
from watcher.sim.fake_kubelet import FakeKubelet

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


class ThreadedKubelet:
    """A FakeKubelet on its own loop in a thread, so synchronous CLI code can call it."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake = self.run(self._make(root))

    @staticmethod
    async def _make(root: Path) -> FakeKubelet:
        fake = FakeKubelet(root, seed=7)
        await fake.start()
        return fake

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=20)  # type: ignore[arg-type]

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        async def go() -> None:
            fn(*args)

        self.run(go())

    def close(self) -> None:
        self.run(self.fake.stop(remove_socket=True))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def threaded(short_tmp: Path) -> Iterator[ThreadedKubelet]:
    tk = ThreadedKubelet(short_tmp)
    try:
        yield tk
    finally:
        tk.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_snapshot_json_hash_is_stable_across_20_shuffled_calls(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Runs the real `fake-kubelet` command in its own process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "fake-kubelet", "--root", str(short_tmp)],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the socket is in place
        assert "fake kubelet serving" in line, line
        socket = short_tmp / "pod-resources" / "kubelet.sock"
        hashes = set()
        for _ in range(20):
            assert main(["snapshot", "--socket", str(socket), "--output", "json"]) == 0
            doc = json.loads(capfd.readouterr().out)
            hashes.add(doc["hash"])
        assert len(hashes) == 1
        assert doc["derived"]["cpus"]["allocatable"] == 92
        assert doc["hash"].startswith("sha256:") and len(doc["hash"]) == 7 + 64
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stderr is not None
        assert "fake kubelet stopped" in proc.stderr.read()
        proc.stderr.close()
    assert not (short_tmp / "pod-resources" / "kubelet.sock").exists()


def test_snapshot_table(threaded: ThreadedKubelet, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--socket", str(threaded.fake.socket_path)]) == 0
    out = capfd.readouterr().out
    assert "nvidia.com/gpu" in out and "ALLOCATABLE" in out
    assert "ml/trainer-0" in out and "claim dra/gpu-claim" in out


def test_snapshot_shows_failed_device_still_in_use(
    threaded: ThreadedKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    gpu = threaded.fake.node.pods[("ml", "inference-7f9c")].container("server").devices["nvidia.com/gpu"][0]
    threaded.call(threaded.fake.make_unhealthy, "nvidia.com/gpu", gpu)
    assert main(["snapshot", "--socket", str(threaded.fake.socket_path)]) == 0
    out = capfd.readouterr().out
    assert "ALLOCATED BUT NOT ALLOCATABLE" in out
    assert gpu in out and "ml/inference-7f9c/server" in out


def test_snapshot_list_only_when_allocatable_disabled(
    threaded: ThreadedKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    threaded.call(threaded.fake.faults.disable, "GetAllocatableResources")
    assert main(["snapshot", "--socket", str(threaded.fake.socket_path), "-o", "json"]) == 0
    captured = capfd.readouterr()
    doc = json.loads(captured.out)
    assert doc["inventory"]["allocatable"]["known"] is False
    assert "disabled" in doc["degraded"]
    assert captured.err.count("\n") == 1 and "warning" in captured.err


def test_snapshot_list_only_when_allocatable_is_not_protobuf(
    threaded: ThreadedKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    """A GetAllocatableResources answer that does not parse was a traceback: List's part is shown."""
    threaded.call(threaded.fake.faults.answer_garbage, "GetAllocatableResources")
    assert main(["snapshot", "--socket", str(threaded.fake.socket_path), "--no-pods-api"]) == 0
    out = capfd.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("note: allocatable unknown")]
    assert "GetAllocatableResources's answer on " in note and "is not protobuf" in note
    assert "ml/trainer-0" in out


def test_snapshot_repairs_text_that_is_not_utf8_as_the_agent_does(
    threaded: ThreadedKubelet, capfd: pytest.CaptureFixture[str]
) -> None:
    """A device id and a pod name with a bad byte: protobuf refuses the whole answer (a traceback
    here before); each bad byte is shown escaped, the rest of the node as it is."""
    threaded.call(threaded.fake.faults.substitute, b"GPU-evil", b"GPU\xffevil")
    threaded.call(threaded.fake.faults.substitute, b"trainer-0", b"trainer\xff0")
    threaded.call(threaded.fake.add_device, "nvidia.com/gpu", "GPU-evil", (0,))
    socket = str(threaded.fake.socket_path)
    assert main(["snapshot", "--socket", socket, "--no-pods-api"]) == 0
    out = capfd.readouterr().out
    assert "ml/trainer\\xff0" in out and "note: allocatable unknown" not in out
    assert main(["snapshot", "--socket", socket, "--no-pods-api", "-o", "json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["degraded"] is None
    assert "GPU\\xffevil" in doc["inventory"]["allocatable"]["devices"]["nvidia.com/gpu"]


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("pod-resources-watcher: error: ")
    return lines[0]


def test_missing_socket_is_one_line_in_a_real_process(short_tmp: Path) -> None:
    """A fresh interpreter: proves gRPC's C-core prints nothing of its own either."""
    result = subprocess.run(
        [sys.executable, "-m", "watcher", "snapshot", "--socket", str(short_tmp / "kubelet.sock")],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "does not exist" in _one_error_line(result.stderr)


def test_stale_socket_is_one_line_in_a_real_process(threaded: ThreadedKubelet) -> None:
    threaded.run(threaded.fake.stop())
    result = subprocess.run(
        [sys.executable, "-m", "watcher", "snapshot", "--socket", str(threaded.fake.socket_path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "not answering" in _one_error_line(result.stderr)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (lambda f: f.faults.disable("List"), "List is disabled"),
        (lambda f: f.faults.make_absent("List"), "does not implement List"),
        (lambda f: f.faults.set_delay("List", 3), "did not answer within 0.5 s"),
        (lambda f: f.faults.answer_garbage("List"), "List's answer on "),
    ],
    ids=["disabled", "unimplemented", "deadline", "garbage"],
)
def test_kubelet_failures_are_one_line(
    threaded: ThreadedKubelet,
    capfd: pytest.CaptureFixture[str],
    script: Callable[[FakeKubelet], None],
    expected: str,
) -> None:
    threaded.call(script, threaded.fake)
    code = main(["snapshot", "--socket", str(threaded.fake.socket_path), "--timeout", "0.5"])
    captured = capfd.readouterr()
    assert code == 1
    assert expected in _one_error_line(captured.err)


def test_not_a_socket_and_too_large(
    threaded: ThreadedKubelet, short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    regular = short_tmp / "file.sock"
    regular.write_text("")
    assert main(["snapshot", "--socket", str(regular)]) == 1
    assert "not a unix socket" in _one_error_line(capfd.readouterr().err)
    assert main(["snapshot", "--socket", str(threaded.fake.socket_path), "--max-receive-bytes", "100"]) == 1
    assert "receive limit" in _one_error_line(capfd.readouterr().err)


def test_bad_arguments_exit_2(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["snapshot", "--timeout", "-1"])
    assert info.value.code == 2
    assert "must be greater than 0" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        (["snapshot", "--timeout", "nan"], "nan"),
        (["snapshot", "--timeout", "inf"], "inf"),
        (["snapshot", "--timeout=-inf"], "-inf"),
        (["fake-kubelet", "--rate", "nan"], "nan"),
    ],
)
def test_number_flags_refuse_nan_and_inf(
    argv: list[str], given: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """`--timeout nan` passed the `> 0` check and reported "List did not answer within nan s"."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert f"expected a finite number, got {given!r}" in capfd.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["snapshot"],
        ["fake-kubelet"],
        ["demo"],
        ["run"],
        ["check-config"],
        ["send-test"],
        ["outbox"],
        ["audit"],
    ],
)
def test_help_everywhere(argv: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: pod-resources-watcher")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, read from the real parser: argparse offers no public accessor,
    and a list written here would miss the next command added."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a.choices, dict)]
    return dict(sub.choices)


def _help_exit_codes(argv: list[str], capfd: pytest.CaptureFixture[str]) -> dict[int, str]:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capfd.readouterr().out
    assert "exit codes:" in out, argv
    block = out[out.index("exit codes:") :]
    return {int(m[1]): m[2] for m in re.finditer(r"^  (\d+) +(.+)$", block, re.MULTILINE)}


def test_every_command_states_its_own_exit_codes(capfd: pytest.CaptureFixture[str]) -> None:
    commands = subcommands()
    assert {"run", "check-config", "outbox", "audit", "demo", "fake-kubelet", "version"} <= set(commands)
    codes = {name: _help_exit_codes([name], capfd) for name in commands}
    assert 0 in _help_exit_codes([], capfd)
    for name, listed in codes.items():
        assert 0 in listed and 2 in listed, name
        # 2 is argparse's own answer to a bad command line, for every command.
        with pytest.raises(SystemExit) as info:
            main([name, "--no-such-option"])
        assert info.value.code == 2, name
    # Each command lists what it returns, not the program's whole set.
    assert set(codes["check-config"]) == {0, 2, 141}
    assert set(codes["version"]) == {0, 2, 141}
    assert 3 in codes["audit"] and "gaps" in codes["audit"][3]
    assert "kubelet" in codes["snapshot"][1]
    assert "not delivered" in codes["send-test"][1]
    assert "API server" in codes["kubernetes"][1]
    for name in ("run", "fake-kubelet", "outbox"):
        assert "kubelet could not be queried" not in codes[name].get(1, ""), name


def test_output_into_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    """`check-config FILE | head -1`: once head has its line and exits, our next write meets a
    closed pipe. Made certain here by closing the pipe's reading end before the command starts."""
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{tmp_path / "state"}"\n')
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "watcher", "check-config", str(config)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141  # as a command that SIGPIPE ended


def test_check_config_piped_into_head(tmp_path: Path) -> None:
    """The real pipeline, a few times over: whether head exits before or after we write, the
    first line arrives and nothing is said on stderr."""
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{tmp_path / "state"}"\n')
    command = f"{sys.executable} -m watcher check-config {config} | head -1"
    for _ in range(3):
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=_env(), timeout=60)
        assert proc.stdout == f"{config}: OK\n"
        assert proc.stderr == ""
        assert proc.returncode == 0


@pytest.mark.slow  # the whole demo story, in this process (its fake kubelet and receiver too)
def test_demo_plays_the_whole_story_and_ends_by_itself(capfd: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert main(["demo", "--seed", "3"]) == 0
    assert time.monotonic() - started < 30
    out = capfd.readouterr().out
    for kind in (
        "watcher.started",
        "device.added",
        "device.removed",
        "allocation.added",
        "kubelet.restarted",
        "cpu.removed",
        "device.unhealthy",
        "device.healthy",
    ):
        assert kind in out, kind
    # The Pods API path: each page names the Job whose pod holds the failed GPU, first; the DRA
    # GPU's carries its driver's own words, which only the holder's Pod status had. Both resolve.
    trigger = "page    <- trigger: "
    pages = [line.strip()[len(trigger) :] for line in out.splitlines() if line.strip().startswith(trigger)]
    assert len(pages) == 2, pages
    assert pages[0].startswith("Job ml/llm-pretrain (team research): nvidia.com/gpu ")
    assert "allocated to ml/trainer-0/trainer" in pages[0]
    assert pages[1].startswith("Job ml/llm-finetune (team research): gpu.nvidia.com gpu-0 (pool demo-node) ")
    assert "unhealthy: critical XID 79 reported by NVML; held by ml/llm-finetune-0-x7k2p/trainer" in pages[1]
    # Every event reached every sink, and the audit log it wrote is intact.
    summary = out[out.index("== Summary") :]
    events = int(summary.split("events: ")[1].split(" ")[0])
    for sink in ("audit", "console", "webhook"):
        assert f"deliveries to {sink}: delivered {events}" in summary
    assert f"webhook receiver got {events} signed CloudEvents" in summary
    assert "pages: 2 triggered, 2 resolved" in summary
    assert f"audit log: intact, {events} records chained" in summary
    # Both restarts warmed up as a real kubelet's do, and neither reached anyone.
    assert "kubelet restarts with a warm-up: 2, absorbed with 0 false alarm(s)" in summary
    assert out.count("registered again") >= 4


def test_version_names_the_commit_of_a_git_checkout(capfd: pytest.CaptureFixture[str]) -> None:
    from watcher import __version__

    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert main(["version"]) == 0
    assert capfd.readouterr().out == f"pod-resources-watcher {__version__} (git {head})\n"
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capfd.readouterr().out == f"pod-resources-watcher {__version__} (git {head})\n"


def test_version_outside_a_checkout_is_the_plain_version(tmp_path: Path) -> None:
    """Copied out of the checkout, and copied into a subdirectory of another repository (as a
    package installed into a virtualenv inside some checkout is): no commit, nobody else's."""
    from watcher import __version__

    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
         "-q", "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    for where in (tmp_path / "plain", tmp_path / "repo" / "lib"):
        shutil.copytree(ROOT / "watcher", where / "watcher", ignore=shutil.ignore_patterns("__pycache__"))
        proc = subprocess.run(
            [sys.executable, "-m", "watcher", "version"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(where)},
            cwd=where,
            timeout=60,
        )
        assert (proc.returncode, proc.stderr) == (0, "")
        assert proc.stdout == f"pod-resources-watcher {__version__}\n", where


@pytest.mark.chaos  # long: `make chaos` runs it (CI runs both), `make test` leaves it out
def test_demo_forever_churns_until_interrupted_then_summarises() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "demo", "--forever", "--seed", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("== Random churn"):
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "== Summary" in out
    assert "audit log: intact" in out


def test_send_test_never_touches_the_audit_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A test record in the real chain would take a seq the agent needs; it goes beside the log."""
    audit = tmp_path / "audit.jsonl"
    config = tmp_path / "config.toml"
    config.write_text(
        f'node = "node-a"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[sinks.audit]\ntype = "file"\npath = "{audit}"\n'
    )
    assert main(["send-test", "audit", "--config", str(config)]) == 0
    out = capfd.readouterr().out
    assert "audit.jsonl.send-test" in out and "not to the sink's own stream" in out
    assert not audit.exists()
    copy = Path(str(audit) + ".send-test")
    assert json.loads(copy.read_text().splitlines()[0])["event"]["summary"].startswith("TEST")
    assert main(["audit", "verify", str(copy)]) == 0


def test_the_snapshot_table_escapes_names_that_would_forge_lines() -> None:
    from watcher.model.build import build
    from watcher.sim.fake_node import default_node
    from watcher.snapshot.take import Snapshot, format_table

    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    gpu = next(i for r, i in fake.node.devices if r == "nvidia.com/gpu")
    fake.make_unhealthy("nvidia.com/gpu", gpu)  # listed under ALLOCATED BUT NOT ALLOCATABLE if held
    fake.allocate("ml", "evil\npod\x1b[2J", "c", devices={"nvidia.com/gpu": [gpu]})
    plain = format_table(Snapshot(build(fake.allocatable_response(), fake.list_response())))
    assert "\x1b" not in plain
    assert "ml/evil\\x0apod\\x1b[2J" in plain
    assert not any(line.startswith("pod") for line in plain.splitlines())


def test_the_snapshot_table_shows_invisible_and_combining_characters_escaped_and_aligned() -> None:
    """A look-alike of GPU-1 (a zero-width space after it), a stack of combining marks, bidi and tag
    characters: each escaped, so the id reads as what it is, and the columns after it line up."""
    from watcher.model.build import build
    from watcher.sim.fake_node import default_node
    from watcher.snapshot.take import Snapshot, format_table

    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    ids = [LOOK_ALIKE, OVERDRAWN, "GPU-" + "".join(INVISIBLE.values())]
    for i in ids:
        fake.add_device("nvidia.com/gpu", i, [0])
    fake.allocate("ml", "p\u200f1", "c", devices={"nvidia.com/gpu": ids})
    for i in ids:
        fake.remove_device("nvidia.com/gpu", i)  # listed under ALLOCATED BUT NOT ALLOCATABLE
    plain = format_table(Snapshot(build(fake.allocatable_response(), fake.list_response())))
    assert hidden_in(plain, allowed="\n") == []
    lines = plain.splitlines()
    header = lines.index("ALLOCATED BUT NOT ALLOCATABLE (failed or vanished while in use)") + 1
    rows = lines[header + 1 : header + 1 + len(ids)]
    assert any(r.split()[1] == "GPU-1\\u200b" for r in rows), rows
    # Every row's NUMA column starts where the header's does.
    numa_at = lines[header].index("NUMA")
    assert [(r[numa_at:].split()[0], r[numa_at - 2 : numa_at]) for r in rows] == [("0", "  ")] * len(ids), (
        rows
    )


# --- check-config prints no secret ---

CHECK_CONFIG_SECRETS = {
    "userinfo": "AmPassw0rd-5e1f77",
    "alertmanager query": "AmQueryToken-77aa0c",
    "authorization header": "LiteralAuthHeader-4f0e19",
    "header from env": "EnvHeaderValue-2b8d63",
    "webhook path token": "WebhookPathToken-9c2d4e",
    "webhook query": "HookQuerySig-31bbd0",
    "slack path token": "SlackPathToken-88ab7e",
    "pagerduty endpoint password": "PdEndpointPass-1234ab",
    "planted": PLANTED_SECRET,
}


def test_check_config_prints_no_secret_in_any_form(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CHECK_CONFIG_SECRETS
    monkeypatch.setenv("HOOK_API_KEY", s["header from env"])
    config = tmp_path / "w.toml"
    config.write_text(
        f"""node = "node-a"
state_dir = "{tmp_path / "state"}"
[sinks.am]
type = "alertmanager"
url = "http://amuser:{s["userinfo"]}@127.0.0.1:9093/?token={s["alertmanager query"]}"
bearer_token = "{s["planted"]}"
[sinks.hook]
type = "webhook"
url = "http://127.0.0.1:9/hooks/{s["webhook path token"]}?sig={s["webhook query"]}"
headers = {{ Authorization = "Bearer {s["authorization header"]}", X-Api-Key = "${{HOOK_API_KEY}}" }}
[sinks.slack]
type = "slack"
url = "http://127.0.0.1:9/services/T0/B0/{s["slack path token"]}"
[sinks.pager]
type = "pagerduty"
routing_key = "0123456789abcdef0123456789abcdef"
endpoint = "http://pd:{s["pagerduty endpoint password"]}@127.0.0.1:9/v2/enqueue"
"""
    )
    assert main(["check-config", str(config)]) == 0
    out, err = capfd.readouterr()
    for what, secret in s.items():
        assert secret not in out + err, what
    assert err == ""
    sinks = {sink["name"]: sink for sink in json.loads(out.split("\n", 1)[1])["sinks"]}
    # Still useful: where each secret comes from, the URLs' hosts, the header names.
    assert sinks["am"]["url"] == "http://***@127.0.0.1:9093/?***"
    assert sinks["am"]["bearer_token"] == "Secret(inline value)"
    assert sinks["hook"]["url"] == "Secret(inline value)"
    assert sinks["hook"]["headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert sinks["pager"]["endpoint"] == "http://***@127.0.0.1:9/v2/enqueue"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            '{ Authorization = ["Bearer LeakedHeader-0a1b2c"] }',
            "sinks.hook.headers.Authorization: got a list",
        ),
        ('["Authorization: Bearer LeakedHeader-0a1b2c"]', "sinks.hook.headers: got a list"),
        ('"Bearer LeakedHeader-0a1b2c"', "sinks.hook.headers: got a string; expected a table of strings"),
        ("{ X = 5 }", "sinks.hook.headers.X: got a whole number; expected a string"),
        ('{ X = { Y = "LeakedHeader-0a1b2c" } }', "sinks.hook.headers.X: got a table; expected a string"),
    ],
)
def test_a_type_error_in_headers_names_the_key_never_the_value(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], headers: str, message: str
) -> None:
    config = tmp_path / "w.toml"
    config.write_text(f'[sinks.hook]\ntype = "webhook"\nurl = "http://127.0.0.1:9/"\nheaders = {headers}\n')
    assert main(["check-config", str(config)]) == 2
    out, err = capfd.readouterr()
    line = _one_error_line(err)
    assert line.startswith(f"pod-resources-watcher: error: {message}")
    assert out == ""
    assert "LeakedHeader" not in err and "Bearer" not in err and "5" not in line.rpartition(":")[2]


def test_outbox_names_the_sinks_when_asked_for_one_that_does_not_exist(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from watcher.store.outbox import OUTBOX_FILE, OutboxDatabase

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    box = OutboxDatabase(state / OUTBOX_FILE)
    box.open()
    box.sinks.register(["audit", "hook"])
    box.close()
    for action in ("list", "retry", "drop"):
        assert main(["outbox", action, "--state-dir", str(state), "--sink", "nosuch"]) == 2
        out, err = capfd.readouterr()
        assert out == ""  # no empty table, no "0 dead letter(s)"
        assert err == (
            "pod-resources-watcher: error: no sink named 'nosuch' in the outbox (sinks: audit, hook)\n"
        )
    assert main(["outbox", "list", "--state-dir", str(state), "--sink", "hook"]) == 0
    assert [line.split()[0] for line in capfd.readouterr().out.splitlines()] == ["SINK", "hook"]
    # A sink the config names but that has queued nothing yet is a sink, not a typo.
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{state}"\n[sinks.console]\ntype = "stdout"\n')
    assert main(["outbox", "list", "--config", str(config), "--sink", "console"]) == 0
    assert "console" in capfd.readouterr().out
    assert main(["outbox", "list", "--config", str(config), "--sink", "consle"]) == 2
    assert "(sinks: audit, console, hook)" in capfd.readouterr().err


def _check(tmp_path: Path, sink: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{tmp_path / "state"}"\n{sink}')
    code = main(["check-config", str(config)])
    return code, capfd.readouterr().err


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[kubelet]\nwarmup_grace = nan\n", "kubelet.warmup_grace"),
        ("[watch]\ninterval = +inf\n", "watch.interval"),
        ('[sinks.s]\ntype = "stdout"\nmax_age = inf\n', "sinks.s.max_age"),
        ('[sinks.s]\ntype = "stdout"\ngroup_window = -inf\n', "sinks.s.group_window"),
    ],
)
def test_check_config_refuses_nan_and_inf_naming_the_key(
    toml: str, key: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """TOML's nan and inf literals: check-config said OK and printed `NaN` (not JSON) for them."""
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{tmp_path / "state"}"\n{toml}')
    assert main(["check-config", str(config)]) == 2
    out, err = capfd.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"pod-resources-watcher: error: {key}: got ")
    assert "expected a finite number" in line


def test_check_config_refuses_tls_files_that_cannot_be_read(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The sink opens them only at its first delivery: unchecked, a missing CA bundle fails every
    delivery, retried for good, while check-config says OK."""
    hook = '[sinks.hook]\ntype = "webhook"\nurl = "https://127.0.0.1:9/"\n'
    code, err = _check(tmp_path, hook + 'ca_file = "missing-ca.pem"\n', capfd)
    assert code == 2
    missing = tmp_path / "missing-ca.pem"  # relative to the config file's directory
    assert err == (
        "pod-resources-watcher: error: sinks.hook.ca_file: "
        f"cannot read {missing}: No such file or directory\n"
    )
    (tmp_path / "ca.pem").write_text("a CA bundle\n")
    (tmp_path / "client.pem").write_text("a certificate\n")
    assert _check(tmp_path, hook + 'ca_file = "ca.pem"\n', capfd) == (0, "")
    pair = 'cert_file = "client.pem"\nkey_file = "client-key.pem"\n'
    code, err = _check(tmp_path, hook + pair, capfd)
    assert code == 2 and "sinks.hook.key_file: cannot read" in err
    code, err = _check(tmp_path, hook + 'ca_file = "."\n', capfd)  # a directory is no bundle
    assert code == 2 and "sinks.hook.ca_file: cannot read" in err


@pytest.mark.parametrize(
    ("kinds", "suggestion"),
    [
        ('["devcie.*"]', "'device.*'"),
        ('["*", "device.addd"]', "'device.added'"),
        ('["kublet.*"]', "'kubelet.*'"),
    ],
)
def test_check_config_refuses_a_kind_pattern_that_matches_no_kind(
    kinds: str, suggestion: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, err = _check(tmp_path, f'[sinks.s]\ntype = "stdout"\nkinds = {kinds}\n', capfd)
    assert code == 2
    index = kinds.count(",")  # the bad one is the last entry
    assert err.startswith(
        f"pod-resources-watcher: error: sinks.s.kinds[{index}]: matches no event kind; "
        f"did you mean {suggestion}?"
    )
    assert "device.*" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "kinds", ['["*"]', '["device.*"]', '["device.added", "kubelet.*", "api.degraded"]', '["*.added"]']
)
def test_check_config_takes_kind_patterns_that_match(
    kinds: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert _check(tmp_path, f'[sinks.s]\ntype = "stdout"\nkinds = {kinds}\n', capfd) == (0, "")


def test_a_relative_file_sink_path_is_inside_state_dir(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """config.example.toml: "A relative path is inside state_dir" for a file sink's `path`, though
    other relative paths are relative to the config file's directory."""
    from watcher.settings_file import load_settings
    from watcher.sim.send_test import MemoryStore, synthetic_events
    from watcher.sinks.registry import build_sink

    state, conf = tmp_path / "state", tmp_path / "etc"
    state.mkdir(mode=0o700)
    conf.mkdir()
    config = conf / "c.toml"
    config.write_text(
        f'node = "n"\nstate_dir = "{state}"\n[sinks.audit]\ntype = "file"\npath = "audit.jsonl"\n'
    )
    settings = load_settings(config)
    (cfg,) = settings.sinks

    async def deliver() -> bool:
        sink = build_sink(cfg, node="n", state_dir=settings.state_dir, store=MemoryStore())
        try:
            return (await sink.deliver(synthetic_events("n", paging=False))).delivered
        finally:
            await sink.close()

    assert asyncio.run(deliver())
    assert (state / "audit.jsonl").is_file()
    assert not (conf / "audit.jsonl").exists()
    # send-test writes its copy beside the real log, and says where that is.
    assert main(["send-test", "audit", "--config", str(config)]) == 0
    assert f"writing to {state / 'audit.jsonl.send-test'}," in capfd.readouterr().out
    assert (state / "audit.jsonl.send-test").is_file()


def _readme_commands() -> str:
    """The command block of docs/cli.md's Commands section (the README links it)."""
    readme = (ROOT / "docs" / "cli.md").read_text()
    section = readme[readme.index("## Commands\n") :]
    start = section.index("```\n") + 4
    return section[start : section.index("\n```", start)]


def test_the_readme_command_list_names_every_command_and_option() -> None:
    """docs/cli.md's Commands block, against the real parser: each subcommand has a line, each of
    its long options and each choice of its positional arguments is on that command's lines,
    its short options somewhere in the section, and no line names a command that does not exist."""
    block = _readme_commands()
    lines: dict[str, list[str]] = {}
    for line in block.splitlines():
        assert line.startswith("pod-resources-watcher "), line
        lines.setdefault(line.split()[1], []).append(line.split("#")[0])
    commands = subcommands()
    assert set(lines) == set(commands)
    readme = (ROOT / "docs" / "cli.md").read_text()
    section = readme[readme.index("## Commands\n") : readme.index("\n## ", readme.index("## Commands\n"))]
    missing = []
    for name, parser in commands.items():
        written = " ".join(lines[name])
        for action in parser._actions:  # argparse has no public accessor for its options
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                if option.startswith("--") and not re.search(rf"{option}(?![\w-])", written):
                    missing.append(f"{name} {option}")
                if not option.startswith("--") and f"`{option}`" not in section:
                    missing.append(f"{name} {option} (short)")
            if not action.option_strings and action.choices:
                missing += [f"{name} {choice}" for choice in action.choices if choice not in written]
    top = [o for a in build_parser()._actions for o in a.option_strings if o not in ("-h", "--help")]
    missing += [f"{PROG} {o}" for o in top if o not in block]
    assert missing == []
