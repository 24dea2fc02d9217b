"""Shared fixtures: short socket directories, a running fake kubelet, a task-leak guard, and
certificates for TLS tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from watcher.sim.fake_kubelet import FakeKubelet


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="prw-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    """A fake kubelet serving the built-in node under `short_tmp`."""
    fake = FakeKubelet(short_tmp, seed=1234)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop(remove_socket=True)


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Tests that run the CLI in-process configure logging onto a stream pytest closes
    afterwards; put logging back so no test depends on which ran before it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    # Let cancelled tasks finish unwinding before judging.
    for _ in range(3):
        await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for t in leaked:
        t.cancel()
    assert not leaked, f"test leaked tasks: {leaked}"


# A secret planted in the test configs (URLs, tokens, signing secrets). It must never
# show up in anything a test captured: stdout, stderr or log records, across the suite.
PLANTED_SECRET = "plantedSecret-7f3a9c1e5b2d"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    leaked = [name for name, text in report.sections if PLANTED_SECRET in text]
    if leaked and report.passed:
        report.outcome = "failed"
        report.longrepr = f"the planted secret appeared in captured output: {', '.join(leaked)}"


# --- a filesystem that really fills up ---


def fill(path: Path) -> None:
    """Write zeros until the filesystem refuses: a full disk, to the last block."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 1):  # unbuffered, so nothing is left to fail at close
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on `path` (root only; the test is skipped where that is not possible)."""
    path.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tiny_filesystem(short_tmp: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs as the state directory: one that can really fill up."""
    with _tmpfs(short_tmp / "state", "size=2m") as path:
        yield path


@pytest.fixture
def read_only_state(short_tmp: Path) -> Iterator[Path]:
    """A read-only tmpfs as the state directory; `mount -o remount,rw` makes it writable."""
    with _tmpfs(short_tmp / "state", "ro,size=2m") as path:
        yield path


@dataclasses.dataclass
class FailingDisk:
    """An ext4 image mounted with errors=remount-ro: `fail()` makes the kernel take it read-only
    (as after an I/O error), `repair()` checks it and mounts it again in the same place."""

    path: Path
    image: Path

    def _device(self) -> str:
        found = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(self.path)], capture_output=True, text=True
        )
        return found.stdout.strip()

    def fail(self) -> None:
        trigger = Path("/sys/fs/ext4") / Path(self._device()).name / "trigger_fs_error"
        trigger.write_text("pod-resources-watcher test\n")

    def mount(self) -> None:
        subprocess.run(
            ["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.path)],
            check=True,
            capture_output=True,
        )

    def repair(self) -> None:
        # While the agent holds files on it, the failed filesystem lives on (detached), and
        # mounting its image again would bring back the same read-only instance. So the repair
        # is the image copied, checked and mounted in its place: a new disk with the old data.
        subprocess.run(["umount", "-l", str(self.path)], check=True)
        fresh = self.image.with_name(self.image.name + ".repaired")
        shutil.copyfile(self.image, fresh)
        subprocess.run(["e2fsck", "-fy", str(fresh)], check=False, capture_output=True)
        self.image = fresh
        self.mount()


@pytest.fixture
def failing_disk(short_tmp: Path) -> Iterator[FailingDisk]:
    """The state directory on a disk that can fail under the agent (root, loop devices, ext4)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4")
    disk = FailingDisk(short_tmp / "state", short_tmp / "state.img")
    disk.path.mkdir()
    with open(disk.image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(disk.image)], check=True, capture_output=True)
    try:
        disk.mount()
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot loop-mount an image here: {err.stderr.decode().strip()}")
    if not (Path("/sys/fs/ext4") / Path(disk._device()).name / "trigger_fs_error").exists():
        subprocess.run(["umount", "-l", str(disk.path)], check=False)
        pytest.skip("this kernel cannot inject an ext4 error")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk.path)], check=False)


# --- certificates (the `openssl` command) ---


def _openssl(cwd: Path, *args: str) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate from it; and a client
    certificate from another CA."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):  # .ci/run installs it: a skip there would hide a lost test
            pytest.fail("the openssl command is not installed (.ci/run should have installed it)")
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl(
            d,
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.crt",
            "-subj",
            f"/CN={ca}",
            "-days",
            "2",
        )
    for name, ca, ext in (
        ("server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "ca", "extendedKeyUsage=clientAuth\n"),
        ("rogue", "other-ca", "extendedKeyUsage=clientAuth\n"),
    ):
        _openssl(d, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(ext)
        _openssl(
            d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return d
