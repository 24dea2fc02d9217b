"""Filesystems that really fill up or fail: a disk filled to the last block, a small tmpfs, and an
ext4 image the kernel takes read-only as after an I/O error. Mounting needs root: the tests that
need it are skipped elsewhere."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.tools import tool

__all__ = ["FailingDisk", "failing_disk", "fill", "tmpfs"]


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
def tmpfs(path: Path, options: str) -> Iterator[Path]:
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

    def _trigger(self) -> Path:
        return Path("/sys/fs/ext4") / Path(self._device()).name / "trigger_fs_error"

    def fail(self) -> None:
        self._trigger().write_text("pod-resources-watcher test\n")

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


@contextlib.contextmanager
def failing_disk(path: Path) -> Iterator[FailingDisk]:
    """A `FailingDisk` mounted on `path` (a 32 MiB image beside it) until the block ends; the test is
    skipped without root, loop devices, mkfs.ext4 or a kernel that can inject an ext4 error."""
    if os.geteuid() != 0:
        pytest.skip("needs root (loop devices and mount)")
    mkfs = tool("mkfs.ext4")
    disk = FailingDisk(path, path.with_name(path.name + ".img"))
    disk.path.mkdir()
    with open(disk.image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run([mkfs, "-q", "-F", str(disk.image)], check=True, capture_output=True)
    try:
        disk.mount()
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot loop-mount an image here: {err.stderr.decode().strip()}")
    if not disk._trigger().exists():
        subprocess.run(["umount", "-l", str(disk.path)], check=False)
        pytest.skip("this kernel cannot inject an ext4 error")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk.path)], check=False)
