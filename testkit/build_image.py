"""`make image`: the agent's OCI image, built without a container engine, reproducibly.

The same image deploy/Dockerfile describes (the venv at /opt/pod-resources-watcher, the config at
/etc/pod-resources-watcher/config.toml, the same ENV, USER, EXPOSE, STOPSIGNAL, ENTRYPOINT, CMD and
labels), from a smaller base: a Debian bookworm root filesystem from mmdebstrap (the Essential set,
python3 and ca-certificates; no apt, no docs, man pages or locales) instead of python:3.11-slim.
umoci packs it into an OCI image layout, written as an OCI archive:

    .build/image/pod-resources-watcher-<tag>.oci.tar    (ctr -n k8s.io images import FILE)

Reproducible: two builds of one commit give the same manifest digest, as long as the Debian mirror
serves the same packages (it moves with point releases and security updates; the packages list
written beside the archive says which were used). SOURCE_DATE_EPOCH is the commit's time; every
mtime is clamped to it; .pyc files are hash-based (unchecked: the root filesystem is read-only
at run time, so no source can change under them); the Python dependencies are pinned by hash
(deploy/image-requirements.txt; `--lock` resolves them anew); the sources are the commit's
(`git archive`), not the work tree's.

Needs root (mmdebstrap in root mode, chroot), mmdebstrap, umoci, git and network access to the
Debian mirror and PyPI. Standard library only: it runs with the system's python3.

This module is the command and its order of steps (checks, the commit, the build's directories);
testkit/image_rootfs.py makes the root filesystem and the venv in it, testkit/image_pack.py packs
it with umoci and writes the archive.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (`python3 testkit/build_image.py`, as `make image` and the tests run it), so
    # sys.path[0] is testkit/ and the steps' modules are not importable as `testkit.*`: the
    # repository's root makes them so, with no virtualenv and no install needed.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.image_pack import describe, pack, write_archive
from testkit.image_rootfs import (
    IMAGE_NAME,
    MIRRORS,
    PACKAGES,
    SUITE,
    VENV,
    BuildError,
    chroot,
    fetch_wheels,
    finish_rootfs,
    install_venv,
    log,
    make_rootfs,
    packages_list,
    run,
)

__all__ = ["IMAGE_NAME", "LOCK_FILE", "VENV", "Source", "main"]

ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = ROOT / "deploy" / "image-requirements.txt"
DEFAULT_OUT = ROOT / ".build" / "image"


def preflight() -> None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise BuildError("builds the linux/amd64 image on linux/amd64 only")
    missing = [name for name in ("mmdebstrap", "umoci", "git", "chroot") if shutil.which(name) is None]
    if missing:
        raise BuildError(f"{', '.join(missing)} not found: apt-get install mmdebstrap umoci git coreutils")
    if os.geteuid() != 0:
        raise BuildError("needs root (mmdebstrap in root mode, chroot): run it as root (sudo make image)")


class Source:
    """The commit the image is built from: its version, revision and time."""

    def __init__(self) -> None:
        self.revision = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).strip()
        self.epoch = int(run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct", "HEAD"]).strip())
        pyproject = run(["git", "-C", str(ROOT), "show", "HEAD:pyproject.toml"])
        self.version = str(tomllib.loads(pyproject)["project"]["version"])
        changed = run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "pyproject.toml", "watcher"])
        self.dirty = bool(changed.strip())

    @property
    def created(self) -> str:
        return datetime.datetime.fromtimestamp(self.epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def export(self, into: Path) -> None:
        """The files the wheel and the image need, as committed (as the Dockerfile's COPY lines)."""
        into.mkdir(parents=True)
        archive = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                "--format=tar",
                "HEAD",
                "pyproject.toml",
                "README.md",
                "watcher",
                "deploy/kubernetes/config.toml",
            ],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")


def build(args: argparse.Namespace) -> int:
    started = time.monotonic()
    preflight()
    source = Source()
    tag = args.tag or source.version
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise BuildError(f"{tag!r} is not a valid image tag")
    if source.dirty:
        log("note: pyproject.toml or watcher/ has uncommitted changes; the image is built from HEAD")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="prw-image-", dir=args.work_dir))
    try:
        source_dir, rootfs, wheels, layout = (work / n for n in ("src", "rootfs", "wheels", "layout"))
        log(f"{IMAGE_NAME}:{tag} from {source.revision[:12]} (SOURCE_DATE_EPOCH={source.epoch})")
        source.export(source_dir)
        log("wheels: the project's and its pinned dependencies' (PyPI)")
        project = fetch_wheels(source_dir, work, source.epoch, Path(args.lock_file), args.lock)
        log(f"root filesystem: mmdebstrap {SUITE} essential + {' '.join(PACKAGES)} (about a minute)")
        make_rootfs(rootfs, source.epoch, args.mirror or list(MIRRORS))
        log(f"venv at {VENV}: the wheels installed and byte-compiled by the image's python")
        install_venv(rootfs, wheels, project, source.epoch)
        printed = chroot(rootfs, [f"{VENV}/bin/{IMAGE_NAME}", "version"], source.epoch).strip()
        if printed != f"{IMAGE_NAME} {source.version}":
            raise BuildError(f"`{IMAGE_NAME} version` in the image printed {printed!r}")
        finish_rootfs(rootfs, source_dir, source.epoch)
        listing = packages_list(rootfs)
        log("packing with umoci")
        pack(rootfs, layout, tag, source)
        target = out / f"{IMAGE_NAME}-{tag}.oci.tar"
        write_archive(layout, target, source.epoch)
        (out / f"{IMAGE_NAME}-{tag}.packages.txt").write_text(listing)
        if args.keep_layout:
            kept = out / f"{IMAGE_NAME}-{tag}.layout"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.move(layout, kept)
            layout = kept
        facts = describe(layout)
    finally:
        if args.keep_work:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    mib = 1024 * 1024
    print(f"image:      docker.io/library/{IMAGE_NAME}:{tag}  ({target})")
    print(f"  digest:   {facts['digest']}")
    print(f"  size:     {int(str(facts['compressed'])) / mib:.1f} MiB compressed layers, "
          f"{int(str(facts['unpacked'])) / mib:.1f} MiB unpacked")  # fmt: skip
    print(f"  import:   ctr -n k8s.io images import {target}")
    print(f"  built in  {time.monotonic() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build_image.py",
        description="Build the agent's OCI image (deploy/Dockerfile's image) without a container "
        "engine: mmdebstrap and umoci, as root. Reproducible: two builds of one commit give one digest.",
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="where the .oci.tar goes (default .build/image)"
    )
    parser.add_argument(
        "--tag",
        default="",
        help="the image tag (default: the project's version); a label too: another tag, another digest",
    )
    parser.add_argument(
        "--lock", action="store_true", help="resolve the newest dependencies and rewrite the lock file"
    )
    parser.add_argument(
        "--lock-file",
        default=str(LOCK_FILE),
        help="the pinned dependencies (default deploy/image-requirements.txt)",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        help="an apt source line, instead of deb.debian.org's bookworm (repeatable)",
    )
    parser.add_argument(
        "--keep-layout", action="store_true", help="also leave the OCI layout directory in --out"
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the work directory (the root filesystem)"
    )
    parser.add_argument(
        "--work-dir", default=None, help="where the work directory is made (default: the temp dir)"
    )
    args = parser.parse_args(argv)
    try:
        return build(args)
    except BuildError as error:
        print(f"build-image: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
