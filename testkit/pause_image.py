"""The pause image, built here: no image registry is reachable from the test machines, and every
pod's sandbox (containerd's `sandbox_image`) runs it.

`build_pause_image()` compiles upstream's own `build/pause/linux/pause.c` from the
k8s.io/kubernetes module that peers/ is pinned to (v1.37.2: its build/pause/Makefile tags it
3.10.2, kubeadm's `PauseVersion` is the same) with gcc, statically, with the Makefile's CFLAGS, and
packs it with umoci into an OCI image archive whose index names it `registry.k8s.io/pause:3.10.2`
(the `io.containerd.image.name` annotation `ctr images import` reads). The archive is cached as
`.build/pause/pause-3.10.2.oci.tar`, rebuilt when pause.c or this recipe changes.

    python -m testkit.pause_image          # prints the archive's path
    ctr --address SOCK -n k8s.io images import .build/pause/pause-3.10.2.oci.tar

The static binary is also kept (`.build/pause/pause`): testkit.container_node runs it as the init
of a node's pid namespace, where it reaps what the shims leave to it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["PAUSE_IMAGE", "PAUSE_VERSION", "build_pause_image", "pause_binary", "pause_source"]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / ".build" / "pause"
PAUSE_VERSION = "3.10.2"
PAUSE_IMAGE = f"registry.k8s.io/pause:{PAUSE_VERSION}"
# build/pause/Makefile: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV)
CFLAGS = ("-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-0")
# Upstream's image runs it as 65535:65535 (build/pause/Dockerfile: USER 65535:65535).
USER = "65535:65535"
# Bumped when the recipe below changes, so a cached archive from an older recipe is rebuilt.
RECIPE = "1"


def pause_source() -> Path:
    """upstream's pause.c in the k8s.io/kubernetes module peers/go.mod requires (downloaded by Go
    into its module cache if it is not there yet)."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is needed to find k8s.io/kubernetes's build/pause/linux/pause.c (Go 1.26+)")
    result = subprocess.run(
        [go, "mod", "download", "-json", "k8s.io/kubernetes"],
        cwd=ROOT / "peers",
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"go mod download k8s.io/kubernetes: {result.stderr.strip() or result.stdout.strip()}"
        )
    source = Path(json.loads(result.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    if not source.is_file():
        raise RuntimeError(f"{source} is not in the module")
    return source


def _run(*argv: str, cwd: Path | None = None) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")


def _tool(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is needed to build the pause image: apt-get install {package}")
    return found


def _key(source: Path) -> str:
    return hashlib.sha256(source.read_bytes() + f"{RECIPE} {CFLAGS} {USER}".encode()).hexdigest()


def pause_binary() -> Path:
    """The static pause binary (built by `build_pause_image`)."""
    build_pause_image()
    return BUILD / "pause"


def build_pause_image() -> Path:
    """The OCI archive of `PAUSE_IMAGE` (built once, then reused from .build/pause/)."""
    source = pause_source()
    key = _key(source)
    archive = BUILD / f"pause-{PAUSE_VERSION}.oci.tar"
    stamp = BUILD / "key"
    if archive.is_file() and (BUILD / "pause").is_file() and stamp.is_file() and stamp.read_text() == key:
        return archive
    gcc = _tool("gcc", "gcc libc6-dev")
    umoci = _tool("umoci", "umoci")
    BUILD.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pause-", dir=BUILD) as tmp:
        work = Path(tmp)
        binary = work / "pause"
        _run(gcc, *CFLAGS, "-o", str(binary), str(source))
        layout, image = work / "oci", f"{work / 'oci'}:{PAUSE_VERSION}"
        _run(umoci, "init", "--layout", str(layout))
        _run(umoci, "new", "--image", image)
        bundle = work / "bundle"
        _run(umoci, "unpack", "--image", image, str(bundle))
        shutil.copy2(binary, bundle / "rootfs" / "pause")
        (bundle / "rootfs" / "pause").chmod(0o755)
        _run(umoci, "repack", "--image", image, str(bundle))
        _run(
            umoci,
            "config",
            "--image",
            image,
            "--config.entrypoint",
            "/pause",
            "--config.user",
            USER,
            "--os",
            "linux",
            "--architecture",
            "amd64",
            "--no-history",
        )
        _run(umoci, "gc", "--layout", str(layout))
        # The full name for `ctr images import` (umoci's ref.name annotation holds the tag alone).
        index_file = layout / "index.json"
        index = json.loads(index_file.read_text())
        for manifest in index["manifests"]:
            manifest.setdefault("annotations", {})["io.containerd.image.name"] = PAUSE_IMAGE
        index_file.write_text(json.dumps(index))
        partial = work / "image.tar"
        _run("tar", "--sort=name", "-cf", str(partial), "-C", str(layout), ".")
        shutil.move(partial, archive)
        shutil.move(binary, BUILD / "pause")
    stamp.write_text(key)
    return archive


if __name__ == "__main__":
    try:
        print(build_pause_image())
    except RuntimeError as error:
        print(f"pause image: {error}", file=sys.stderr)
        sys.exit(1)
