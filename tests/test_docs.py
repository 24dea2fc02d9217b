"""The documentation stands alone: every relative link in the Markdown files leads to a file in the
repository, and nothing (docs, code comments, deploy files) points at a path outside it."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Not the repository's text: virtualenvs (.bench/ holds the benchmarks' runtime-only one), caches,
# .peers/ (the Go test peers `make peers` builds; extensionless binaries would read as text) and
# .build/ (the images and the static pause binary, testkit/pause_image.py), .tools/ (helm and
# kubectl, which `make tools` fetches).
SKIP = {
    ".git",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "node_modules",
    ".peers",
    ".bench",
    ".build",
    ".tools",
}
TEXT = {".md", ".py", ".toml", ".yaml", ".yml", ".json", ".txt", ".proto", ".service", ".env", ""}
# A relative path that climbs: it must still land inside the repository, which is all a reader has.
CLIMBING = re.compile(r"(?<![\w./])((?:\.\./)+[\w][\w./-]*)")
ROOT_NAME = "pod-resources-watcher"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _files() -> list[Path]:
    # Pruned as it walks: rglob would go through all of .venv/ and .git/ first, to leave them out.
    found = []
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in SKIP and not d.endswith(".egg-info")]
        found += [Path(directory, name) for name in names if Path(name).suffix in TEXT]
    return found


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


def test_the_readme_is_a_front_door() -> None:
    """The README stays short: the reference lives in docs/, and every page there is linked from
    the README's table, so none is left where no reader finds it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    table = {
        line.split("](")[1].split(")")[0]
        for line in readme.splitlines()
        if line.startswith("| [") and "](" in line
    }
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages, "docs/ has no pages"
    assert pages <= table, f"not in the README's table: {sorted(pages - table)}"
    for beside in ("BENCHMARKS.md", "RELIABILITY.md", "SECURITY.md", "CHANGELOG.md", "deploy/README.md"):
        assert beside in table, beside


# A measured figure: a duration under a second, a size, a share, a ratio ("9.8 ms", "84 MiB", "0.3 %").
FIGURE = re.compile(r"\b\d[\d,.]*\s?(?:ms|µs|KiB|MiB|GiB|%)(?!\w)|\b\d[\d,.]*x faster")


def test_the_readme_quotes_no_benchmark_figure_and_links_the_generated_file() -> None:
    """Figures live in BENCHMARKS.md, which `make bench` writes: a figure copied into the README
    goes stale at the next run, so the README links the file instead."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert FIGURE.findall(readme) == []
    assert "BENCHMARKS.md" in _relative_links(ROOT / "README.md")
    assert FIGURE.findall("9.8 ms to the stored event, 84.1 MiB, 0.267 %, 144x faster") == [
        "9.8 ms",
        "84.1 MiB",
        "0.267 %",
        "144x faster",
    ]
    # BENCHMARKS.md opens as bench/report.py writes it: which command regenerates it.
    from bench.registry import Results
    from bench.report import report

    generated = report(Results({}), datetime.now(UTC), 60.0, "bench/run.py").splitlines()[2]
    committed = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()[2]
    assert generated.startswith("Generated by `make bench` (`bench/run.py`) on ")
    assert committed.startswith("Generated by `make bench` (`bench/run.py`) on ")


# A ```toml block whose first line is this comment is a whole config file, loaded as such below.
COMPLETE = "# a complete config"


def _complete_configs() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```toml\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S):
            if block.startswith(COMPLETE + "\n"):
                found.append((str(path.relative_to(ROOT)), block))
    return found


def test_the_docs_complete_configs_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each config the docs present as complete loads with the agent's own loader, as `run` and
    `check-config` would read it; the ${ENV} it refers to is set, as a user would."""
    from watcher.settings_file import load_settings

    configs = _complete_configs()
    assert len(configs) >= 2  # the README's Slack and webhook configs at least
    for n, (where, text) in enumerate(configs):
        for name in set(re.findall(r"\$\{(\w+)\}", text)):
            monkeypatch.setenv(name, "https://receiver.invalid/hooks/T0")
        path = tmp_path / f"config-{n}.toml"
        path.write_text(text)
        try:
            load_settings(path)
        except Exception as err:  # the message names the key; say which doc holds the block
            raise AssertionError(f"{where}: a complete config does not load: {err}") from err


# One line per grant in SECURITY.md's Kubernetes API section: "- `verb`, `verb` on `resource` (`group`):"
# (core for the core group).
GRANT_LINE = re.compile(
    r"^  - ((?:`[a-z]+`, )*`[a-z]+`) on `([a-z]+(?:/[a-z]+)?)` \((?:`([a-z0-9.-]+)`|core)\):", re.M
)


def _security_md_grants() -> set[tuple[str, str, str]]:
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    section = text.split("### The Kubernetes API", 1)[1].split("\n### ", 1)[0]
    return {
        (group or "", resource, verb)
        for verbs, resource, group in GRANT_LINE.findall(section)
        for verb in re.findall(r"`([a-z]+)`", verbs)
    }


def test_security_md_lists_exactly_the_shipped_rbac_grants() -> None:
    """SECURITY.md says what the agent's token may do: the grants it lists are every Role's and
    ClusterRole's rules in the kustomize base and overlays (the chart's equal the overlay's:
    tests/test_helm.py), no more and no fewer."""
    from testkit.manifests import BASE, OVERLAYS, build

    shipped = {
        (group, resource, verb)
        for directory in (BASE, *OVERLAYS.values())
        for obj in build(directory)
        if obj["kind"] in ("Role", "ClusterRole")
        for rule in obj["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert shipped, "no Role or ClusterRole shipped: the check would pass on nothing"
    assert _security_md_grants() == shipped
