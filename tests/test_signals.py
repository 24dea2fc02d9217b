"""SIGHUP on the real command: ignored until the agent runs, coalesced, never during shutdown,
and the service manager told (systemd's notify protocol, read from a real datagram socket)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HUP_MASK = 1 << (signal.SIGHUP - 1)


def _hup_ignored(pid: int) -> bool:
    """Whether the process ignores SIGHUP right now, as the kernel sees it."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & HUP_MASK)
    return False


class _Lines:
    """A process's stderr JSON log lines, read on a thread so waits can have deadlines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self._q: queue.Queue[dict[str, object] | None] = queue.Queue()
        self.seen: list[dict[str, object]] = []
        self.raw: list[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.raw.append(line)
            try:
                self._q.put(json.loads(line))
            except ValueError:
                continue
        self._q.put(None)

    def wait_for(self, event: str, timeout: float = 20.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            entry = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            assert entry is not None, f"the process ended before logging {event!r}:\n{''.join(self.raw)}"
            self.seen.append(entry)
            if entry.get("event") == event:
                return entry

    def drain(self) -> None:
        self._thread.join(timeout=20)
        self._proc.stderr.close()  # type: ignore[union-attr]
        while not self._q.empty():
            entry = self._q.get()
            if entry is not None:
                self.seen.append(entry)


class _Notify:
    """A stand-in for systemd's $NOTIFY_SOCKET: a real unix datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))

    def next(self, timeout: float = 20.0) -> set[str]:
        self.sock.settimeout(timeout)
        return set(self.sock.recv(4096).decode().split("\n"))

    def wait_for(self, line: str, timeout: float = 20.0) -> set[str]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.next(max(0.01, deadline - time.monotonic()))
            if line in got:
                return got


@contextmanager
def _agent(short_tmp: Path, config: Path, notify: _Notify) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": str(notify.path)},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=20)
        notify.sock.close()


def _config(short_tmp: Path, *sinks: str) -> str:
    text = (
        f'node = "node-a"\nstate_dir = "{short_tmp / "state"}"\n'
        f'[kubelet]\nsocket = "{short_tmp / "no-kubelet" / "kubelet.sock"}"\n'
        f'root_dir = "{short_tmp / "no-kubelet"}"\n'
        '[http]\nenabled = false\n[log]\nformat = "json"\n'
    )
    for name in sinks:
        text += f'[sinks.{name}]\ntype = "file"\npath = "{short_tmp / (name + ".jsonl")}"\n'
    return text


def test_a_burst_of_sighups_from_the_first_instant_is_one_or_two_reloads(short_tmp: Path) -> None:
    config = short_tmp / "w.toml"
    config.write_text(_config(short_tmp))
    notify = _Notify(short_tmp / "notify")
    with _agent(short_tmp, config, notify) as proc:
        logs = _Lines(proc)
        # The earliest moment a process can do anything about SIGHUP is its own first lines;
        # from the instant the kernel shows it ignored, every HUP must be survivable.
        deadline = time.monotonic() + 10
        while not _hup_ignored(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
        sent = 0
        while True:  # HUPs all through the start (imports, opening the outbox) ...
            proc.send_signal(signal.SIGHUP)
            sent += 1
            try:
                notify.sock.settimeout(0.005)
                if "READY=1" in notify.sock.recv(4096).decode().split("\n"):
                    break
            except TimeoutError:
                pass
            assert proc.poll() is None, f"killed by SIGHUP number {sent} during the start"
            assert sent < 5000, "the agent never said it was ready"
        assert sent > 1
        # ... then 100 in one second while it runs, the file rewritten twice meanwhile: the
        # reload that follows must read the last version.
        start = time.monotonic()
        for i in range(100):
            if i == 30:
                config.write_text(_config(short_tmp, "first"))
            if i == 60:
                config.write_text(_config(short_tmp, "second"))
            proc.send_signal(signal.SIGHUP)
            time.sleep(max(0.0, start + (i + 1) / 100 - time.monotonic()))  # pacing the sender
        assert "RELOADING=1" in notify.wait_for("RELOADING=1")
        notify.wait_for("READY=1")
        # A HUP still pending from the start may reload the unchanged file first (no sink changes):
        # the reload that counts is the one after the burst, and it must read the last version.
        reloaded = logs.wait_for("configuration reloaded")
        while not reloaded["sinks_changed"]:
            reloaded = logs.wait_for("configuration reloaded")
        # The built-in stdout sink goes (the file names its own) and only the last version's arrives.
        assert reloaded["sinks_changed"] == ["second", "stdout"]
        # One more, alone, so that no reload is pending or running when the shutdown begins.
        config.write_text(_config(short_tmp, "third"))
        proc.send_signal(signal.SIGHUP)
        while "third" not in logs.wait_for("configuration reloaded")["sinks_changed"]:
            pass
        burst = [e for e in logs.seen if e.get("event") == "configuration reloaded" and e["sinks_changed"]][
            :-1
        ]
        # Shutdown, with HUPs raining on it from its first instant, through the handing over of
        # queued events, to the end: neither a reload nor death by signal.
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None:
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.002)  # pacing the sender, not waiting for the agent
        assert proc.wait(timeout=20) == 0
        notify.wait_for("STOPPING=1")
        logs.drain()
    reloads = [e for e in logs.seen if e.get("event") == "configuration reloaded"]
    assert 1 <= len(burst) <= 2, burst
    assert "third" in reloads[-1]["sinks_changed"], "a reload ran during the shutdown"
    assert not any("cannot schedule new futures" in line for line in logs.raw)


def test_sighup_kills_commands_that_do_not_reload(short_tmp: Path) -> None:
    # Only `run` has something to reload: the others keep the default (a closed terminal ends them).
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", "fake-kubelet", "--root", str(short_tmp / "k")],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        assert "serving" in proc.stderr.readline()
        assert not _hup_ignored(proc.pid)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=20) == -signal.SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize("where", ["path", "abstract"])
def test_notify_reaches_the_service_manager(
    short_tmp: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watcher.ops import notify

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if where == "path":
        sock.bind(str(short_tmp / "n"))
        monkeypatch.setenv("NOTIFY_SOCKET", str(short_tmp / "n"))
    else:
        name = f"prw-test-{os.getpid()}"
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    sock.settimeout(5)
    with sock:
        assert notify.ready("watching")
        assert set(sock.recv(4096).decode().split("\n")) == {"READY=1", "STATUS=watching"}
        assert notify.reloading()
        got = sock.recv(4096).decode().split("\n")
        assert got[0] == "RELOADING=1" and got[1].startswith("MONOTONIC_USEC=")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify.ready("outside systemd")  # nothing to tell, and no error


def test_grpc_fatal_messages_are_not_silenced() -> None:
    # gRPC reads its verbosity once, at import: ERROR keeps the message of a fatal check (an
    # abort that would otherwise leave no word), and nothing chattier. An operator's own setting wins.
    code = "import os, watcher; print(os.environ['GRPC_VERBOSITY'])"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ERROR"
    mine = {**env, "PYTHONPATH": str(ROOT), "GRPC_VERBOSITY": "DEBUG"}
    assert (
        subprocess.run(
            [sys.executable, "-c", code], env=mine, capture_output=True, text=True, check=True
        ).stdout.strip()
        == "DEBUG"
    )
