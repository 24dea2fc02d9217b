"""The fast tier, computed from the code rather than kept as a list of files.

A test is *fast* (`make test-fast`, `pytest -m fast`) when it needs nothing outside its own
process and waits on nothing: no program (a tool, a Go peer, a second Python), no server or
socket (in-process fakes included: a fake kubelet brings gRPC, timers and the agent's waits with
it), and it is not marked `slow`, `chaos` or `e2e`. tests/conftest.py gives the `fast` marker to
each collected test this module finds so; nobody writes it by hand, so a new pure test is in the
fast tier the day it is written, and one that starts using a server leaves it by itself.

How a test is judged, statically: the names its function uses (its decorators too), and, through
them, the module's own helpers and fixtures, and the fixtures it asks for (conftest's included)
are followed to where they were imported from. A name from an *outside* module makes it not fast:
- the standard library's and the stack's process and network modules (OUTSIDE_ROOTS), and the
  process calls of `os` and `asyncio` (PROCESS_CALLS);
- a watcher/ module that itself imports one of those (a fake kubelet serves gRPC; the settings
  parser does not, so a test of it stays fast even though the agent it configures would not);
- a testkit/ module that imports one of those, or an outside module, at any depth (testkit's
  helpers are built on each other: the agent harness runs a fake kubelet).

What static reading can miss (a module that starts a process without importing anything that
says so), the run catches: a fast test that starts a process or opens a socket fails (`forbid_outside`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "FAST_EXCLUDED_BY",
    "OUTSIDE_ROOTS",
    "OutsideInFastTestError",
    "forbid_outside",
    "is_fast",
    "is_outside_module",
    "may_hold_fast_tests",
    "outside_defs",
]

ROOT = Path(__file__).resolve().parent.parent

# Modules that run programs, open sockets or serve: a name imported from one means "outside".
OUTSIDE_ROOTS = frozenset(
    {
        "subprocess",
        "multiprocessing",
        "pty",
        "socket",
        "socketserver",
        "http.server",
        "http.client",
        "urllib.request",
        "aiohttp",
        "grpc",
        "nats",
    }
)
# Process creation reached as an attribute of an always-imported module.
PROCESS_CALLS = frozenset(
    {
        ("asyncio", "create_subprocess_exec"),
        ("asyncio", "create_subprocess_shell"),
        *(("os", name) for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp")),
        *(("os", f"exec{tail}") for tail in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    }
)
# What the tests and benchmarks share: judged with everything they import.
SUPPORT = ("testkit", "bench")
# Uses of those modules that open nothing: the settings name the node after the host.
HARMLESS = frozenset({("socket", "gethostname")})
# Markers that keep a test out of the fast tier whatever it imports.
FAST_EXCLUDED_BY = ("slow", "chaos", "e2e")


def _is_outside_root(module: str) -> bool:
    return any(module == root or module.startswith(f"{root}.") for root in OUTSIDE_ROOTS)


@functools.cache
def _source_of(module: str) -> Path | None:
    """The file of one of our modules, or None for anything else."""
    if module.split(".")[0] not in ("watcher", *SUPPORT):
        return None
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@dataclasses.dataclass
class _Facts:
    """What one reading of a module tells: its imports, how it uses them, and what each of its
    top-level functions, classes and assigned names uses."""

    imported: set[str] = dataclasses.field(default_factory=set)  # `from a import b`: a, and a.b if a module
    bindings: dict[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    names: Counter[str] = dataclasses.field(default_factory=Counter)  # each use of a bare name
    attrs: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # `x.attr`, by x
    dotted: Counter[str] = dataclasses.field(default_factory=Counter)  # each use as `x.attr`, by x
    calls_processes: bool = False
    defs: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # top-level name: names it uses
    spawning: set[str] = dataclasses.field(default_factory=set)  # top-level names calling PROCESS_CALLS
    marks: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # `@pytest.mark.X`s, by name

    @property
    def outside_bindings(self) -> set[str]:
        """The names bound to process or network modules and used for more than HARMLESS reads."""
        found = set()
        for name, (module, _) in self.bindings.items():
            attrs = self.attrs.get(name, set())
            if _is_outside_root(module) and (
                self.names[name] > self.dotted[name] or any((module, a) not in HARMLESS for a in attrs)
            ):
                found.add(name)
        return found

    def read(self, top: ast.stmt) -> None:
        used: set[str] = set()
        calls = False
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):  # not `socket: Path`
                self.names[node.id] += 1
                used.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                self.attrs.setdefault(node.value.id, set()).add(node.attr)
                self.dotted[node.value.id] += 1
                calls |= (node.value.id, node.attr) in PROCESS_CALLS
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported.add(alias.name)
                    self.bindings[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
            elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
                self.imported.add(node.module)
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _source_of(full) is not None:
                        self.imported.add(full)
                        self.bindings[alias.asname or alias.name] = (full, None)
                    else:
                        self.bindings[alias.asname or alias.name] = (node.module, alias.name)
        self.calls_processes |= calls
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.marks[top.name] = _marks_in(top.decorator_list)
        elif "pytestmark" in _defined_by(top):
            self.marks["pytestmark"] = _marks_in([top])
        for name in _defined_by(top):
            self.defs.setdefault(name, set()).update(used)
            if calls:
                self.spawning.add(name)


def _defined_by(top: ast.stmt) -> list[str]:
    """The top-level names a statement defines: a function, a class, an assignment's targets."""
    if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [top.name]
    if isinstance(top, ast.Assign | ast.AnnAssign):
        targets = top.targets if isinstance(top, ast.Assign) else [top.target]
        return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]
    return []


def _marks_in(nodes: list[ast.expr] | list[ast.stmt]) -> set[str]:
    """The X of each `pytest.mark.X` in some code."""
    return {
        node.attr
        for top in nodes
        for node in ast.walk(top)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    }


@functools.cache
def _facts(path: Path) -> _Facts:
    facts = _Facts()
    for top in ast.parse(path.read_bytes(), str(path)).body:
        facts.read(top)
    return facts


@functools.cache
def is_outside_module(module: str) -> bool:
    """Whether using `module` means running programs, serving or opening sockets: by what it
    uses itself, and for testkit/ and bench/ also by what they import (their helpers stand on
    each other and on the fakes: the agent harness runs a fake kubelet)."""
    if _is_outside_root(module):
        return True
    path = _source_of(module)
    if path is None or module == __name__:  # this module only forbids sockets and processes
        return False
    facts = _facts(path)
    if facts.calls_processes or facts.outside_bindings:
        return True
    return module.split(".")[0] in SUPPORT and any(
        is_outside_module(name) for name in facts.imported - {module}
    )


@functools.cache
def is_outside_name(module: str, name: str | None) -> bool:
    """Whether `name` imported from `module` (the module itself when None) reaches outside.

    A watcher/ name counts by the module that defines it, through re-exports (a package's
    __init__ naming its server): the package's modules all lead, in the end, to the agent,
    which does everything, so following their imports would leave no test fast.
    """
    if name is None or not module.startswith("watcher"):
        return is_outside_module(module)
    path = _source_of(module)
    if path is None:
        return False
    origin = _facts(path).bindings.get(name)
    if origin is not None and origin[0].startswith("watcher"):
        return is_outside_name(*origin)
    return is_outside_module(module)


@functools.cache
def outside_defs(path: Path) -> frozenset[str]:
    """The top-level names of a test module (or conftest.py) whose code reaches outside: through
    an outside import, a process call, or another such name of the same module."""
    facts = _facts(path)
    ours = {name: origin for name, origin in facts.bindings.items() if not _is_outside_root(origin[0])}
    outside_names = facts.outside_bindings | {n for n, origin in ours.items() if is_outside_name(*origin)}
    uses = facts.defs
    reached = {name for name, used in uses.items() if name in facts.spawning or used & outside_names}
    # What uses a helper or fixture of the module that reaches outside reaches outside too.
    changed = True
    while changed:
        changed = False
        for name in uses.keys() - reached:
            if uses[name] & reached:
                reached.add(name)
                changed = True
    return frozenset(reached)


def may_hold_fast_tests(path: Path) -> bool:
    """Whether a test module may hold a fast test, known before importing it: not when its
    `pytestmark` or each test's own marks keep it out of the tier, or each reaches outside.
    `is_fast` would say no to each of its tests; a module of none need not be collected."""
    facts = _facts(path)
    if facts.marks.get("pytestmark", set()) & set(FAST_EXCLUDED_BY):
        return False
    outside = outside_defs(path)
    return any(
        name not in outside and not facts.marks.get(name, set()) & set(FAST_EXCLUDED_BY)
        for name in facts.defs
        if name.startswith(("test", "Test"))
    )


def _fixture_defined_in(func: Any) -> tuple[Path, str] | None:
    """The file and top-level name of a fixture of ours (tests/), None for pytest's own."""
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return None
    path = Path(code.co_filename)
    if path.parent != ROOT / "tests":
        return None
    return path, func.__qualname__.split(".")[0]


def is_fast(item: pytest.Item) -> bool:
    """Whether a collected test belongs to the fast tier (see the module's doc)."""
    if not isinstance(item, pytest.Function):
        return False
    if any(item.get_closest_marker(name) is not None for name in FAST_EXCLUDED_BY):
        return False
    # The test itself: its class, or its function by the name it was written with (a
    # parametrized test's item is named `test_x[case]`).
    owner = item.cls.__name__ if item.cls is not None else item.originalname
    if owner in outside_defs(item.path):
        return False
    # Every fixture it uses, however indirectly (pytest has the closure): pytest keeps where each
    # is defined only in this private attribute.
    for name in item.fixturenames:
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        where = _fixture_defined_in(defs[-1].func) if defs else None
        if where is not None and where[1] in outside_defs(where[0]):
            return False
    return True


class OutsideInFastTestError(AssertionError):
    """A fast test reached outside its process: the static reading missed something."""


@contextlib.contextmanager
def forbid_outside(nodeid: str) -> Iterator[None]:
    """Within: starting a process, or binding, listening on or connecting a socket (gRPC's
    servers and channels included: they open theirs in C), fails the test, naming what it did.
    The tier's check at run time: what `is_fast` could not see by reading the code."""
    import _posixsubprocess  # the fork_exec under subprocess.Popen and asyncio's subprocesses
    import socket
    import subprocess  # keeps its own name for fork_exec
    import sys

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*_args: Any, **_kwargs: Any) -> Any:
            raise OutsideInFastTestError(
                f"{nodeid} is in the fast tier but reached outside its process ({what}): give it "
                "@pytest.mark.slow, or import what does it from a module that says so (testkit/tiers.py)"
            )

        return refused

    targets: list[tuple[Any, str]] = [(_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec")]
    targets += [(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")]
    targets += [(socket.socket, name) for name in ("bind", "listen", "connect", "connect_ex")]
    # gRPC is only patched where a test module has imported it already.
    grpc = sys.modules.get("grpc")
    if grpc is not None:
        targets += [(grpc, n) for n in ("server", "insecure_channel", "secure_channel")]
        targets += [(grpc.aio, n) for n in ("server", "insecure_channel", "secure_channel")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets if hasattr(owner, name)]
    for owner, name, _ in saved:
        setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
