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
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
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

__all__ = ["IMAGE_NAME", "LOCK_FILE", "VENV", "main"]

ROOT = Path(__file__).resolve().parent.parent
IMAGE_NAME = "pod-resources-watcher"
VENV = "/opt/pod-resources-watcher"
CONFIG_IN_IMAGE = "/etc/pod-resources-watcher/config.toml"
LOCK_FILE = ROOT / "deploy" / "image-requirements.txt"
DEFAULT_OUT = ROOT / ".build" / "image"
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# What the agent needs at run time besides the Essential set: the interpreter with its whole
# standard library (asyncio, ssl, sqlite3), the CA bundle (it talks TLS to Slack, PagerDuty, the
# API server) and the C++ runtime grpcio's extension links (manylinux wheels bring no libstdc++).
PACKAGES = ("python3", "ca-certificates", "libstdc++6")
# Debian's python3 is 3.11: the wheels are for it. Every manylinux tag up to bookworm's glibc (2.36),
# named one by one: older pips do not expand a manylinux_2_36 tag to the ones below it.
WHEEL_PLATFORM = (
    *(arg for glibc in (5, 12, *range(17, 37)) for arg in ("--platform", f"manylinux_2_{glibc}_x86_64")),
    *(
        arg
        for legacy in ("manylinux1", "manylinux2010", "manylinux2014")
        for arg in ("--platform", f"{legacy}_x86_64")
    ),
    "--python-version",
    "3.11",
)
# Not needed at run time; dpkg never unpacks them (copyright files stay: licences).
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/bug/*",
)
# Build leftovers that differ from build to build (times, random ids, caches), removed.
LEFTOVERS = (
    "var/cache/ldconfig/aux-cache",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "var/lib/dpkg/statoverride-old",
    "etc/passwd-",
    "etc/group-",
    "etc/shadow-",
    "etc/gshadow-",
)
# Directories emptied (kept themselves): logs, apt's lists and cache, the build's /tmp; /dev: the
# runtime mounts its own.
EMPTIED = ("var/log", "var/lib/apt/lists", "var/cache/apt", "tmp", "var/tmp", "dev", "run", "root")
DESCRIPTION = (
    "Watches the kubelet pod-resources API and reports every device, CPU, memory and allocation "
    "change as an event"
)
ENV = (
    # PATH as the Dockerfile's (python:3.11-slim's PATH, with the venv first; /usr/local/bin has
    # nothing here); LANG as python:3.11-slim sets it.
    "PATH=/opt/pod-resources-watcher/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
)


class BuildError(Exception):
    """A step failed; the message says which and what to do."""


def log(message: str) -> None:
    print(f"build-image: {message}", flush=True)


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a step; its output is shown only when it fails."""
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-3000:]
        raise BuildError(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n{output}")
    return result.stdout


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


def clean_env(epoch: int) -> dict[str, str]:
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(epoch),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_NO_INPUT": "1",
    }


def host_pip(*args: str, epoch: int) -> str:
    env = {**clean_env(epoch), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return run([sys.executable, "-m", "pip", *args], env=env)


def make_rootfs(rootfs: Path, epoch: int, mirrors: list[str]) -> None:
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=essential",
        "--architectures=amd64",
        "--format=directory",
        # Merged /usr as debootstrap and Docker's Debian images have it, through the usr-is-merged
        # package: without the hook apt picks usrmerge, which drags in perl (40 MB).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(PACKAGES)}",
        "--aptopt=APT::Install-Recommends false",
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
        SUITE,
        str(rootfs),
        *mirrors,
    ]
    run(argv, env={**clean_env(epoch), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def fetch_wheels(source_dir: Path, work: Path, epoch: int, lock_file: Path, relock: bool) -> Path:
    """The project's wheel, its dependencies' wheels for cp311 manylinux x86_64 and pip's wheel (the
    installer; run from the wheel, never installed), all pinned by hash in the lock file. The wheels
    made here (the project's, and nkeys', which PyPI has only as an sdist) are made by the pinned
    setuptools, so they do not change with its releases; one that would need a compiler fails."""
    wheels = work / "wheels"
    wheels.mkdir(parents=True)
    if relock:
        draft = work / "draft"
        host_pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(draft), str(source_dir), epoch=epoch)
        lock(next(draft.glob("pod_resources_watcher-*.whl")), draft, lock_file, epoch)
    if not lock_file.is_file():
        raise BuildError(f"{lock_file} is missing: run with --lock to resolve the dependencies")
    downloads = work / "downloads"
    # --no-deps: the lock file is the whole set (the install below, from these files only, proves it).
    host_pip(
        "download", "--quiet", "--no-deps", "--require-hashes", "--dest", str(downloads),
        *WHEEL_PLATFORM, "--implementation", "cp", "--abi", "cp311", "--requirement", str(lock_file),
        epoch=epoch,
    )  # fmt: skip
    # --upgrade: the venv comes with the setuptools ensurepip bundles; downloads/ has only the pinned.
    builder = work / "builder"
    run([sys.executable, "-m", "venv", str(builder)])
    builder_pip = [str(builder / "bin" / "python"), "-m", "pip"]
    env = clean_env(epoch)
    run(
        [
            *builder_pip,
            "install",
            "--quiet",
            "--upgrade",
            "--no-index",
            "--find-links",
            str(downloads),
            "setuptools",
        ],
        env=env,
    )
    for source in (source_dir, *sorted(downloads.glob("*.tar.gz"))):
        run(
            [*builder_pip, "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
             "--wheel-dir", str(wheels), str(source)],
            env=env,
        )  # fmt: skip
    for wheel in downloads.glob("*.whl"):
        wheel.rename(wheels / wheel.name)
    for wheel in wheels.glob("*.whl"):
        tags = wheel.name.removesuffix(".whl").split("-")[-3:]
        # A wheel made here from an sdist with a C extension would say linux_x86_64.
        if not (tags[2] == "any" or "manylinux" in tags[2]) or tags[1] not in ("none", "abi3", "cp311"):
            raise BuildError(f"{wheel.name}: not a wheel for cp311 manylinux x86_64 (would need a compiler)")
    return next(wheels.glob("pod_resources_watcher-*.whl"))


def lock(project: Path, wheels: Path, lock_file: Path, epoch: int) -> None:
    """Resolve the newest dependencies and pin each file by hash. Resolved on this host, which must
    be what the image is (CPython 3.11, x86_64, glibc >= bookworm's): a --platform resolution
    refuses the sdist-only nkeys."""
    if sys.version_info[:2] != (3, 11) or sys.implementation.name != "cpython":
        raise BuildError("--lock resolves for the image's CPython 3.11: run it with a CPython 3.11")
    resolved = wheels / "resolved"
    host_pip("download", "--quiet", "--dest", str(resolved), str(project), "pip", "setuptools", epoch=epoch)
    lines = [
        "# The image's Python dependencies (make image), pinned by hash: written by",
        "# `python3 testkit/build_image.py --lock`. Not installed: pip (the installer, run from its wheel)",
        "# and setuptools (builds the project's wheel and those PyPI has only as an sdist).",
    ]
    for item in sorted(resolved.iterdir(), key=lambda p: p.name.lower()):
        if item.name.startswith("pod_resources_watcher-"):
            continue
        stem = item.name.removesuffix(".tar.gz").removesuffix(".whl")
        name, version = stem.split("-")[:2] if item.suffix == ".whl" else stem.rsplit("-", 1)
        digest = hashlib.sha256(item.read_bytes()).hexdigest()
        lines.append(f"{name.lower().replace('_', '-')}=={version} --hash=sha256:{digest}")
    lock_file.write_text("\n".join(lines) + "\n")
    shutil.rmtree(resolved)
    log(f"wrote {lock_file} ({len(lines) - 3} distributions)")


def chroot(rootfs: Path, argv: list[str], epoch: int) -> str:
    return run(["chroot", str(rootfs), *argv], env=clean_env(epoch))


def install_venv(rootfs: Path, wheels: Path, project: Path, epoch: int) -> None:
    """The venv, made and filled by the image's own python (so shebangs and paths are the image's),
    without pip, byte-compiled now: the root filesystem is read-only at run time."""
    chroot(rootfs, ["python3", "-m", "venv", "--without-pip", VENV], epoch)
    staged = rootfs / "tmp" / "wheels"
    shutil.copytree(wheels, staged)
    (pip_wheel,) = staged.glob("pip-*.whl")
    version = project.name.split("-")[1]
    chroot(
        rootfs,
        [
            f"{VENV}/bin/python", f"/tmp/wheels/{pip_wheel.name}/pip", "install", "--quiet",
            "--no-index", "--find-links", "/tmp/wheels", "--no-compile", "--only-binary", ":all:",
            f"pod-resources-watcher=={version}",
        ],
        epoch,
    )  # fmt: skip
    shutil.rmtree(staged)
    # Hash-based .pyc (no timestamps in them; unchecked: nothing can change the sources at run
    # time), the venv's and the standard library's (Debian's are timestamp-based). -f: all anew.
    for directory in (f"{VENV}/lib", "/usr/lib/python3.11", "/usr/lib/python3/dist-packages"):
        if (rootfs / directory.lstrip("/")).is_dir():
            chroot(
                rootfs,
                ["python3", "-m", "compileall", "-q", "-f", "--invalidation-mode", "unchecked-hash",
                 directory],
                epoch,
            )  # fmt: skip
    entry = rootfs / VENV.lstrip("/") / "bin" / IMAGE_NAME
    first = entry.read_text().splitlines()[0]
    if first != f"#!{VENV}/bin/python":
        raise BuildError(f"{entry}: unexpected shebang {first!r}")
    # Every extension module's shared libraries are in the image (ldd: the image's own loader).
    extensions = [str(p.relative_to(rootfs)) for p in (rootfs / VENV.lstrip("/")).rglob("*.so*")]
    unresolved = [
        f"{so}: {line.strip()}"
        for so in sorted(extensions)
        for line in chroot(rootfs, ["ldd", f"/{so}"], epoch).splitlines()
        if "not found" in line
    ]
    if unresolved:
        raise BuildError("shared libraries missing from the image:\n" + "\n".join(unresolved))
    left = [p.name for p in (rootfs / VENV.lstrip("/")).glob("lib/python3.11/site-packages/pip*")]
    if left:
        raise BuildError(f"pip ended up in the venv: {left}")


def finish_rootfs(rootfs: Path, source_dir: Path, epoch: int) -> None:
    config = rootfs / CONFIG_IN_IMAGE.lstrip("/")
    config.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source_dir / "deploy" / "kubernetes" / "config.toml", config)
    config.chmod(0o644)
    config.parent.chmod(0o755)
    for name in LEFTOVERS:
        (rootfs / name).unlink(missing_ok=True)
    for name in EMPTIED:
        directory = rootfs / name
        if directory.is_dir() and not directory.is_symlink():
            for child in directory.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    # systemd's convention for an image: an empty machine-id, filled in at boot (none here).
    (rootfs / "etc" / "machine-id").write_text("")
    for path in (rootfs / VENV.lstrip("/"), config.parent):
        for item in (path, *path.rglob("*")):
            os.lchown(item, 0, 0)
    clamp_mtimes(rootfs, epoch)


def clamp_mtimes(tree: Path, epoch: int) -> None:
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in (*dirnames, *filenames, ""):
            path = os.path.join(dirpath, name) if name else dirpath
            info = os.lstat(path)
            if info.st_mtime > epoch:
                os.utime(path, (epoch, epoch), follow_symlinks=False)


def umoci(*args: str) -> str:
    return run(["umoci", *args])


def pack(rootfs: Path, layout: Path, tag: str, source: Source) -> None:
    image = f"{layout}:{tag}"
    created = source.created
    umoci("init", "--layout", str(layout))
    umoci("new", "--image", image)
    umoci(
        "insert", "--image", image, "--history.created", created,
        "--history.created_by", f"mmdebstrap {SUITE} {' '.join(PACKAGES)}; venv {VENV}",
        str(rootfs), "/",
    )  # fmt: skip
    labels = {
        "org.opencontainers.image.title": IMAGE_NAME,
        "org.opencontainers.image.description": DESCRIPTION,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": source.version,
        "org.opencontainers.image.revision": source.revision,
        # The tag in the config too: a build retagged for a rolling update (IMAGE_TAG=0.1.0-rebuilt)
        # is then a distinct image, with its own digest and image ID, not the same one renamed.
        "org.opencontainers.image.ref.name": tag,
    }
    config = [
        "config", "--image", image, "--created", created, "--history.created", created,
        "--history.created_by", "testkit/build_image.py: deploy/Dockerfile's ENV, USER, EXPOSE, "
        "STOPSIGNAL, ENTRYPOINT, CMD, LABEL",
        "--author", "", "--architecture", "amd64", "--os", "linux",
        "--config.user", "0:0", "--config.exposedports", "9108/tcp", "--config.stopsignal", "SIGTERM",
        "--config.entrypoint", f"{VENV}/bin/{IMAGE_NAME}",
        *(arg for word in ("run", "--config", CONFIG_IN_IMAGE) for arg in ("--config.cmd", word)),
        *(arg for env in ENV for arg in ("--config.env", env)),
        *(arg for key, value in labels.items() for arg in ("--config.label", f"{key}={value}")),
    ]  # fmt: skip
    umoci(*config)
    umoci("gc", "--layout", str(layout))
    # Names for `ctr images import`: containerd takes io.containerd.image.name as the image's name;
    # the chart's default (repository pod-resources-watcher, tag appVersion) resolves to it.
    index_file = layout / "index.json"
    index = json.loads(index_file.read_text())
    (manifest,) = index["manifests"]
    manifest.setdefault("annotations", {}).update(
        {
            "org.opencontainers.image.ref.name": tag,
            "io.containerd.image.name": f"docker.io/library/{IMAGE_NAME}:{tag}",
        }
    )
    index_file.write_text(json.dumps(index, sort_keys=True, separators=(",", ":")))


def write_archive(layout: Path, target: Path, epoch: int) -> None:
    """The layout as a tar, sorted, owned by 0:0, every mtime the commit's: the same bytes each time."""
    part = target.with_suffix(".part")
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(layout).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = epoch
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isfile():
                with path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    part.replace(target)


def blob(layout: Path, digest: str) -> Path:
    algorithm, hexdigest = digest.split(":")
    return layout / "blobs" / algorithm / hexdigest


def describe(layout: Path) -> dict[str, object]:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    manifest = json.loads(blob(layout, entry["digest"]).read_bytes())
    compressed = sum(int(layer["size"]) for layer in manifest["layers"])
    unpacked = 0
    for layer in manifest["layers"]:
        with (
            gzip.open(blob(layout, layer["digest"])) as stream,
            tarfile.open(fileobj=stream, mode="r|") as tar,
        ):
            unpacked += sum(member.size for member in tar if member.isfile())
    return {"digest": entry["digest"], "compressed": compressed, "unpacked": unpacked}


def packages_list(rootfs: Path) -> str:
    """What went in, to tell why two builds on different days differ (the mirror moves)."""
    debs = run(["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package}=${Version}\n"])
    site = next((rootfs / VENV.lstrip("/")).glob("lib/python3*/site-packages"))
    dists = sorted(p.name.removesuffix(".dist-info") for p in site.glob("*.dist-info"))
    return (
        "# Debian packages\n"
        + "".join(sorted(debs.splitlines(keepends=True)))
        + ("# Python distributions in " + VENV + "\n" + "\n".join(dists) + "\n")
    )


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
