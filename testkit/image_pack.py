"""`make image`'s packing (testkit/build_image.py drives it): umoci makes the finished root
filesystem an OCI image layout with deploy/Dockerfile's config (ENV, USER, EXPOSE, STOPSIGNAL,
ENTRYPOINT, CMD, labels), named for `ctr images import`, then written as one archive whose bytes
depend only on the layout and the commit's time; `describe` reads the result back (digest, sizes).
Standard library only: it runs with the system's python3, before any virtualenv exists.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from testkit.image_rootfs import CONFIG_IN_IMAGE, IMAGE_NAME, PACKAGES, SUITE, VENV, run

if TYPE_CHECKING:
    # For the annotation only: build_image imports this module, and run as a script it is
    # __main__, so an import at run time would be circular and load a second copy of it.
    from testkit.build_image import Source

__all__ = ["describe", "pack", "write_archive"]

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
    # The history names the entry point, not this module: the text is in the image's config, so in
    # its digest (and it is the command that tells a reader how the image was made).
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
