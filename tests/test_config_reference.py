"""The configuration's documentation cannot drift from the settings: docs/configuration.md is what
the generator makes of the fields' doc strings, and config.example.toml sets only real keys, each
with its real default unless it says otherwise."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from testkit.config_reference import reference
from watcher.config import field_meta
from watcher.model.events import Event
from watcher.settings import Settings
from watcher.sinks import registry
from watcher.sinks.base import BaseSinkSettings, Outcome, SinkContext
from watcher.sinks.registry import SinkType, find, sink_types

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "config.example.toml"

TABLE = re.compile(r"\[([\w.]+)\]\s*(#.*)?$")
# `key = value`, or `#   key = value` for a commented-out one; the indent is kept to tell the
# block of keys every sink shares (indented, under a top-level table) from a table's own keys.
KEY = re.compile(r"(?P<hash>#(?P<indent> +))?(?P<key>\w+) = (?P<rest>.*)$")
# A value that is not the field's default says which is: `min_severity = "warning"  # default: "info"`.
STATED_DEFAULT = re.compile(r"#\s*default:\s*(?P<value>.+?)\s*$")


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference(), (
        "docs/configuration.md is stale: run `make docs` (python -m testkit.config_reference)"
    )


def test_the_reference_lists_every_table_and_sink_type() -> None:
    page = PAGE.read_text(encoding="utf-8")
    hints = typing.get_type_hints(Settings)
    for f in dataclasses.fields(Settings):
        if dataclasses.is_dataclass(hints[f.name]):
            assert f"## [{f.name}]" in page, f.name
    for kind in sink_types():
        assert f'### type = "{kind.name}"' in page, kind.name


@dataclass(frozen=True)
class _ChimeSinkSettings(BaseSinkSettings):
    """A sink type a test registers: the reference must show it without being told."""

    type: Literal["chime"] = "chime"
    volume: int = field(default=3, metadata=field_meta("How loud the chime is.", min=1, max=11))


@dataclass(frozen=True)
class _MuteSinkSettings(BaseSinkSettings):
    type: Literal["mute"] = "mute"
    volume: int = field(default=3)  # no doc string


class _Chime:
    def __init__(self, settings: BaseSinkSettings, context: SinkContext) -> None:
        self._settings = settings

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def settings(self) -> BaseSinkSettings:
        return self._settings

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        return Outcome.ok()

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
def chime() -> Iterator[None]:
    registry.register(SinkType(name="chime", settings=_ChimeSinkSettings, factory=_Chime))
    try:
        yield
    finally:
        registry.unregister("chime")


@pytest.mark.usefixtures("chime")
def test_a_new_sink_type_is_in_the_reference_with_its_keys() -> None:
    page = reference()
    section = page[page.index('### type = "chime"') :]
    assert "| `volume` | integer | `3` | 1 to 11 | How loud the chime is. |" in section
    assert '`"chime"`' in page  # among the types a sink table may name


def test_a_field_without_a_doc_string_is_refused_by_name() -> None:
    registry.register(SinkType(name="mute", settings=_MuteSinkSettings, factory=_Chime))
    try:
        with pytest.raises(ValueError, match=r"_MuteSinkSettings\.volume has no doc string"):
            reference()
    finally:
        registry.unregister("mute")


def _default(f: dataclasses.Field[Any]) -> Any:
    """The default a config file could show, or None: unset, computed where it runs (the node
    name), or an empty table or list (an example of entries is no claim about the default)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if not isinstance(value, Mapping | tuple | list) or not value:
            return None
    else:
        return None
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _shared_sink_fields() -> dict[str, dataclasses.Field[Any]]:
    """The keys the settings classes of several sink types inherit, from the most shared base (a
    base only one sink type has, such as the kubernetes sink's connection keys, is its own)."""
    kinds = list(sink_types())
    uses = Counter(base for kind in kinds for base in kind.settings.__mro__[1:])
    found: dict[str, dataclasses.Field[Any]] = {}
    for kind in kinds:
        for base in reversed(kind.settings.__mro__[1:]):
            if dataclasses.is_dataclass(base) and uses[base] > 1:
                found.update({f.name: f for f in dataclasses.fields(base)})
    return found


def _fields(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def test_config_example_sets_real_keys_with_their_defaults() -> None:
    """Every key config.example.toml sets, or shows commented out as `# key = value`, is a field
    of its table, and the value it shows is the field's default, unless the line says
    `# default: VALUE`, which must then be the real default."""
    text = EXAMPLE.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    sink_kinds = {name: table["type"] for name, table in data.get("sinks", {}).items()}
    tables: dict[str, dict[str, dataclasses.Field[Any]]] = {"": _fields(Settings)}
    hints = typing.get_type_hints(Settings)
    for f in dataclasses.fields(Settings):
        if dataclasses.is_dataclass(hints[f.name]):
            tables[f.name] = _fields(hints[f.name])
    for name, kind in sink_kinds.items():
        sink_type = find(kind)
        assert sink_type is not None, f"[sinks.{name}]: no sink type {kind!r}"
        tables[f"sinks.{name}"] = _fields(sink_type.settings)
    shared = _shared_sink_fields()

    table, problems, seen, checked = "", [], set(), 0
    for n, line in enumerate(text.splitlines(), 1):
        header = TABLE.match(line)
        if header:
            table = header.group(1)
            assert table in tables, f"config.example.toml:{n}: [{table}] is no table of the settings"
            continue
        match = KEY.match(line)
        if not match:
            continue
        try:
            ((key, value),) = tomllib.loads(f"{match['key']} = {match['rest']}").items()
        except tomllib.TOMLDecodeError:
            assert match["hash"], f"config.example.toml:{n}: unparsed key line"
            continue  # prose that happens to start like a key
        if match["hash"] and len(match["indent"]) > 1 and not table.startswith("sinks."):
            fields, where = shared, "every sink"
        else:
            fields, where = tables[table], f"[{table}]" if table else "the top level"
            if not match["hash"]:
                seen.add((table, key))
        if key == "type" and table.startswith("sinks."):
            continue
        stem = key.removesuffix("_file")
        if key not in fields and not (stem in fields and fields[stem].metadata.get("secret")):
            problems.append(f"config.example.toml:{n}: {key} is not a key of {where}")
            continue
        if key not in fields:
            continue  # a secret's file: no default
        checked += 1
        default = _default(fields[key])
        stated = STATED_DEFAULT.search(match["rest"])
        if stated:
            claimed = tomllib.loads(f"v = {stated['value']}")["v"]
            if claimed != default:
                problems.append(
                    f"config.example.toml:{n}: {key}: says its default is {claimed!r}, it is {default!r}"
                )
        elif default is not None and value != default:
            problems.append(
                f"config.example.toml:{n}: {key} = {value!r} but its default is {default!r} "
                "(set the default, or add `# default: VALUE`)"
            )
    assert problems == [], "\n".join(problems)
    # The line-by-line reading saw every key the file sets.
    expected = {("", k) for k, v in data.items() if not isinstance(v, dict)}
    expected |= {(t, k) for t, v in data.items() if t != "sinks" and isinstance(v, dict) for k in v}
    expected |= {(f"sinks.{s}", k) for s, v in data.get("sinks", {}).items() for k in v}
    assert seen == expected
    assert checked > 100
