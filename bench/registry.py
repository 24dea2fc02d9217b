"""The sections of `make bench`: each module of `bench/sections/` registers what it measures (a
`Section`: its `--only` name, its plan for a full and a quick run, the coroutine that returns its
typed result) and the parts of BENCHMARKS.md it renders (a `Part`: where it goes, and how it
reads the results). The driver (bench/run.py) and the report (bench/report.py) only walk the
registry, so adding a section is adding a module."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

__all__ = ["Part", "Results", "Section", "chosen", "groups", "part", "parts", "section", "sections"]

P = TypeVar("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Section(Generic[P, R]):
    """One measurement: `run(full)` for `make bench`, `run(quick)` for a smoke run."""

    name: str  # its --only name
    title: str
    order: int  # run order: one after the other (on 2 cores, two at once would measure each other)
    full: P
    quick: P
    run: Callable[[P], Awaitable[R]]
    group: str | None = None  # an --only name that stands for several sections


@dataclass(frozen=True)
class Part:
    """A piece of BENCHMARKS.md: `place` orders the file (chapter, then piece); `render` gives its
    lines from the results, none when what it reads did not run."""

    place: tuple[int, int]
    render: Callable[[Results], list[str]]


class Results:
    """What the sections of one run returned, by section, and whether the run was a quick one."""

    def __init__(self, by_name: dict[str, object], *, quick: bool = False) -> None:
        self.by_name = dict(by_name)
        self.quick = quick

    def get(self, of: Section[Any, R]) -> R | None:
        return cast("R | None", self.by_name.get(of.name))

    def ran(self, *names: str) -> bool:
        return any(n in self.by_name for n in names)


_SECTIONS: dict[str, Section[Any, Any]] = {}
_PARTS: list[Part] = []


def section(s: Section[P, R]) -> Section[P, R]:
    """Register `s`; returned, so that its module keeps a handle for its parts."""
    if _SECTIONS.setdefault(s.name, s) is not s:
        raise ValueError(f"two sections named {s.name!r}")
    return s


def part(
    place: tuple[int, int],
) -> Callable[[Callable[[Results], list[str]]], Callable[[Results], list[str]]]:
    """Register the decorated function as the part of the report at `place`."""

    def register(render: Callable[[Results], list[str]]) -> Callable[[Results], list[str]]:
        _PARTS.append(Part(place, render))
        return render

    return register


def _load() -> None:
    from bench import sections as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def sections() -> list[Section[Any, Any]]:
    """Every section, in run order."""
    _load()
    return sorted(_SECTIONS.values(), key=lambda s: s.order)


def parts() -> list[Part]:
    """Every part of the report, in the file's order."""
    _load()
    return sorted(_PARTS, key=lambda p: p.place)


def groups(of: Sequence[Section[Any, Any]]) -> dict[str, tuple[str, ...]]:
    """The group names among sections `of` and the sections each stands for, in run order."""
    out: dict[str, tuple[str, ...]] = {}
    for s in of:
        if s.group is not None:
            out[s.group] = (*out.get(s.group, ()), s.name)
    return out


def chosen(only: str | None, names: Sequence[str]) -> list[str]:
    """The sections `--only` asks for (comma-separated names or groups), in run order."""
    if only is None:
        return list(names)
    grouped = groups(sections())
    wanted: set[str] = set()
    for name in only.split(","):
        name = name.strip()
        if name not in names and name not in grouped:
            raise SystemExit(f"--only: no section {name!r}; one of {', '.join([*names, *grouped])}")
        wanted.update(grouped.get(name, (name,)))
    return [n for n in names if n in wanted]
