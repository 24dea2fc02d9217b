"""What the audit log's integrity checks catch, and what they do not, with real files and the real CLI.

Each attack is done the way someone who can write the node's files would do it: with the public
record format (`watcher.sinks.audit`: SHA-256, or HMAC-SHA256 under a key they do not have) and the
public head file format. `audit verify` runs in-process through `watcher.cli.main`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from testkit.node_model import FAST
from testkit.receivers import WebhookReceiver
from watcher.cli import main
from watcher.config import ConfigError
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.model.gaps import Gap
from watcher.settings_file import parse_settings
from watcher.sim.send_test import MemoryStore
from watcher.sinks.audit import Head, head_path, make_gap_record, make_record, record_hash
from watcher.sinks.audit.chain import canonical_json, chain_hash
from watcher.sinks.base import GapRecorder, Sink
from watcher.sinks.registry import build_sinks

NODE = "node-a"
GPU = "nvidia.com/gpu"
KEY = "audit-key-for-tests-0123456789abcdef"


def _event(seq: int) -> Event:
    change = Change(
        Kind.DEVICE_ADDED,
        Severity.INFO,
        f"{GPU} GPU-{seq} joined allocatable",
        {"resource": GPU, "device": f"GPU-{seq}", "numa": [0]},
    )
    return envelope(change, seq=seq, node=NODE, cycle=f"cycle-{seq}", before=None, after=None)


def _sinks(tmp: Path, table: dict[str, dict[str, Any]]) -> list[Sink]:
    """Sinks as the agent builds them: from the config's tables, through the registry."""
    settings = parse_settings({"state_dir": str(tmp), "sinks": table})
    return build_sinks(settings.sinks, node=NODE, state_dir=tmp, store=MemoryStore())


def _audit_table(log: Path, key_file: Path | None = None, **extra: Any) -> dict[str, Any]:
    table: dict[str, Any] = {"type": "file", "path": str(log), **extra}
    if key_file is not None:
        table["key_file"] = str(key_file)
    return table


async def _write(log: Path, seqs: range, key_file: Path | None = None) -> None:
    """The file sink writes these events (one batch each), then closes."""
    (sink,) = _sinks(log.parent, {"audit": _audit_table(log, key_file)})
    try:
        for seq in seqs:
            assert (await sink.deliver([_event(seq)])).delivered
    finally:
        await sink.close()


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_bytes().splitlines()]


def _verify(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main(["audit", "verify", *map(str, args)])
    return code, capsys.readouterr().out


def _rechain(log: Path, edit: int, key: bytes | None = None, through: int | None = None) -> str:
    """The attack on a hash chain: change record `edit`'s event and recompute every hash from there
    (to record `through`, or the end) with the public algorithm, under `key` if the attacker has
    one. Returns the last hash it computed."""
    out, last = [], ""
    for rec in _records(log):
        if rec["n"] == edit:
            rec["event"]["summary"] = "nothing happened"
        if edit <= rec["n"] <= (through or rec["n"]):
            prev = rec["prev"] if rec["n"] == edit else last
            line, last = make_record(rec["n"], prev, rec["event"], key)
        else:
            line = json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        out.append(line)
    log.write_text("\n".join(out) + "\n")
    return last


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.key"
    path.write_text(KEY + "\n")
    return path


# --- the head file: a cut tail ---


async def test_an_intact_log_verifies_against_its_head_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 6))
    head = Head.read(head_path(log))
    assert head is not None and (head.n, head.hash, head.mac) == (5, _records(log)[-1]["hash"], None)
    # Hidden, so `audit.jsonl*` globs (and log shippers) never take it for part of the log.
    assert head_path(log).name == ".audit.jsonl.head"
    assert sorted(p.name for p in tmp_path.glob("audit.jsonl*")) == ["audit.jsonl"]
    code, out = _verify(capsys, log)
    assert code == 0, out
    assert "OK: 5 records intact (records 1..5)" in out
    assert "matches the last record, 5" in out


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_cut_tail_fails_verify_through_the_head_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path, keyed: bool
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 7), key_file if keyed else None)
    keys = ["--key-file", key_file] if keyed else []
    assert _verify(capsys, log, *keys)[0] == 0
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:4]))  # records 5 and 6 deleted
    # Without the head file, the cut log is a perfectly good chain of 4 records.
    code, out = _verify(capsys, log, *keys)
    assert code == 1, out
    assert f"BROKEN: the log ends at record 4, but its head file {head_path(log)} says record 6 was " in out
    assert "records 5..6 were cut off" in out
    log.write_bytes(b"".join(lines[:5]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and "record 6 was cut off" in out, out


async def test_a_rewritten_head_hides_an_unkeyed_cut_but_not_a_keyed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    # Unkeyed, the head file is public too: rewrite it to the cut log's end and the cut passes.
    # Keyed, its MAC needs the key.
    for keyed in (False, True):
        log = tmp_path / f"{'keyed' if keyed else 'plain'}.jsonl"
        await _write(log, range(1, 7), key_file if keyed else None)
        lines = log.read_bytes().splitlines(keepends=True)
        log.write_bytes(b"".join(lines[:4]))
        head_path(log).write_text(Head(4, _records(log)[-1]["hash"]).to_line())
        keys = ["--key-file", key_file] if keyed else []
        code, out = _verify(capsys, log, *keys)
        if keyed:
            assert code == 1 and f"BROKEN: the head file {head_path(log)} is not keyed" in out, out
        else:
            assert code == 0, out


async def test_a_head_kept_elsewhere_is_checked_with_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A copy of the head taken off the node shows a cut even after the local head was rewritten.
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 7))
    copy = tmp_path / "elsewhere" / "head.json"
    copy.parent.mkdir()
    copy.write_bytes(head_path(log).read_bytes())
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:4]))
    head_path(log).write_text(Head(4, _records(log)[-1]["hash"]).to_line())
    assert _verify(capsys, log)[0] == 0
    code, out = _verify(capsys, log, "--head", copy)
    assert code == 1 and f"its head file {copy} says record 6 was written" in out, out
    # The local head may also be named among the files, as a `.NAME.head` glob would.
    code, out = _verify(capsys, log, head_path(log))
    assert code == 0 and f"the head file {head_path(log)} matches the last record, 4" in out, out


async def test_what_a_head_file_cannot_catch_an_older_head_put_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    # The documented limit: a copy of the head from when the log had 4 records, put back after
    # records 5 and 6 are deleted, matches the cut log, MAC and all. (Only a head kept elsewhere,
    # e.g. by a receiver of X-Audit-Head, shows this; see the --expect tests.)
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 5), key_file)
    old_head = head_path(log).read_bytes()
    await _write(log, range(5, 7), key_file)
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:4]))
    head_path(log).write_bytes(old_head)
    code, out = _verify(capsys, log, "--key-file", key_file)
    assert code == 0, out


async def test_records_after_an_older_head_are_accepted_and_named_as_not_covered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The agent stopped after writing records 5 and 6 but before replacing the head: no alarm.
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 5))
    old_head = head_path(log).read_bytes()
    await _write(log, range(5, 7))
    head_path(log).write_bytes(old_head)
    code, out = _verify(capsys, log)
    assert code == 0, out
    assert "names record 4: records 5..6 came after it was saved" in out


async def test_a_missing_head_file_is_noted_unkeyed_and_fails_keyed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    plain, keyed = tmp_path / "plain.jsonl", tmp_path / "keyed.jsonl"
    await _write(plain, range(1, 4))
    await _write(keyed, range(1, 4), key_file)
    head_path(plain).unlink()
    head_path(keyed).unlink()
    code, out = _verify(capsys, plain)
    assert code == 0 and "no head file" in out and "a cut tail would not be noticed" in out, out
    code, out = _verify(capsys, keyed, "--key-file", key_file)
    assert code == 1 and f"BROKEN: no head file {head_path(keyed)}" in out, out


async def test_the_sink_numbers_on_after_a_cut_so_the_gap_stays_visible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Once the sink writes again it replaces the head; numbering on from the old head keeps the
    # cut in the log itself, where verify still names it.
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 7))
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:4]))
    with capture_logs() as logs:
        await _write(log, range(7, 9))
    assert [r["n"] for r in _records(log)] == [1, 2, 3, 4, 7, 8]
    (error,) = [e for e in logs if e["event"].startswith("audit log does not end where its head")]
    assert (error["log_ends_at"], error["head_says"], error["log_level"]) == (4, 6, "error")
    code, out = _verify(capsys, log)
    assert code == 1 and f"BROKEN: records 5..6 missing before {log}:5" in out, out


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_deleted_middle_record_is_a_gap_naming_the_missing_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path, keyed: bool
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 9), key_file if keyed else None)
    keys = ["--key-file", key_file] if keyed else []
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:3] + lines[4:]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and f"BROKEN: record 4 missing before {log}:4" in out, out
    log.write_bytes(b"".join(lines[:3] + lines[6:]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and f"BROKEN: records 4..6 missing before {log}:4" in out, out


async def test_rotated_out_files_are_not_detected_the_count_just_starts_later(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What rotation does (and anyone can do to the oldest file) is no break in the chain.
    log = tmp_path / "audit.jsonl"
    (sink,) = _sinks(tmp_path, {"audit": _audit_table(log, max_bytes=1024, keep=50)})
    for seq in range(1, 13):
        assert (await sink.deliver([_event(seq)])).delivered
    await sink.close()
    files = sorted(tmp_path.glob("audit.jsonl*"))
    oldest = max(files, key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    assert len(files) >= 3
    gone = len(_records(oldest))
    oldest.unlink()
    files.remove(oldest)
    code, out = _verify(capsys, *files)
    assert code == 0 and f"OK: {12 - gone} records intact (records {gone + 1}..12)" in out, out


async def test_the_head_is_saved_only_once_the_records_are_on_disk(tmp_path: Path) -> None:
    # fsync = "interval": records written but not yet fsynced must not be in the head, or a crash
    # that lost them would read as a cut log.
    log = tmp_path / "audit.jsonl"
    (sink,) = _sinks(tmp_path, {"audit": _audit_table(log, fsync="interval", fsync_interval=3600)})
    assert (await sink.deliver([_event(1), _event(2)])).delivered
    assert len(_records(log)) == 2 and not head_path(log).exists()
    await sink.close()  # fsyncs, then saves the head
    head = Head.read(head_path(log))
    assert head is not None and head.n == 2


# --- gap records: events the queue's caps dropped ---


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_gap_record_is_chained_like_any_record_and_verify_reports_gaps_not_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path, keyed: bool
) -> None:
    log = tmp_path / "audit.jsonl"
    table = {"audit": _audit_table(log, key_file if keyed else None)}
    (sink,) = _sinks(tmp_path, table)
    assert isinstance(sink, GapRecorder)
    gap = Gap(4, 9, 5, ("max_queue", "max_age"), "2027-01-01T00:00:00.000Z")
    assert (await sink.deliver([_event(1), _event(2), _event(3)])).delivered
    assert (await sink.record_gap(gap)).delivered
    await sink.close()
    # Restarted with the gap record last: the log covers seq 9, so a re-sent 9 is not written again.
    (sink,) = _sinks(tmp_path, table)
    assert (await sink.deliver([_event(9), _event(10)])).delivered
    await sink.close()
    records = _records(log)
    assert [r["n"] for r in records] == [1, 2, 3, 4, 5]
    assert records[3]["gap"] == gap.to_dict()
    assert records[4]["prev"] == records[3]["hash"] and records[4]["event"]["seq"] == 10
    keys = ["--key-file", key_file] if keyed else []
    code, out = _verify(capsys, log, *keys)
    assert code == 3, out
    assert out.startswith(
        "GAPS: 5 records intact (records 1..5), but 1 gap record(s): 5 event(s) were dropped"
    )
    assert (
        f"gap: record 4 at {log}:4: seq 4..9: 5 events dropped by the queue's caps (max_queue, max_age)"
        in out
    )
    # The gap record is part of the chain: editing it or deleting it is caught like any record.
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([*lines[:3], lines[3].replace(b'"dropped":5', b'"dropped":1'), *lines[4:]]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and f"BROKEN: record 4 at {log}:4 " in out, out
    log.write_bytes(b"".join([*lines[:3], *lines[4:]]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and f"BROKEN: record 4 missing before {log}:4" in out, out
    # A record that is neither an event's nor a gap's is no record.
    both = json.loads(lines[3])
    both["event"] = records[0]["event"]
    log.write_bytes(b"".join([*lines[:3], json.dumps(both).encode() + b"\n", *lines[4:]]))
    code, out = _verify(capsys, log, *keys)
    assert code == 1 and f"record 4 is broken at {log}:4: not a valid record" in out, out


# --- the keyed chain: re-chaining ---


async def test_a_rechained_log_passes_unkeyed_but_fails_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    plain, keyed = tmp_path / "plain.jsonl", tmp_path / "keyed.jsonl"
    await _write(plain, range(1, 7))
    await _write(keyed, range(1, 7), key_file)
    assert {r["hash"].split(":")[0] for r in _records(keyed)} == {"hmac-sha256"}
    assert _verify(capsys, keyed, "--key-file", key_file)[0] == 0

    # Unkeyed: record 3 edited, 3..6 re-chained. The head file alone still shows it...
    last = _rechain(plain, edit=3)
    code, out = _verify(capsys, plain)
    assert code == 1 and "record 6 does not match the head file" in out, out
    # ...until it is rewritten too: then nothing can tell (SHA-256 is public).
    head_path(plain).write_text(Head(6, last).to_line())
    code, out = _verify(capsys, plain)
    assert code == 0 and "OK: 6 records intact" in out, out

    # Keyed, re-chained with the public algorithm and the head rewritten to match: a downgrade.
    last = _rechain(keyed, edit=3)
    head_path(keyed).write_text(Head(6, last).to_line())
    code, out = _verify(capsys, keyed, "--key-file", key_file)
    assert code == 1, out
    assert (
        f"BROKEN: record 3 at {keyed}:3 is not keyed, but record 1 before it is: the log was downgraded"
        in out
    )
    # Re-chained as HMACs under a guessed key, head MAC'd with it: the MACs do not match.
    guess = b"not-the-key-0123456789"
    last = _rechain(keyed, edit=3, key=guess)
    head_path(keyed).write_text(Head.keyed(6, last, guess).to_line())
    code, out = _verify(capsys, keyed, "--key-file", key_file)
    assert code == 1 and f"BROKEN: record 3 at {keyed}:3 does not match its MAC under the key" in out, out


async def test_a_keyed_log_rewritten_wholly_unkeyed_fails_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 5), key_file)
    last = _rechain(log, edit=1)
    head_path(log).write_text(Head(4, last).to_line())
    assert _verify(capsys, log)[0] == 0  # a flawless unkeyed log, to anyone without the key
    code, out = _verify(capsys, log, "--key-file", key_file)
    assert code == 1 and "BROKEN: none of the 4 records is keyed" in out, out


async def test_a_keyed_log_without_the_key_is_not_verified_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 4), key_file)
    code, out = _verify(capsys, log)
    assert code == 1, out
    assert "NOT VERIFIED: records 1..3 are keyed (hmac-sha256): only --key-file can check them" in out
    # One byte of an event changed, nothing recomputed: its MAC no longer matches.
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([lines[0], lines[1].replace(b"GPU-2", b"GPU-9"), lines[2]]))
    code, out = _verify(capsys, log, "--key-file", key_file)
    assert code == 1 and f"BROKEN: record 2 at {log}:2 does not match its MAC under the key" in out, out
    log.write_bytes(b"".join(lines))
    wrong = tmp_path / "wrong.key"
    wrong.write_text("another-key-0123456789abcdef")
    code, out = _verify(capsys, log, "--key-file", wrong)
    assert code == 1 and f"BROKEN: record 1 at {log}:1 does not match its MAC under the key" in out, out
    # While a key is being replaced, both may be given.
    code, out = _verify(capsys, log, "--key-file", wrong, "--key-file", key_file)
    assert code == 0, out


async def test_a_key_added_to_an_unkeyed_log_covers_what_came_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key_file: Path
) -> None:
    log = tmp_path / "audit.jsonl"
    await _write(log, range(1, 4))
    await _write(log, range(4, 7), key_file)
    assert [r["hash"].split(":")[0] for r in _records(log)] == ["sha256"] * 3 + ["hmac-sha256"] * 3
    code, out = _verify(capsys, log, "--key-file", key_file)
    assert code == 0, out
    assert "records 1..3 came before the key was set (unkeyed); keyed record 4 chains to them" in out
    # Editing an unkeyed record before the key, even re-chained up to it, breaks keyed record 4's
    # link to them: changing that link would need the key.
    _rechain(log, edit=2, through=3)
    code, out = _verify(capsys, log, "--key-file", key_file)
    assert code == 1 and f"BROKEN: record 4 at {log}:4 does not chain to record 3" in out, out


async def test_an_unreadable_key_writes_nothing_rather_than_unkeyed_records(
    tmp_path: Path, key_file: Path
) -> None:
    log = tmp_path / "audit.jsonl"
    (sink,) = _sinks(tmp_path, {"audit": _audit_table(log, key_file)})
    try:
        assert (await sink.deliver([_event(1)])).delivered
        key_file.unlink()
        outcome = await sink.deliver([_event(2)])
        assert outcome.retry and not outcome.delivered and "key" in outcome.error
        assert [r["n"] for r in _records(log)] == [1]
        key_file.write_text(KEY)
        assert (await sink.deliver([_event(2)])).delivered
    finally:
        await sink.close()
    assert all(r["hash"].startswith("hmac-sha256:") for r in _records(log))


def test_a_short_key_is_a_config_error(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too-short")
    with pytest.raises(ConfigError, match=r"^sinks.audit.key: the key from file .* is shorter than 16"):
        parse_settings({"sinks": {"audit": _audit_table(tmp_path / "a.jsonl", short)}})


# --- the remote head: X-Audit-Head and --expect ---


def test_audit_head_must_name_a_file_sink(tmp_path: Path) -> None:
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/hook", "audit_head": "console"}
    with pytest.raises(
        ConfigError, match=r"^sinks.hook.audit_head: names no file sink; expected the name of a file sink"
    ):
        parse_settings({"sinks": {"hook": hook, "console": {"type": "stdout"}}})


async def test_the_webhook_carries_the_audit_head_and_expect_catches_a_rewrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    async with WebhookReceiver() as receiver:
        hook = {"type": "webhook", "url": receiver.url("/hook"), "audit_head": "audit"}
        audit, webhook = _sinks(tmp_path, {"audit": _audit_table(log), "hook": hook})
        try:
            assert (await webhook.deliver([_event(1)])).delivered  # no record yet: no header
            for seq in range(1, 5):
                assert (await audit.deliver([_event(seq)])).delivered
                assert (await webhook.deliver([_event(seq)])).delivered
        finally:
            await audit.close()
            await webhook.close()
    heads = [r.headers.get("x-audit-head") for r in receiver.requests]
    assert heads[0] is None
    assert heads[1:] == [f"audit;n={r['n']};hash={r['hash']}" for r in _records(log)]
    reported = heads[3]  # record 3's head, as the receiver kept it
    assert reported is not None
    n3 = _records(log)[2]
    code, out = _verify(capsys, log, "--expect", reported, "--expect", f"4:{_records(log)[3]['hash']}")
    assert code == 0 and "record 3 has the hash reported earlier" in out, out

    # Record 2 edited, the chain and head recomputed: to the log alone it is intact...
    last = _rechain(log, edit=2)
    head_path(log).write_text(Head(4, last).to_line())
    assert _verify(capsys, log)[0] == 0
    # ...but not to what the receiver was told.
    code, out = _verify(capsys, log, "--expect", reported)
    assert code == 1, out
    assert (
        f"BROKEN: record 3 has hash {_records(log)[2]['hash']}, not {n3['hash']} as reported earlier" in out
    )
    code, out = _verify(capsys, log, "--expect", f"9:{n3['hash']}")
    assert code == 1 and "record 9 (--expect) is not in the files given (records 1..4)" in out, out


def test_expect_takes_n_colon_hash_or_a_header_value_and_refuses_anything_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("")
    for bad in ("3", "x:sha256:ab", "0:sha256:ab", "audit;n=;hash=sha256:ab", "²:sha256:ab"):
        with pytest.raises(SystemExit) as exit_info:
            main(["audit", "verify", str(log), "--expect", bad])
        assert exit_info.value.code == 2
        assert "is not N:HASH" in capsys.readouterr().err


def test_record_hash_is_the_documented_algorithm() -> None:
    # The format is public on purpose (anyone may verify); these pin it.
    import hashlib
    import hmac

    event = {"seq": 1}
    canonical = b'{"event":{"seq":1},"n":1,"prev":"sha256:' + b"0" * 64 + b'"}'
    prev = "sha256:" + "0" * 64
    assert record_hash(1, prev, event) == "sha256:" + hashlib.sha256(canonical).hexdigest()
    key = KEY.encode()
    assert record_hash(1, prev, event, key) == "hmac-sha256:" + hmac.new(key, canonical, "sha256").hexdigest()
    assert os.path.basename(head_path(Path("/x/audit.jsonl"))) == ".audit.jsonl.head"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@FAST
@given(
    event=st.dictionaries(st.text(max_size=8), _JSON, max_size=6),
    n=st.integers(min_value=1, max_value=2**63),
    prev=st.text(max_size=80),
    key=st.none() | st.binary(min_size=32, max_size=32),
)
def test_a_record_is_the_canonical_json_of_its_fields_hashed_as_documented(
    event: dict[str, Any], n: int, prev: str, key: bytes | None
) -> None:
    """make_record splices its line around one encoding of the event: it must be byte for byte the
    canonical JSON of the whole record, its hash that of the record without `hash`."""
    line, digest = make_record(n, prev, event, key)
    assert digest == record_hash(n, prev, event, key)
    assert line.encode() == canonical_json({"n": n, "prev": prev, "event": event, "hash": digest})
    gap = Gap(first=1, last=n, count=n, reasons=("max_queue", prev), time=prev)
    gap_line, gap_digest = make_gap_record(n, prev, gap, key)
    body = {"n": n, "prev": prev, "gap": gap.to_dict()}
    assert gap_digest == chain_hash(body, key)
    assert gap_line.encode() == canonical_json({**body, "hash": gap_digest})
