"""A virtualenv holding only the agent's runtime dependencies, as a node runs it: the memory section
measures the agent there, not in the dev venv (whose test extras add modules the agent then imports:
rich and pygments, which structlog picks up when they are installed).

It is built offline from the distributions the dev venv already holds (the same versions, no
download): the closure of the package's runtime requirements, their files copied into a fresh venv
under .bench/, rebuilt only when that closure changes. The agent itself runs from the checkout
(bench/cycles.py puts it first on the path), as the wheel would ship it: testkit, tests and bench
are never imported by the agent.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import venv
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["RUNTIME_VENV", "runtime_distributions", "runtime_python"]

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_VENV = ROOT / ".bench" / "runtime-venv"
DIST = "pod-resources-watcher"


def runtime_distributions() -> list[metadata.Distribution]:
    """The installed distributions the package needs at run time (no extras of ours), with theirs."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [(DIST, frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        key = canonicalize_name(name)
        if key != canonicalize_name(DIST):
            seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            env_extras = extras or frozenset({""})
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in env_extras):
                continue
            if canonicalize_name(req.name) not in seen or req.extras:
                todo.append((req.name, frozenset(req.extras)))
    return sorted(seen.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _key(dists: list[metadata.Distribution]) -> str:
    line = ";".join(f"{d.metadata['Name']}=={d.version}" for d in dists) + f";{sys.version}"
    return hashlib.sha256(line.encode()).hexdigest()


def runtime_python() -> Path:
    """The runtime venv's python, built first if it is missing or its distributions changed."""
    dists = runtime_distributions()
    key = _key(dists)
    stamp = RUNTIME_VENV / ".built"
    python = RUNTIME_VENV / "bin" / "python"
    if stamp.is_file() and stamp.read_text() == key and python.exists():
        return python
    shutil.rmtree(RUNTIME_VENV, ignore_errors=True)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(RUNTIME_VENV)
    purelib = Path(next(p for p in (RUNTIME_VENV / "lib").glob("python*/site-packages") if p.is_dir()))
    for dist in dists:
        for file in dist.files or []:
            if file.parts[0] == ".." or file.suffix == ".pyc":
                continue  # scripts outside site-packages; bytecode is written afresh
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                target = purelib / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    stamp.write_text(key)
    return python


if __name__ == "__main__":
    print(runtime_python())
