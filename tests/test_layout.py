"""The import layering the README's "Layout" section documents, enforced.

Layers, lowest first: a module may import from its own unit and from lower layers only; units
marked as peers (kubelet, store, sinks; delivery, ops, settings) never import each other (the
foundation's small modules may). The pure
core (model/, and the kubelet's health machine) imports no I/O library at all.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "watcher"

# (units, peers?): a unit is a top-level module or sub-package of `watcher`.
LAYERS: list[tuple[set[str], bool]] = [
    (
        {"__init__", "errors", "config", "secrets", "files", "tls", "backoff", "ratelimit"}
        | {"supervision", "kubeletapi", "allocator"},
        False,
    ),
    ({"model"}, True),
    ({"kubelet", "store", "sinks"}, True),
    ({"delivery", "ops", "settings"}, True),
    ({"cycle"}, True),
    ({"status"}, True),
    ({"app"}, True),
    ({"sim", "snapshot", "snapshot_html", "cli", "__main__"}, False),
]
PURE = ["model", "kubelet/health.py"]
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
    raise AssertionError(f"watcher.{unit} is in no layer: add it to LAYERS and the README's Layout")


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


README = PACKAGE.parent / "README.md"


def _layout_section() -> str:
    text = README.read_text()
    start = text.index("## Layout")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_layout_names_every_module() -> None:
    section = _layout_section()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in MODULES
        if p.name != "__init__.py" and p.parent.name != "__pycache__" and p.name not in section
    ]
    assert not missing, f"README's Layout does not list: {missing}"


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
        assert path.is_file(), f"README names {file}, which does not exist"
        assert name.rstrip(".") in _defined(path), f"README names {file}:{name}, which does not exist"


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
