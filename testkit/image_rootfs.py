"""`make image`'s root filesystem (testkit/build_image.py drives it): a Debian bookworm tree from
mmdebstrap, the wheels (the project's and its dependencies', pinned by hash; `--lock` pins them
anew), the venv the image's own python installs them into, and the tree finished for packing
(the config, build leftovers removed, owners and mtimes fixed so that two builds match).

Also the steps' shared plumbing (BuildError, run, log, the clean environment) and the names the
packing uses too (IMAGE_NAME, VENV, CONFIG_IN_IMAGE, SUITE, PACKAGES). Standard library only: it
runs with the system's python3, before any virtualenv exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "CONFIG_IN_IMAGE",
    "IMAGE_NAME",
    "MIRRORS",
    "PACKAGES",
    "SUITE",
    "VENV",
    "BuildError",
    "chroot",
    "clean_env",
    "fetch_wheels",
    "finish_rootfs",
    "install_venv",
    "log",
    "make_rootfs",
    "packages_list",
    "run",
]

IMAGE_NAME = "pod-resources-watcher"
VENV = "/opt/pod-resources-watcher"
CONFIG_IN_IMAGE = "/etc/pod-resources-watcher/config.toml"
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
