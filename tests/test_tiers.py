"""The fast tier is computed (testkit/tiers.py): what it reads as reaching outside the test process,
what it does not, and the check at run time that catches what reading missed."""

from __future__ import annotations

import _posixsubprocess
import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import tiers

TESTS = Path(__file__).resolve().parent
CONFTEST = TESTS / "conftest.py"


def test_conftests_servers_and_programs_are_outside_and_its_plain_fixtures_are_not() -> None:
    outside = tiers.outside_defs(CONFTEST)
    # A fake kubelet (gRPC in this process), kubelet-lite (a Go peer), openssl, mount, the API server.
    assert {"kubelet", "start_kubelet", "kubelet_lite", "pki", "tiny_filesystem", "kube_cluster"} <= outside
    assert not {"short_tmp", "umask_022", "_fresh_logging", "_fast_stays_inside"} & outside


def _module(tmp_path: Path, source: str) -> Path:
    """A test module to read (a new name each time: what is read is kept by its path)."""
    path = tmp_path / f"test_example_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(source)
    return path


def test_a_test_is_outside_through_a_helper_a_fixture_or_a_process_call(tmp_path: Path) -> None:
    path = _module(
        tmp_path,
        "import os\nimport subprocess\nimport pytest\n"
        "from watcher.sim.fake_kubelet import FakeKubelet\n"
        "from watcher.settings import Settings\n"
        "def _helper():\n    return subprocess.run(['true'])\n"
        "def test_helper():\n    _helper()\n"
        "@pytest.fixture\ndef fake():\n    return FakeKubelet\n"
        "def test_fixture_user(fake):\n    pass\n"
        "def test_forks():\n    os.fork()\n"
        "def test_settings():\n    Settings()\n"
        "def test_plain():\n    assert 1 + 1 == 2\n",
    )
    outside = tiers.outside_defs(path)
    assert {"_helper", "test_helper", "fake", "test_forks"} <= outside
    # The fixture's user is judged by pytest's fixture closure (is_fast), not by its own code.
    assert not {"test_fixture_user", "test_settings", "test_plain"} & outside


def test_the_settings_naming_the_node_after_the_host_opens_no_socket() -> None:
    """watcher.settings imports socket for gethostname alone: its tests stay fast."""
    assert not tiers.is_outside_module("watcher.settings")
    assert tiers.is_outside_module("watcher.sim.fake_kubelet")  # gRPC
    assert tiers.is_outside_module("testkit.agent")  # the agent against a fake kubelet, at depth


def test_the_pure_cores_tests_are_all_fast() -> None:
    """A test module importing from the package only the pure core (watcher/model/), and no test
    support that reaches outside, holds no test the tier leaves out for reaching outside."""
    pure = []
    for path in sorted(TESTS.glob("test_*.py")):
        imported = tiers._facts(path).imported
        ours = [m for m in imported if m.split(".")[0] == "watcher"]
        support = [m for m in imported if m.split(".")[0] in tiers.SUPPORT and m != "testkit"]
        if (
            ours
            and all(m.startswith("watcher.model") for m in ours)
            and not any(map(tiers.is_outside_module, support))
        ):
            pure.append(path.name)
            tests = {n for n in tiers._facts(path).defs if n.startswith("test")}
            assert not tests & tiers.outside_defs(path), path.name
    assert len(pure) >= 3, pure


def test_a_module_of_only_outside_or_slow_tests_is_not_collected_for_the_fast_tier(tmp_path: Path) -> None:
    assert not tiers.may_hold_fast_tests(_module(tmp_path, "import pytest\npytestmark = pytest.mark.e2e\n"))
    slow = "import pytest\n@pytest.mark.slow\ndef test_a():\n    pass\n"
    assert not tiers.may_hold_fast_tests(_module(tmp_path, slow))
    assert tiers.may_hold_fast_tests(_module(tmp_path, slow + "def test_b():\n    pass\n"))


def test_processes_and_sockets_fail_inside_the_guard_and_are_given_back_after() -> None:
    before = (_posixsubprocess.fork_exec, os.fork, socket.socket.bind, socket.socket.connect)
    with tiers.forbid_outside("tests/test_x.py::test_y"):
        with pytest.raises(tiers.OutsideInFastTestError, match=r"test_x.py::test_y .*fork_exec"):
            subprocess.run([sys.executable, "-c", ""], check=False)
        with pytest.raises(tiers.OutsideInFastTestError, match="bind"), socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
        with pytest.raises(tiers.OutsideInFastTestError, match="fork_exec"):
            asyncio.run(asyncio.create_subprocess_exec(sys.executable, "-c", ""))
    assert (_posixsubprocess.fork_exec, os.fork, socket.socket.bind, socket.socket.connect) == before


def test_this_module_is_fast(request: pytest.FixtureRequest) -> None:
    """The tier marks itself: these tests read code and patch functions, nothing outside."""
    assert request.node.get_closest_marker("fast") is not None
