"""The state directory is made 0700 only when it is the agent's (issue 26): a system directory is a
config error, and an existing directory that holds other programs' files is left as it is, so a
`state_dir` pointed at a shared directory cannot lock other services out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from testkit.permissions import mode
from watcher.config import ConfigError
from watcher.settings_file import parse_settings


@pytest.mark.parametrize(
    "state_dir",
    ["/", "/var/lib", "/var/lib/", "/var//lib", "/etc", "/usr/local", "/var/lib/kubelet/pods", "/proc/1"],
)
def test_a_system_directory_as_state_dir_is_a_config_error(state_dir: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"state_dir": state_dir})
    message = str(caught.value)
    assert message.startswith("state_dir: a system directory"), message
    assert state_dir not in message


def test_a_link_to_a_system_directory_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "state").symlink_to("/var/lib")
    with pytest.raises(ConfigError, match=r"^state_dir: a system directory"):
        parse_settings({"state_dir": str(tmp_path / "state")})
    # Its own directory, and a relative one, are fine.
    assert (
        parse_settings({"state_dir": "/var/lib/pod-resources-watcher"}).state_dir.name
        == "pod-resources-watcher"
    )
    assert (
        parse_settings({"state_dir": "state"}, base_dir=tmp_path / "etc").state_dir == tmp_path / "etc/state"
    )


@pytest.mark.usefixtures("umask_022")
async def test_an_open_directory_holding_others_files_is_left_as_it_is(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """0755 with another service's files in it (as /var/lib is): the agent's own files are private,
    the directory keeps its mode, and the log says why."""
    settings = make_settings(short_tmp)
    state = settings.state_dir
    state.mkdir(parents=True)
    os.chmod(state, 0o755)
    (state / "other-service.db").write_text("theirs")
    fake = await start_kubelet(seed=3)
    with capture_logs() as logs:
        async with running_agent(settings, fake) as run:
            await run.recorder.kinds_after(0, 1)
    assert mode(state) == 0o755
    assert mode(state / "outbox.db") == 0o600
    assert (state / "other-service.db").read_text() == "theirs"
    (warning,) = [e for e in logs if "holds files that are not the agent's" in str(e.get("event"))]
    assert warning["path"] == str(state) and warning["mode"] == "0755"


@pytest.mark.usefixtures("umask_022")
async def test_an_empty_open_directory_or_one_with_the_outbox_is_tightened(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    """Empty, as the kubelet's hostPath DirectoryOrCreate makes it (0755), or holding the agent's
    outbox from before: the agent's, so made 0700."""
    settings = make_settings(short_tmp)
    state = settings.state_dir
    state.mkdir(parents=True)
    os.chmod(state, 0o755)
    fake = await start_kubelet(seed=3)
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
    assert mode(state) == 0o700
    os.chmod(state, 0o755)
    (state / "notes.txt").write_text("the agent's outbox is here too")
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
    assert mode(state) == 0o700
