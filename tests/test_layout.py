"""The import layering docs/architecture.md's "Layout" section documents, enforced.

Layers, lowest first: a module may import from its own unit and from lower layers only; units
marked as peers (kubelet, store, sinks; delivery, ops, settings) never import each other (the
foundation's small modules may); settings_file, which reads the settings, sits just above them.
The pure core (model/, the kubelet's health machine, and the sinks' pure planning: the nats
subjects, the kubernetes planner and its conditions and notes) imports no I/O library at all.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "watcher"

# (units, peers?): a unit is a top-level module or sub-package of `watcher`.
LAYERS: list[tuple[set[str], bool]] = [
    (
        {"__init__", "errors", "config", "secrets", "files", "tls", "backoff", "ratelimit"}
        | {"supervision", "kubeletapi", "allocator", "heap", "bootclock", "retry_after"},
        False,
    ),
    ({"model", "kubeapi"}, True),
    ({"kubelet", "store", "sinks"}, True),
    ({"sources"}, True),
    ({"delivery", "ops", "settings"}, True),
    ({"settings_file"}, False),
    ({"cycle"}, True),
    ({"status", "parts"}, True),
    ({"app"}, True),
    ({"sim", "snapshot", "cli", "__main__"}, False),
]
PURE = [
    "model",  # with model/devicehealth/: the pod and device-health model
    "sources/base.py",
    "kubelet/health.py",
    "sinks/nats/subjects.py",
    "sinks/kubernetes/planner.py",
    "sinks/kubernetes/condition_plan.py",
    "sinks/kubernetes/notes.py",
    "sinks/kubernetes/episodes.py",
]
IO_LIBRARIES = {
    "asyncio",
    "grpc",
    "aiohttp",
    "sqlite3",
    "watchfiles",
    "socket",
    "structlog",
    "prometheus_client",
}


def _layer_of(unit: str) -> int:
    for i, (units, _) in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"watcher.{unit} is in no layer: add it to LAYERS and docs/architecture.md's Layout")


def _unit(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Dotted names this module imports (`from watcher import x` counts as watcher.x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            if node.module == "watcher":
                names.update(f"watcher.{alias.name}" for alias in node.names)
    return names


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "kubeletapi" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_downward_only(path: Path) -> None:
    unit = _unit(path)
    layer = _layer_of(unit)
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] != "watcher" or len(parts) < 2 or parts[1] == "__version__":
            continue
        target = parts[1]
        if target == unit:
            continue
        target_layer = _layer_of(target)
        assert target_layer <= layer, f"{path.relative_to(PACKAGE)} imports {name}: an upward import"
        if target_layer == layer:
            assert not LAYERS[layer][1], f"{path.relative_to(PACKAGE)} imports its peer {name}"


@pytest.mark.parametrize("where", PURE)
def test_the_pure_core_does_no_io(where: str) -> None:
    root = PACKAGE / where
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    assert files
    for path in files:
        bad = {n for n in _imports(path) if n.split(".")[0] in IO_LIBRARIES}
        assert not bad, f"{path.relative_to(PACKAGE)} is pure core but imports {sorted(bad)}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, wherever the import is (a local import or one
    under TYPE_CHECKING hides a cycle from Python, not from a reader)."""
    names = {_module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        found = set()
        for name in _imports(path):
            # `from a.b import c`: c may be a module (a.b.c) or a name in a.b.
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
        graph[_module_name(path)] = found - {_module_name(path)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), a package's `__init__`
    importing its own modules left out: that is how a package names what it offers."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def edges(v: str) -> set[str]:
        return {w for w in graph.get(v, ()) if not w.startswith(v + ".")}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    cycles = _cycles(_import_graph())
    assert cycles == [], f"modules that import each other (split what both need into a third): {cycles}"


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"p": {"p.x"}, "p.x": set()}) == []


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in MODULES}
    for unit in units:
        _layer_of(unit)


def test_the_package_never_imports_the_test_support() -> None:
    """testkit/ and tests/ are never in the wheel: nothing under watcher/ may import them."""
    for path in MODULES:
        bad = {n for n in _imports(path) if n.split(".")[0] in {"testkit", "tests"}}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_test_modules_import_no_other_test_module() -> None:
    """What tests share lives in testkit/ (fixtures in conftest.py); testkit/ never imports tests/."""
    root = PACKAGE.parent
    tests = sorted((root / "tests").glob("*.py"))
    assert {p.name for p in tests if not p.name.startswith("test_")} == {"conftest.py"}
    for path in [*tests, *sorted((root / "testkit").glob("*.py"))]:
        bad = {n for n in _imports(path) if n.split(".")[0] == "tests"}
        assert not bad, f"{path.relative_to(root)} imports {sorted(bad)}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import from a higher layer is found."""
    module = tmp_path / "m.py"
    module.write_text("from watcher.app import Agent\nfrom watcher import settings\n")
    assert {"watcher.app", "watcher.settings"} <= _imports(module)
    assert _layer_of("app") > _layer_of("model")


# The module list and the walk live in docs/architecture.md (the README is a front door).
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _layout_section() -> str:
    text = ARCHITECTURE.read_text()
    start = text.index("## Layout")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_layout_names_every_module() -> None:
    section = _layout_section()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in MODULES
        if p.name != "__init__.py" and p.parent.name != "__pycache__" and p.name not in section
    ]
    assert not missing, f"docs/architecture.md's Layout does not list: {missing}"


def _defined(path: Path) -> set[str]:
    """Top-level names and Class.method names defined in a module."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.Assign):  # e.g. Store.commit = _OnThread(...)
                    names.update(f"{node.name}.{t.id}" for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    return names


def test_the_readme_walk_names_code_that_exists() -> None:
    """Every `file.py:Name` hop of the walk "a device fails -> a Slack message" still exists."""
    import re

    hops = re.findall(r"`([a-z_/]+\.py):([A-Za-z_.]+)", _layout_section())
    assert len(hops) >= 10
    for file, name in hops:
        path = PACKAGE / file
        assert path.is_file(), f"docs/architecture.md names {file}, which does not exist"
        assert name.rstrip(".") in _defined(path), f"docs/architecture.md names {file}:{name}, which is gone"


def test_every_test_security_md_cites_exists() -> None:
    """SECURITY.md backs each claim with a test; a renamed or deleted test must not leave a claim
    that points at nothing. `tests/FILE::NAME` names a file; `::NAME` after it, the same file."""
    text = (PACKAGE.parent / "SECURITY.md").read_text()
    cited: list[tuple[str, str]] = []
    current = None
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", text):
        current = match.group(1) or current
        if match.group(2) is not None:
            assert current is not None, f"{match.group(0)} names no file before it"
            cited.append((current, match.group(2)))
    assert len(cited) > 30
    missing = []
    for path, name in cited:
        source = (PACKAGE.parent / path).read_text()
        if not re.search(rf"^(async )?def {name}\(", source, re.M):
            missing.append(f"{path}::{name}")
    assert missing == [], "SECURITY.md cites tests that do not exist"


def test_the_changelog_names_the_version_the_package_declares() -> None:
    """CHANGELOG.md, in the Keep a Changelog form: a version bumped without an entry fails here."""
    from watcher import __version__

    changelog = (PACKAGE.parent / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog\n")
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\S+))?", changelog, re.MULTILINE)
    assert versions, "no '## [VERSION]' heading"
    assert __version__ in {part for heading in versions for part in heading}
    sections = set(re.findall(r"^### (\w+)$", changelog, re.MULTILINE))
    assert sections and sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


# --- the house stays split: module and class sizes -----------------------------------------------

REPO = PACKAGE.parent
# "A few hundred lines at most": ~400 lines of code, with a little slack. Lines of code, not lines:
# comments, docstrings and blank lines are not counted, so a why-comment never has to go to make
# room.
MAX_MODULE_LINES = 420
MAX_METHODS = 25
# Generated code, and modules that are declarative tables rather than logic.
SIZE_EXCEPTIONS: set[str] = set()
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def _code_lines(source: str) -> set[int]:
    """The numbers of the lines that hold code: not blank, not only a comment, not part of a
    docstring (the module's, a class's or a function's). A string that is code (a SQL statement,
    a message) counts every line it spans."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.difference_update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _source_modules() -> list[Path]:
    """What ships and what the tests and benchmarks share: the package, testkit/ and bench/ (the
    test modules themselves are lists of cases, not code to navigate)."""
    found = [p for d in ("watcher", "testkit", "bench") for p in (REPO / d).rglob("*.py")]
    return sorted(p for p in found if "_pb2" not in p.name and "__pycache__" not in p.parts)


def test_no_module_grows_into_a_hub() -> None:
    big = {
        str(p.relative_to(REPO)): n
        for p in _source_modules()
        if (n := len(_code_lines(p.read_text()))) > MAX_MODULE_LINES
        and str(p.relative_to(REPO)) not in SIZE_EXCEPTIONS
    }
    assert big == {}, f"split these by concern (at most {MAX_MODULE_LINES} lines of code): {big}"


def test_no_class_grows_into_a_hub() -> None:
    big = {}
    for path in _source_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [i for i in node.body if isinstance(i, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_METHODS:
                    big[f"{path.relative_to(REPO)}:{node.name}"] = len(methods)
    assert big == {}, f"give their concerns objects of their own (at most {MAX_METHODS} methods): {big}"


# --- functions stay small too (ruff's C90, PLR0915 and PLR0912 in pyproject.toml count no lines) ---

MAX_FUNCTION_LINES = 80
# "file.py:Qualified.name" -> why it cannot be split. Empty: every function was.
LONG_FUNCTIONS: dict[str, str] = {}


def _functions(
    tree: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones too, by qualified name (`Class.method.inner`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _function_lengths(source: str) -> dict[str, int]:
    """Each function's lines of code (a nested function's count in its parent's too)."""
    code = _code_lines(source)
    return {
        name: sum(1 for line in code if node.lineno <= line <= (node.end_lineno or node.lineno))
        for name, node in _functions(ast.parse(source))
    }


def test_no_function_grows_past_80_lines_of_code() -> None:
    """The package, testkit/ and bench/: a function a reader cannot see whole is split by step."""
    long = {
        f"{path.relative_to(REPO)}:{name}": n
        for path in _source_modules()
        for name, n in _function_lengths(path.read_text()).items()
        if n > MAX_FUNCTION_LINES and f"{path.relative_to(REPO)}:{name}" not in LONG_FUNCTIONS
    }
    assert long == {}, f"split these by step (at most {MAX_FUNCTION_LINES} lines of code): {long}"


def test_lines_of_code_leave_out_comments_docstrings_and_blank_lines() -> None:
    """The counter itself: a docstring, a comment and a blank line are not code; a string that is
    an expression, and every line of a statement spread over several, are."""
    source = (
        '"""The module\'s docstring,\non two lines."""\n'  # 1-2
        "\n"  # 3
        "class C:\n"  # 4
        '    """A class docstring."""\n'  # 5
        "\n"  # 6
        "    def f(self) -> str:\n"  # 7
        '        """Its docstring."""\n'  # 8
        "        # why it does this\n"  # 9
        "        x = (\n"  # 10
        "            1,\n"  # 11
        "        )  # a trailing comment\n"  # 12
        '        return """a string\nthat is code"""\n'  # 13-14
    )
    assert _code_lines(source) == {4, 7, 10, 11, 12, 13, 14}
    assert _function_lengths(source) == {"C.f": 6}
    assert _function_lengths("def outer():\n    def inner():\n        return 1\n    return inner\n") == {
        "outer": 4,
        "outer.inner": 2,
    }
