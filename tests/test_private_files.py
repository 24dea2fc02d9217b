"""Files the agent writes are private whatever the umask, never written through a symbolic link,
and a secret file others may read is warned about (at start and in check-config)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.permissions import mode
from watcher.app import Agent
from watcher.cli import main
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.secrets import Secret
from watcher.settings import Settings
from watcher.settings_file import config_warnings, parse_settings
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.send_test import MemoryStore
from watcher.sinks.audit import verify_files
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.registry import build_sink
from watcher.sinks.webhook import WebhookSinkSettings

GPU = "nvidia.com/gpu"


def event(seq: int) -> Event:
    change = Change(Kind.DEVICE_ADDED, Severity.INFO, f"{GPU} GPU-{seq} joined", {"resource": GPU})
    return envelope(change, seq=seq, node="node-a", cycle=f"c{seq}", before=None, after=None)


def logged(logs: list[dict[str, object]], start: str) -> list[dict[str, object]]:
    return [e for e in logs if str(e.get("event", "")).startswith(start)]


# --- modes ---


def _with_audit_log(short_tmp: Path) -> tuple[FakeKubelet, Settings]:
    """A fake kubelet, and settings whose only sink is an audit log in the state dir that
    rotates after a few records."""
    settings = make_settings(short_tmp)
    sink = FileSinkSettings(name="audit", path=settings.state_dir / "audit.jsonl", max_bytes=1024)
    return FakeKubelet(short_tmp / "kubelet", seed=3), dataclasses.replace(settings, sinks=(sink,))


@pytest.mark.usefixtures("umask_022")
async def test_state_dir_outbox_and_audit_log_are_private_after_the_agent_wrote_them(
    short_tmp: Path,
) -> None:
    fake, settings = _with_audit_log(short_tmp)
    state = settings.state_dir
    audit = state / "audit.jsonl"
    rotated = audit.with_name("audit.jsonl.1")

    def written() -> bool:
        # The head file is replaced after the records it names are on disk: wait for it too.
        logs = list(state.glob("audit.jsonl*"))
        return rotated.exists() and (state / ".audit.jsonl.head").exists() and verify_files(logs).records == 3

    async with fake, running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        fake.add_device(GPU, "GPU-new", (0,))
        await run.recorder.kinds_after(1, 2)
        # Written and rotated: every record of the run is in the log and its rotated files.
        await run.recorder.until(written)
        # While the agent runs, SQLite's -wal and -shm exist beside the database.
        outbox = {p.name: mode(p) for p in state.glob("outbox.db*")}
        assert set(outbox) == {"outbox.db", "outbox.db-wal", "outbox.db-shm"}
        assert outbox == dict.fromkeys(outbox, 0o600)
    assert mode(state) == 0o700
    logs = sorted(state.glob("audit.jsonl*"))
    assert len(logs) >= 2 and {mode(p) for p in logs} == {0o600}, logs
    assert mode(state / ".audit.jsonl.head") == 0o600  # the head file beside it too
    # Under the same umask, what the agent did not make private comes out 0644: the test's
    # umask really was the loose one.
    (state / "probe").write_text("")
    assert mode(state / "probe") == 0o644


def _both_logs_verify(audit: Path) -> bool:
    """The current log and the rotated one verify; False while the current one is not there (a
    rotation may rename it between a look and the read: that is "not yet", not a failure)."""
    try:
        return audit.exists() and verify_files([audit, audit.with_name("audit.jsonl.1")]).ok
    except FileNotFoundError:
        return False


@pytest.mark.usefixtures("umask_022")
async def test_an_open_state_dir_and_loose_files_from_before_are_tightened_and_logged(
    short_tmp: Path,
) -> None:
    fake, settings = _with_audit_log(short_tmp)
    state = settings.state_dir
    audit = state / "audit.jsonl"
    async with fake:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
            fake.add_device(GPU, "GPU-new", (0,))
            await run.recorder.kinds_after(1, 2)
            await run.recorder.until(lambda: audit.with_name("audit.jsonl.1").exists())
        # As an older version (or a hand-made directory) left them.
        os.chmod(state, 0o755)
        loose = [p for p in state.iterdir() if p.is_file()]
        assert {p.name for p in loose} >= {"outbox.db", "audit.jsonl", "audit.jsonl.1"}
        for path in loose:
            os.chmod(path, 0o644)
        with capture_logs() as logs:
            async with running_agent(settings, fake) as run:
                await run.recorder.kinds_after(0, 1)
                # The current log may not exist yet (it is opened at the first write after the
                # rotation): waiting for it is part of waiting for the agent to write.
                await run.recorder.until(lambda: _both_logs_verify(audit))
                await run.quiet_cycle()
    assert mode(state) == 0o700
    for path in state.iterdir():
        assert mode(path) == 0o600, path
    assert [
        e["path"] for e in logged(logs, "the state directory was open to group or others: set to 0700")
    ] == [str(state)]
    fixed = {e["path"] for e in logs if str(e["event"]).endswith("was open to group or others: set to 0600")}
    assert fixed >= {str(state / "outbox.db"), str(audit), str(audit.with_name("audit.jsonl.1"))}


async def test_a_new_empty_state_dir_made_open_by_a_hostpath_is_tightened_without_a_warning(
    short_tmp: Path,
) -> None:
    # A hostPath `DirectoryOrCreate` volume (the shipped DaemonSet's) hands every new node's agent an
    # empty 0755 directory: nothing was exposed, so no warning, and still 0700 afterwards.
    fake, settings = _with_audit_log(short_tmp)
    settings.state_dir.mkdir(parents=True)
    os.chmod(settings.state_dir, 0o755)
    with capture_logs() as logs:
        async with fake, running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
    assert mode(settings.state_dir) == 0o700
    told = logged(logs, "the new, empty state directory was open to group or others: set to 0700")
    assert [(e["log_level"], e["was"]) for e in told] == [("info", "0755")]
    assert not [e for e in logs if e["log_level"] == "warning"], logs


async def test_an_empty_state_dir_others_could_write_still_warns(short_tmp: Path) -> None:
    # Empty is no proof when others may write there: they could have emptied it themselves.
    fake, settings = _with_audit_log(short_tmp)
    settings.state_dir.mkdir(parents=True)
    os.chmod(settings.state_dir, 0o777)
    with capture_logs() as logs:
        async with fake, running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
    assert mode(settings.state_dir) == 0o700
    told = logged(logs, "the state directory was open to group or others: set to 0700")
    assert [(e["log_level"], e["was"]) for e in told] == [("warning", "0777")]


# --- symbolic links ---


async def test_a_symlinked_audit_log_is_refused_and_its_target_is_untouched(short_tmp: Path) -> None:
    target = short_tmp / "precious.txt"
    # No newline at the end: the torn-tail repair would have cut this line off the target.
    original = b"root:x:0:0:root:/root:/bin/bash\nthe last line, without a newline"
    target.write_bytes(original)
    os.chmod(target, 0o644)
    audit = short_tmp / "state" / "audit.jsonl"
    audit.parent.mkdir()
    audit.symlink_to(target)
    settings = FileSinkSettings(name="audit", path=audit)
    sink = build_sink(settings, node="node-a", state_dir=short_tmp / "state", store=MemoryStore())
    try:
        outcome = await sink.deliver([event(1)])
        # Retried, not dead-lettered: the event waits until the operator replaces the link.
        assert outcome.retry and not outcome.delivered
        assert outcome.error.startswith(f"refusing to write the audit log {audit}: it is a symbolic link")
        assert str(target) in outcome.error and "replace the link with a regular file" in outcome.error
        assert (await sink.deliver([event(1)])).error == outcome.error  # and again, the same
        assert target.read_bytes() == original
        assert mode(target) == 0o644
        assert audit.is_symlink()

        audit.unlink()  # the operator's fix: the queued event is written, whole
        assert (await sink.deliver([event(1)])).delivered
    finally:
        await sink.close()
    assert verify_files([audit]).records == 1
    assert target.read_bytes() == original


async def test_a_symlinked_rotated_audit_log_is_refused_too(short_tmp: Path) -> None:
    target = short_tmp / "precious.txt"
    target.write_bytes(b"keep me\n")
    audit = short_tmp / "audit.jsonl"
    audit.with_name("audit.jsonl.2").symlink_to(target)
    sink = build_sink(
        FileSinkSettings(name="audit", path=audit), node="n", state_dir=short_tmp, store=MemoryStore()
    )
    try:
        outcome = await sink.deliver([event(1)])
    finally:
        await sink.close()
    assert outcome.retry
    assert f"rotated audit log {audit.with_name('audit.jsonl.2')}: it is a symbolic link" in outcome.error
    assert target.read_bytes() == b"keep me\n"


@pytest.mark.parametrize("name", ["outbox.db", "outbox.db-wal", "outbox.db-shm"])
async def test_a_symlinked_outbox_database_is_refused_before_sqlite_opens_it(
    short_tmp: Path, capfd: pytest.CaptureFixture[str], name: str
) -> None:
    target = short_tmp / "precious.db"
    original = b"not yours to overwrite\n" * 10
    target.write_bytes(original)
    state = short_tmp / "state"
    state.mkdir()
    (state / name).symlink_to(target)
    agent = Agent(make_settings(short_tmp))
    try:
        with capture_logs() as logs:
            assert await agent.open() is False
    finally:
        await agent.close()
    (failed,) = logged(logs, "cannot open the outbox")
    assert f"{state / name}: it is a symbolic link (to {target})" in str(failed["error"])
    assert target.read_bytes() == original
    assert (state / name).is_symlink()
    assert sorted(p.name for p in state.iterdir()) == [name]  # nothing was created beside it

    # The outbox command exits 1 too: naming the link in one line (beside a linked -wal or -shm
    # alone it finds no database to open), and leaving the target as it was.
    assert main(["outbox", "list", "--state-dir", str(state)]) == 1
    err = capfd.readouterr().err
    if name == "outbox.db":
        (line,) = err.splitlines()
        assert line.startswith(
            f"pod-resources-watcher: error: refusing to write the outbox database {state / name}"
        )
    assert target.read_bytes() == original


# --- secret files others may read ---


def test_check_config_warns_about_a_secret_file_others_may_read(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "routing_key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    os.chmod(key, 0o644)
    config = tmp_path / "w.toml"
    config.write_text(f'[sinks.pager]\ntype = "pagerduty"\nrouting_key_file = "{key}"\n')
    assert main(["check-config", str(config)]) == 0  # a warning, not an error
    out, err = capfd.readouterr()
    assert err.splitlines() == [
        f"pod-resources-watcher: WARNING: sinks.pager.routing_key_file: secret file {key} is open to group "
        f"or others (mode 0644): chmod 600 {key} (the agent only reads it)"
    ]
    assert f"{config}: OK" in out

    os.chmod(key, 0o600)
    assert main(["check-config", str(config)]) == 0
    assert capfd.readouterr().err == ""


async def test_the_agent_warns_at_start_about_a_secret_file_others_may_read(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    token = short_tmp / "token"
    token.write_text("bearer-token-0123456789\n")
    os.chmod(token, 0o640)
    hook = WebhookSinkSettings(
        name="hook",
        url=Secret(value="http://127.0.0.1:9/"),
        bearer_token=Secret(file=token),
        kinds=("no.such.kind",),  # nothing is sent: only the warning matters here
    )
    fake = await start_kubelet(seed=3)
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(settings, sinks=(*settings.sinks, hook))
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
    (warning,) = logged(logs, "a secret is less private than it should be")
    assert warning["log_level"] == "warning"
    assert warning["problem"] == (
        f"sinks.hook.bearer_token_file: secret file {token} is open to group or others (mode 0640): "
        f"chmod 600 {token} (the agent only reads it)"
    )
    assert logs.index(warning) < logs.index(logged(logs, "watcher starting")[0])


def test_check_config_warns_about_a_private_key_others_may_read(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A TLS private key is a secret in itself, though its setting is a plain path.
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_text("certificate\n")
    key.write_text("private key\n")
    os.chmod(cert, 0o644)  # a certificate is public: no warning
    os.chmod(key, 0o644)
    config = tmp_path / "w.toml"
    config.write_text(
        '[sinks.hook]\ntype = "webhook"\nurl = "https://127.0.0.1:9/"\n'
        f'cert_file = "{cert}"\nkey_file = "{key}"\n'
    )
    assert main(["check-config", str(config)]) == 0
    assert capfd.readouterr().err.splitlines() == [
        f"pod-resources-watcher: WARNING: sinks.hook.key_file: secret file {key} is open to group "
        f"or others (mode 0644): chmod 600 {key} (the agent only reads it)"
    ]
    os.chmod(key, 0o600)
    assert main(["check-config", str(config)]) == 0
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("name", ["audit.jsonl", ".audit.jsonl.head.tmp"])
async def test_a_hard_linked_audit_file_is_refused_and_its_target_is_untouched(
    short_tmp: Path, name: str
) -> None:
    # O_NOFOLLOW stops symbolic links only; a hard link to a file elsewhere would have the agent
    # cut, chmod, truncate or append to that file just the same.
    target = short_tmp / "precious.txt"
    original = b"root:x:0:0:root:/root:/bin/bash\nthe last line, without a newline"
    target.write_bytes(original)
    os.chmod(target, 0o644)
    state = short_tmp / "state"
    state.mkdir()
    os.link(target, state / name)
    audit = state / "audit.jsonl"
    sink = build_sink(
        FileSinkSettings(name="audit", path=audit), node="n", state_dir=state, store=MemoryStore()
    )
    try:
        outcome = await sink.deliver([event(1)])
    finally:
        await sink.close()
    assert outcome.retry and not outcome.delivered
    assert f"{state / name}: it has 2 names (hard links)" in outcome.error
    assert target.read_bytes() == original
    assert mode(target) == 0o644


@pytest.mark.parametrize(
    ("listen", "tls", "warned"),
    [("10.1.2.3:9108", False, True), ("127.0.0.1:9108", False, False), ("10.1.2.3:9108", True, False)],
)
def test_check_config_warns_about_an_inventory_token_sent_in_clear_text(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], listen: str, tls: bool, warned: bool
) -> None:
    token = tmp_path / "token"
    token.write_text("inventory-token-0123456789\n")
    os.chmod(token, 0o600)
    config = tmp_path / "w.toml"
    # A certificate that does not load is a config error, so the TLS case sets the files and
    # is checked through the warnings alone (config_warnings), not through check-config.
    text = f'[http]\nlisten = "{listen}"\ninventory = true\ninventory_token_file = "{token}"\n'
    if not tls:
        config.write_text(text)
        assert main(["check-config", str(config)]) == 0
        err = capfd.readouterr().err
        assert ("the token travels in clear text to 10.1.2.3" in err) is warned, err
        return
    settings = parse_settings(tomllib.loads(text))
    https = dataclasses.replace(
        settings.http, tls_cert_file=tmp_path / "c.pem", tls_key_file=tmp_path / "k.pem"
    )
    assert config_warnings(dataclasses.replace(settings, http=https)) == []


def test_a_short_inventory_token_is_a_config_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("short\n")
    os.chmod(token, 0o600)
    config = tmp_path / "w.toml"
    config.write_text(f'[http]\ninventory = true\ninventory_token_file = "{token}"\n')
    assert main(["check-config", str(config)]) == 2
    err = capfd.readouterr().err
    assert "http.inventory_token: shorter than 16 characters" in err and "short" not in err.replace(
        "shorter", ""
    )
