"""Process faults: the agent SIGKILLed inside its outbox transaction, the audit log cut mid-record.

The agent runs as a real process (`python -m testkit.store_kill_point`, the CLI with a kill point armed)
against a fake kubelet in this process; the audit log (a `file` sink) is the record of what was
emitted. After each kill the agent is started again, unarmed: the database must be intact, and
every change must be in the log exactly once, with seqs that neither repeat nor skip.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from testkit.agent import write_agent_config
from testkit.disks import fill
from testkit.waiting import wait_until
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope, new_cycle_id
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sinks.audit import make_record, verify_files
from watcher.sinks.file import FileSink, FileSinkSettings

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parent.parent


def _audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line)["event"] for line in path.read_text().splitlines() if line.strip()]


class _Agent:
    """The watcher as a child process, optionally armed to stop inside its N-th commit."""

    def __init__(self, root: Path, fake: FakeKubelet) -> None:
        self.root = root
        self.audit = root / "state" / "audit.jsonl"
        self.hold_dir = root / "hold"
        self.hold_dir.mkdir(exist_ok=True)
        self.config = write_agent_config(root / "watcher.toml", root, fake, "")
        self.argv = ["run", "--config", str(self.config)]
        self.log = root / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, hold_at: int = 0) -> None:
        (self.hold_dir / "holding").unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "testkit.store_kill_point",
                    str(self.hold_dir),
                    str(hold_at),
                    "--",
                    *self.argv,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    async def held(self) -> list[int]:
        """The seqs of the commit the agent is stuck in, once it is (its rows already in the WAL)."""
        holding = self.hold_dir / "holding"
        await wait_until(lambda: holding.exists() and holding.read_text() != "", 20)
        held = json.loads(holding.read_text())
        assert held["wal"] > 0, "the held transaction should have spilled into the WAL"
        return list(held["seqs"])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)


@pytest.fixture
def agent_and_kubelet(short_tmp: Path) -> Iterator[tuple[_Agent, FakeKubelet]]:
    fake = FakeKubelet(short_tmp / "kubelet", seed=5)
    agent = _Agent(short_tmp, fake)
    try:
        yield agent, fake
    finally:
        agent.stop()


def _integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _added(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(e["details"]["device"]) for e in events if e["kind"] == "device.added")


@pytest.mark.slow
async def test_sigkill_inside_the_outbox_transaction_loses_and_repeats_nothing(
    agent_and_kubelet: tuple[_Agent, FakeKubelet],
) -> None:
    agent, fake = agent_and_kubelet
    async with fake:
        # 1st commit: the baseline. Killed inside it, nothing may have been emitted.
        agent.start(hold_at=1)
        held = await agent.held()
        assert held == [1]
        agent.kill()
        assert _audit(agent.audit) == []
        assert _integrity(agent.root / "state" / "outbox.db") == "ok"

        # Again: the baseline is taken afresh and commits; then a change is made and the
        # agent is killed inside the commit of its events (the 2nd commit).
        agent.start(hold_at=2)
        await wait_until(lambda: len(_audit(agent.audit)) >= 1, 20)
        fake.add_device(GPU, "GPU-one", (0,))
        held = await agent.held()
        assert len(held) == 2  # device.added and capacity.changed, rows written, not committed
        agent.kill()
        assert _integrity(agent.root / "state" / "outbox.db") == "ok"
        assert _added(_audit(agent.audit)) == Counter()

        # The 1st commit now reports GPU-one. Then a bigger one: 40 devices at once (no await
        # in between, so one answer holds them all), killed inside it; one more change is
        # made while the agent is down.
        agent.start(hold_at=2)
        await wait_until(lambda: _added(_audit(agent.audit)) == Counter({"GPU-one": 1}), 20)
        for i in range(40):
            fake.add_device(GPU, f"GPU-many-{i}", (i % 2,))
        held = await agent.held()
        assert len(held) == 41  # 40 device.added and a capacity.changed
        agent.kill()
        fake.add_device(GPU, "GPU-while-down", (1,))
        assert _integrity(agent.root / "state" / "outbox.db") == "ok"

        # Unarmed: everything since the last commit is reported, once.
        agent.start()
        want = Counter({"GPU-one": 1, "GPU-while-down": 1, **{f"GPU-many-{i}": 1 for i in range(40)}})
        await wait_until(lambda: _added(_audit(agent.audit)) == want, 30)
        agent.stop()

    events = _audit(agent.audit)
    assert _added(events) == want
    seqs = [int(e["seq"]) for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # no seq lost or repeated across the kills
    assert len({e["id"] for e in events}) == len(events)
    # One per start, but for the first, killed inside its baseline commit.
    assert [e["kind"] for e in events].count("watcher.started") == 3
    result = verify_files([agent.audit])
    assert result.ok, result.problem
    assert "Traceback" not in agent.log.read_text()


# --- the audit log cut in the middle of a record ---


def _event(seq: int, size: int = 0) -> Event:
    change = Change(
        Kind.DEVICE_ADDED,
        Severity.INFO,
        f"{GPU} GPU-{seq} joined allocatable",
        {"resource": GPU, "device": f"GPU-{seq}", "numa": [0], "padding": "x" * size},
    )
    return envelope(change, seq=seq, node="node-a", cycle=new_cycle_id(), before=None, after=None)


def _sink(path: Path) -> FileSink:
    return FileSink(FileSinkSettings(name="audit", path=path), path)


def _records(path: Path) -> list[int]:
    return [int(json.loads(line)["event"]["seq"]) for line in path.read_bytes().splitlines()]


async def test_half_a_record_left_by_a_crash_is_cut_off_and_written_again(short_tmp: Path) -> None:
    path = short_tmp / "audit.jsonl"
    sink = _sink(path)
    assert (await sink.deliver([_event(1), _event(2)])).delivered
    await sink.close()
    whole = path.read_bytes()
    # What a crash mid-write leaves: the start of record 3, no newline.
    line3, _ = make_record(3, json.loads(whole.splitlines()[-1])["hash"], _event(3).to_dict())
    path.write_bytes(whole + line3.encode()[:57])

    sink = _sink(path)
    with capture_logs() as logs:
        assert (await sink.deliver([_event(3), _event(4)])).delivered
    await sink.close()
    assert path.read_bytes().startswith(whole)
    assert _records(path) == [1, 2, 3, 4]
    result = verify_files([path])
    assert result.ok and result.records == 4, result.problem
    cut = [e for e in logs if e["event"].startswith("audit log ended in half a record")]
    assert cut and cut[0]["bytes_cut"] == 57


async def test_a_disk_that_fills_mid_record_never_keeps_half_of_it(
    short_tmp: Path, tiny_filesystem: Path
) -> None:
    path = tiny_filesystem / "audit.jsonl"
    sink = _sink(path)
    assert (await sink.deliver([_event(1)])).delivered
    # Fill the filesystem to its last page: the log's own page keeps some room, so the next
    # (large) record is written in part and then refused: a short write, as on a real disk.
    fill(tiny_filesystem / "filler")
    outcome = await sink.deliver([_event(2, size=64 * 1024)])
    assert outcome.retry and outcome.error is not None and "No space left" in outcome.error
    assert path.read_bytes().endswith(b"\n")
    assert _records(path) == [1]
    (tiny_filesystem / "filler").unlink()
    assert (await sink.deliver([_event(2, size=64 * 1024)])).delivered
    await sink.close()
    assert _records(path) == [1, 2]
    assert verify_files([path]).ok


@pytest.mark.parametrize("earlier", [0, 2])
async def test_records_whose_fsync_failed_are_written_again(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, earlier: int
) -> None:
    # A failed fsync may have lost the data while reads still show it: the records it covered
    # must be cut back and written again, not skipped on the retry as already there.
    path = short_tmp / "audit.jsonl"
    sink = _sink(path)
    if earlier:
        assert (await sink.deliver([_event(i) for i in range(1, earlier + 1)])).delivered
    real_fsync, failures = os.fsync, []

    def fsync_fails_once(fd: int) -> None:
        if not failures:
            failures.append(fd)
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_fails_once)
    outcome = await sink.deliver([_event(earlier + 1), _event(earlier + 2)])
    assert outcome.retry and outcome.error is not None and "Input/output error" in outcome.error
    assert _records(path) == list(range(1, earlier + 1))  # cut back to the last good fsync
    assert (await sink.deliver([_event(earlier + 1), _event(earlier + 2)])).delivered
    await sink.close()
    assert _records(path) == list(range(1, earlier + 3))
    result = verify_files([path])
    assert result.ok and result.records == earlier + 2, result.problem
