"""Settings: the example config documents every key, and bad input names the key."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import tomllib
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watcher.cli import main
from watcher.config import ConfigError
from watcher.settings import Settings
from watcher.settings_file import load_settings, parse_settings
from watcher.sinks.file import FileSinkSettings
from watcher.sinks.registry import SINK_SETTINGS as SINK_TYPES
from watcher.sinks.registry import sink_type_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.toml"


def _keys(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        if f.name in {"type", "name", "sinks"}:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            out |= _keys(hint, f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


EXAMPLE_ENV = {
    "SLACK_WEBHOOK_URL": "https://hooks.slack.invalid/services/T000/B000/XXXXXXXX",
    "PAGERDUTY_ROUTING_KEY": "0123456789abcdef0123456789abcdef",
    "INVENTORY_WEBHOOK_URL": "https://inventory.invalid/hooks/gpu",
    "INVENTORY_SIGNING_SECRET": "whsec_" + base64.b64encode(b"k" * 32).decode(),
    "INVENTORY_TOKEN": "token-0123456789",
}


@pytest.fixture
def example_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in EXAMPLE_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.mark.usefixtures("example_env")
def test_example_config_loads_and_documents_every_key() -> None:
    settings = load_settings(EXAMPLE)
    defaults = Settings(node=settings.node)
    # Every top-level value in the example is the default.
    assert dataclasses.replace(settings, sinks=defaults.sinks) == defaults
    assert {s.type for s in settings.sinks} == set(SINK_TYPES)
    text = EXAMPLE.read_text()
    documented = set(re.findall(r"^#?\s*([a-z_]+) = ", text, re.MULTILINE))
    leaves = {k.rsplit(".", 1)[-1] for k in _keys(Settings)}
    for sink in SINK_TYPES.values():
        leaves |= _keys(sink)
    assert leaves <= documented, f"undocumented keys: {sorted(leaves - documented)}"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"watch": {"intervall": 3}},
            "watch.intervall: unknown key (did you mean 'interval'?); allowed here: debounce, ",
        ),
        ({"watch": {"interval": -1}}, "watch.interval: out of range; expected between 0.05 and 86400"),
        ({"kubelet": {"timeout": "10s"}}, "kubelet.timeout: got a string; expected a number"),
        (
            {"kubelet": {"max_receive_bytes": 1.5}},
            "kubelet.max_receive_bytes: got a number; expected a whole number",
        ),
        ({"watch": {"force_polling": "yes"}}, "watch.force_polling: got a string; expected true or false"),
        ({"log": {"level": "loud"}}, "log.level: not one of the choices; expected one of 'debug', 'info'"),
        ({"log": {"level": 3}}, "log.level: got a whole number; expected one of 'debug', 'info'"),
        (
            {"sinks": {"x": {"type": "carrier-pigeon"}}},
            "sinks.x.type: not a known sink type; expected one of 'stdout', 'file'",
        ),
        (
            {"sinks": {"x": {"type": "file", "pth": "a"}}},
            "sinks.x.pth: unknown key (did you mean 'path'?); allowed here: fsync, fsync_interval, ",
        ),
        ({"sinks": []}, "sinks: got an empty list; expected a table of named sinks"),
        ({"sinks": {"x": {"type": "slack"}}}, "sinks.x.url: required for a slack sink (or url_file)"),
        ({"sinks": {"x": {"type": "slack", "url": "${NO_SUCH_VAR_1}"}}}, "sinks.x.url: environment variable"),
        (
            {"sinks": {"x": {"type": "webhook", "url": "http://a", "signing_secret": "nope-nope"}}},
            "sinks.x.signing_secret: expected a Standard Webhooks secret starting with whsec_",
        ),
        (
            {"sinks": {"x": {"type": "webhook", "url": "ftp://a"}}},
            "sinks.x.url: the value from inline value is not an http(s) URL",
        ),
        (
            {"sinks": {"x": {"type": "slack", "url": "http://x", "url_file": "y"}}},
            "sinks.x.url_file: set either url or url_file, not both",
        ),
        (
            {"sinks": {"x": {"type": "file", "kinds": []}}},
            "sinks.x.kinds: got an empty list; expected a list of non-empty strings",
        ),
        (
            {"sinks": {"x": {"type": "pagerduty", "routing_key_file": "/nonexistent/k"}}},
            "sinks.x.routing_key_file: cannot read secret file /nonexistent/k",
        ),
        (
            {"sinks": {"x": {"type": "alertmanager", "url": "am:9093"}}},
            "sinks.x.url: not an http(s) URL; expected http://HOST[:PORT]/... or https://...",
        ),
        ({"kubelet": 3}, "kubelet: got a whole number; expected a table"),
        ({"node": ""}, "node: got an empty string; expected a non-empty string"),
        ({"http": {"listen": "nowhere"}}, "http.listen: not HOST:PORT; expected e.g. 127.0.0.1:9108"),
        (
            {"sinks": {"x": {"type": "webhook", "url": "http://a", "headers": {"X-Key": 5}}}},
            "sinks.x.headers.X-Key: got a whole number; expected a string",
        ),
        (
            {"sinks": {"x": {"type": "webhook", "url": "http://a", "headers": ["Bearer abc"]}}},
            "sinks.x.headers: got a list; expected a table of strings",
        ),
    ],
)
def test_bad_values_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(doc)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_relative_paths_resolve_against_the_config_file_a_file_sinks_inside_state_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text('state_dir = "state"\n[sinks.audit]\ntype = "file"\npath = "logs/a.jsonl"\n')
    settings = load_settings(cfg)
    assert settings.state_dir == tmp_path / "state"
    sink = settings.sinks[0]
    assert isinstance(sink, FileSinkSettings)
    # As config.example.toml says: a file sink's relative path is inside state_dir (it was
    # resolved against the config file's directory, against the example, before).
    assert (sink.name, sink.path) == ("audit", Path("logs/a.jsonl"))
    log_of = sink_type_of(sink).audit_log
    assert log_of is not None and log_of(sink, settings.state_dir) == tmp_path / "state" / "logs" / "a.jsonl"


def test_node_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    assert Settings().node == "gpu-node-17"
    assert parse_settings({"node": "explicit"}).node == "explicit"


@pytest.mark.usefixtures("example_env")
def test_check_config_command(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK" in capfd.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[watch]\ninterval = 0\n")
    assert main(["check-config", str(bad)]) == 2
    err = capfd.readouterr().err
    assert err.strip() == (
        "pod-resources-watcher: error: watch.interval: out of range; expected between 0.05 and 86400"
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("[watch\n")
    assert main(["check-config", str(broken)]) == 2
    assert "not valid TOML" in capfd.readouterr().err
    assert main(["check-config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read config" in capfd.readouterr().err


def _all_fields() -> list[tuple[type, str]]:
    from watcher import settings as s

    classes = [
        s.Settings,
        s.KubeletSettings,
        s.WatchSettings,
        s.LogSettings,
        s.HttpSettings,
        *SINK_TYPES.values(),
    ]
    return [(cls, f.name) for cls in classes for f in dataclasses.fields(cls) if f.name not in {"type"}]


def test_every_setting_is_used_by_the_package() -> None:
    """A key nobody reads would load fine and do nothing: each one must be read somewhere."""
    code = "\n".join(
        p.read_text()
        for p in (ROOT / "watcher").rglob("*.py")
        if p.name not in {"settings.py", "settings_file.py"} and "kubeletapi" not in p.parts
    )
    # Each `.NAME` read and `NAME=` passed, found once (a search per key took seconds).
    used = set(re.findall(r"\.(\w+)", code)) | set(re.findall(r"\b(\w+)=", code))
    unused = sorted({name for _, name in _all_fields() if name not in used})
    assert unused == []


def _number_keys(cls: type, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], type]]:
    """Every number field of the settings dataclass `cls` (nested tables too), as its key path."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[tuple[str, ...], type]] = []
    for f in dataclasses.fields(cls):
        if f.name in {"type", "name", "sinks"}:
            continue
        hint = hints[f.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            out += _number_keys(hint, (*path, f.name))
        elif len(inner) == 1 and inner[0] in (int, float):
            out.append(((*path, f.name), inner[0]))
    return out


def _example_doc() -> dict[str, typing.Any]:
    return tomllib.loads(EXAMPLE.read_text())


def _float_keys() -> list[tuple[str, ...]]:
    """Every float key the loader reads: the agent's tables, then each sink type's, in the
    example config's table of that type (every other key there valid)."""
    sinks = _example_doc()["sinks"]
    keys = [k for k, kind in _number_keys(Settings, ()) if kind is float]
    for type_name, cls in SINK_TYPES.items():
        table = next(name for name, sink in sinks.items() if sink["type"] == type_name)
        keys += [k for k, kind in _number_keys(cls, ("sinks", table)) if kind is float]
    return keys


FLOAT_KEYS = _float_keys()
# The numbers TOML itself allows that are not finite, read as a TOML file's value is.
NOT_FINITE = {literal: tomllib.loads(f"x = {literal}")["x"] for literal in ("nan", "inf", "+inf", "-inf")}


def test_the_walk_finds_the_agents_and_every_sinks_float_keys() -> None:
    tables = {k[1] if k[0] == "sinks" else k[0] for k in FLOAT_KEYS if len(k) > 1}
    assert {"kubelet", "watch", "pods", "http"} <= tables
    assert len({k[1] for k in FLOAT_KEYS if k[0] == "sinks"}) == len(SINK_TYPES)
    assert ("kubelet", "warmup_grace") in FLOAT_KEYS


@pytest.mark.usefixtures("example_env")
@pytest.mark.parametrize("literal", NOT_FINITE)
def test_every_float_setting_refuses_nan_and_infinities_naming_the_key(literal: str) -> None:
    """TOML has nan, inf and -inf: nan passed every bound (a `warmup_grace = nan` held a lost
    plugin for ever) and inf every missing maximum. The example config, valid as it is, with one
    float key set to each in turn: always one error naming that key, whatever its bounds."""
    parse_settings(_example_doc())  # valid as it is: the error below is the number's
    value = NOT_FINITE[literal]
    missed = []
    for key in FLOAT_KEYS:
        doc = _example_doc()
        table = doc
        for part in key[:-1]:
            table = table.setdefault(part, {})
        table[key[-1]] = value
        try:
            parse_settings(doc)
        except ConfigError as err:
            expected = f"{'.'.join(key)}: got {value!r}; expected a finite number"
            if not str(err).startswith(expected):
                missed.append(f"{'.'.join(key)}: {err}")
        else:
            missed.append(f"{'.'.join(key)}: accepted")
    assert missed == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        # An integer past a float's range was an OverflowError traceback; it is out of range.
        ({"watch": {"interval": 10**400}}, "watch.interval: out of range; expected between 0.05 and 86400"),
        (
            {"sinks": {"x": {"type": "stdout", "max_age": 10**400}}},
            "sinks.x.max_age: out of range; expected at least 1",
        ),
        # A whole-number key given nan or inf says it wants a whole number.
        ({"watch": {"flap_limit": float("nan")}}, "watch.flap_limit: got a number; expected a whole number"),
        (
            {"kubelet": {"max_receive_bytes": float("inf")}},
            "kubelet.max_receive_bytes: got a number; expected a whole number",
        ),
    ],
)
def test_huge_integers_and_nan_in_whole_number_keys_name_the_key(
    doc: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(doc)
    assert str(info.value) == message


_VALUES = st.one_of(
    st.integers(min_value=-(10**9), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.booleans(),
    st.lists(st.text(max_size=5), max_size=3),
    st.builds(dict),  # a fresh {} each time: a shared one can end up inside itself
)
_SECTIONS = ["", "kubelet", "watch", "log", "http", "sinks.a", "sinks"]
_KEYS = sorted({name for _, name in _all_fields()} | {"typo", "intervall", "socket_file", "url_file"})


def _fuzz_config(edits: list[tuple[str, str, object]], sink_type: str, tmp_path: Path) -> Path:
    """A config file with one sink of `sink_type` and each (section, key, value) of `edits` set."""
    doc: dict[str, object] = {"sinks": {"a": {"type": sink_type}}}
    for section, key, value in edits:
        target: dict[str, object] = doc
        for part in filter(None, section.split(".")):
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                break
            target = nxt
        else:
            target[key] = value
    path = tmp_path / "fuzz.toml"
    path.write_text(_to_toml(doc))
    return path


# Configs generated per fuzzer: a sample in `make test`, the full run in `make chaos` (CI runs both).
_ANY_CONFIGS = [200, pytest.param(1000, marks=pytest.mark.chaos)]
_SECRET_CONFIGS = [150, pytest.param(500, marks=pytest.mark.chaos)]


@pytest.mark.slow  # hundreds of configs checked: seconds
@pytest.mark.parametrize("examples", _ANY_CONFIGS)
def test_any_config_gives_ok_or_one_clear_error_line_and_exit_2(
    examples: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(
        edits=st.lists(
            st.tuples(st.sampled_from(_SECTIONS), st.sampled_from(_KEYS), _VALUES), min_size=1, max_size=4
        ),
        sink_type=st.sampled_from([*SINK_TYPES, "carrier-pigeon"]),
    )
    def check(edits: list[tuple[str, str, object]], sink_type: str) -> None:
        path = _fuzz_config(edits, sink_type, tmp_path)
        code = main(["check-config", str(path)])
        err = capfd.readouterr().err
        assert code in (0, 2)
        if code == 2:
            lines = err.splitlines()
            assert len(lines) == 1, err
            assert lines[0].startswith("pod-resources-watcher: error: ")
            assert "Traceback" not in err

    check()


_MARK = "Zq9Leak"  # in every string the next test writes; no message of ours contains it
_MARKED = st.text(max_size=12).map(lambda t: _MARK + t)
_MARKED_VALUES = st.one_of(
    _MARKED,
    st.lists(_MARKED, max_size=3),
    st.dictionaries(st.sampled_from(["Authorization", "X-Api-Key"]), _MARKED | st.integers(), max_size=2),
    st.integers(),
    st.booleans(),
)
# `*_file` keys (secret files, TLS files) are paths, and one that cannot be read or used is
# named in its error: a path, not a secret.
_NO_SECRET_FILES = [k for k in _KEYS if not k.endswith("_file")]


@pytest.mark.slow  # hundreds of configs checked: seconds
@pytest.mark.parametrize("examples", _SECRET_CONFIGS)
def test_a_config_error_never_shows_a_value_it_was_given(
    examples: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Whatever key a value lands in, wrongly typed or out of place, the error names the key and
    says what kind of value it got: a token pasted into the wrong key never reaches the terminal."""

    @settings(max_examples=examples, deadline=None)
    @given(
        edits=st.lists(
            st.tuples(st.sampled_from(_SECTIONS), st.sampled_from(_NO_SECRET_FILES), _MARKED_VALUES),
            min_size=1,
            max_size=4,
        ),
        sink_type=st.sampled_from([*SINK_TYPES, "carrier-pigeon"]),
    )
    def check(edits: list[tuple[str, str, object]], sink_type: str) -> None:
        path = _fuzz_config(edits, sink_type, tmp_path)
        if main(["check-config", str(path)]) == 2:
            out, err = capfd.readouterr()
            assert out == "" and _MARK not in err, err
        else:
            capfd.readouterr()

    check()


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _to_toml(doc: dict[str, object], prefix: str = "") -> str:
    """A small TOML writer for the fuzzer (the standard library only reads TOML)."""
    plain = {k: v for k, v in doc.items() if not isinstance(v, dict) or not v}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict) and v}
    out = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in plain.items()]
    for k, v in tables.items():
        name = f"{prefix}.{json.dumps(k)}" if prefix else json.dumps(k)
        assert isinstance(v, dict)
        out.append(f"\n[{name}]")
        out.append(_to_toml(v, name))
    return "\n".join(out) + "\n"
