"""The documentation stands alone: every relative link in the Markdown files leads to a file in the
repository, and nothing (docs, code comments, deploy files) points at a path outside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "node_modules"}
TEXT = {".md", ".py", ".toml", ".yaml", ".yml", ".json", ".txt", ".proto", ".service", ".env", ""}
# A relative path that climbs: it must still land inside the repository, which is all a reader has.
CLIMBING = re.compile(r"(?<![\w./])((?:\.\./)+[\w][\w./-]*)")
ROOT_NAME = "pod-resources-watcher"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _files() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and not SKIP.intersection(path.relative_to(ROOT).parts)
        and path.suffix in TEXT
        and not path.name.endswith(".egg-info")
    ]


def _relative_links(path: Path) -> list[str]:
    return [
        link.split("#")[0]
        for link in LINK.findall(path.read_text(encoding="utf-8"))
        if not re.match(r"[a-z]+:|#", link)
    ]


def test_nothing_points_outside_the_repository() -> None:
    """No doc, comment or deploy file names a path above the repository (notes kept beside it, a
    sibling checkout): a reader of the repository has only the repository."""
    files = _files()
    assert ROOT / "README.md" in files and ROOT / "watcher" / "cli" / "__init__.py" in files
    climbing = 0
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for target in CLIMBING.findall(line):
                climbing += 1
                # Climbing to a file or folder of the repository is fine (kustomize bases); above
                # it, or to nothing there, it names what a reader does not have.
                # An example of a user's own files beside a checkout of this repository names
                # the checkout by the project's name: that is the repository too.
                if target.replace("../", "").startswith(f"{ROOT_NAME}/"):
                    continue
                resolved = (path.parent / target.rstrip(".")).resolve()
                if not resolved.is_relative_to(ROOT) or not resolved.exists():
                    found.append(f"{path.relative_to(ROOT)}:{n}: {target}")
    assert climbing > 0  # the overlays climb to the base: the check does look at something
    assert found == []


def test_every_relative_markdown_link_leads_to_a_file_in_the_repository() -> None:
    checked = 0
    for path in ROOT.rglob("*.md"):
        if SKIP.intersection(path.relative_to(ROOT).parts):
            continue
        for link in _relative_links(path):
            target = (path.parent / link).resolve()
            assert target.is_relative_to(ROOT), f"{path.relative_to(ROOT)}: {link} leaves the repository"
            assert target.exists(), f"{path.relative_to(ROOT)}: {link} does not exist"
            checked += 1
    assert checked >= 1


def test_the_readme_links_the_kubelet_facts() -> None:
    """The kubelet behaviour the agent is built around is written down in the repository itself."""
    assert "docs/kubelet.md" in _relative_links(ROOT / "README.md")
    text = (ROOT / "docs" / "kubelet.md").read_text(encoding="utf-8")
    for fact in ("`List`", "`GetAllocatableResources`", "replaced on every restart", "warm-up", "rate limit"):
        assert fact in text, fact
