"""How the fake API server decodes what it receives: apiVersion and kind defaulted from the URL,
times parsed as the real decoder parses them, and, with a schema check plugged in, the object's
OpenAPI schema enforced strictly (an unknown field or a wrong JSON type is a 400, a broken rule a
422, worded as the real server words them).

The schema check is a plug-in (`SchemaCheck`): the schemas come with a test dependency, so the
tests pass one in and the demo runs without it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Protocol

from watcher.sim.apiserver.errors import (
    ApiError,
    FieldError,
    bad_request,
    decode_error,
    invalid_error,
    required,
)
from watcher.sim.apiserver.kinds import Kind
from watcher.sim.apiserver.values import Json, dig

__all__ = ["SchemaCheck", "SchemaViolation", "decode", "defaults"]

_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


@dataclasses.dataclass(frozen=True)
class SchemaViolation:
    """The first way an object breaks its OpenAPI schema, in JSON Schema's terms."""

    keyword: str  # the JSON Schema keyword that failed: additionalProperties, type, required, ...
    path: tuple[str | int, ...]  # where in the object, from its root
    message: str
    unknown_fields: tuple[str, ...] = ()  # additionalProperties: the fields the schema does not have
    value_type: str = ""  # type: the Python type of the value found
    schema_type: str = ""  # type: the JSON type the schema asks for
    missing: str = ""  # required: the field that is missing


class SchemaCheck(Protocol):
    """Checks an object against the OpenAPI schema of its kind in one Kubernetes version."""

    @property
    def version(self) -> str: ...

    def __call__(self, obj: Json) -> SchemaViolation | None: ...


def _times(obj: Json, kind: Kind) -> list[tuple[tuple[str, ...], Any]]:
    """The time fields the decoder parses, with where they are."""
    found: list[tuple[tuple[str, ...], Any]] = []
    meta: Json = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    for f in ("creationTimestamp", "deletionTimestamp"):
        if f in meta:
            found.append((("metadata", f), meta[f]))
    if kind.kind == "Event":
        for f in ("eventTime", "deprecatedFirstTimestamp", "deprecatedLastTimestamp"):
            if f in obj:
                found.append(((f,), obj[f]))
        series = obj.get("series")
        if isinstance(series, dict) and "lastObservedTime" in series:
            found.append((("series", "lastObservedTime"), series["lastObservedTime"]))
    if kind.kind == "Node":
        conditions = dig(obj, ("status", "conditions"))
        for i, c in enumerate(conditions if isinstance(conditions, list) else []):
            for f in ("lastHeartbeatTime", "lastTransitionTime"):
                if isinstance(c, dict) and f in c:
                    found.append((("status", "conditions", str(i), f), c[f]))
    if kind.kind == "Lease":
        for f in ("renewTime", "acquireTime"):
            if isinstance(obj.get("spec"), dict) and f in obj["spec"]:
                found.append((("spec", f), obj["spec"][f]))
    return found


# A time layout in Go's terms, element by element: fixed digits, literal text, the fraction, the zone.
_LAYOUT_PARTS = re.compile(r"2006|01|02|15|04|05|\.0+|Z07:00|[^0-9Z.]+")


def _go_time_error(value: str, layout: str) -> str | None:
    """What Go's time.Parse says of `value` that does not fit `layout` ("cannot parse "Z" as
    ".000000""), or None where its wording is not modelled here (a field out of range)."""
    rest = value
    for part in _LAYOUT_PARTS.findall(layout):
        if part[0].isdigit():
            size = 4 if part == "2006" else 2
            ok = len(rest) >= size and rest[:size].isdigit()
            taken = size
        elif part.startswith("."):
            size = len(part)
            ok = len(rest) >= size and rest[0] == "." and rest[1:size].isdigit()
            taken = size
        elif part == "Z07:00":
            ok = rest.startswith("Z") or (len(rest) >= 6 and rest[0] in "+-" and rest[3] == ":")
            taken = 1 if rest.startswith("Z") else 6
        else:
            ok, taken = rest.startswith(part), len(part)
        if not ok:
            return f'cannot parse "{rest}" as "{part}"'
        rest = rest[taken:]
    return None


def _field_path(parts: Sequence[Any]) -> str:
    """A schema error's path as the real server writes a field: `status.conditions[1].type`."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def decode(kind: Kind, body: Any, schema: SchemaCheck | None) -> Json:
    """The body as the server decodes it: apiVersion/kind defaulted from the URL, and, with the
    schema, unknown fields and wrong JSON types refused (400) and the schema's rules (422)."""
    if not isinstance(body, dict):
        raise decode_error(kind, "json: cannot unmarshal non-object into Go value")
    obj = copy.deepcopy(body)
    if (
        obj.setdefault("apiVersion", kind.api_version) != kind.api_version
        or obj.setdefault("kind", kind.kind) != kind.kind
    ):
        raise bad_request(
            f"the API version in the data ({obj['apiVersion']}) does not match the expected API version "
            f"({kind.api_version})"
            if obj["apiVersion"] != kind.api_version
            else f"the kind in the data ({obj['kind']}) does not match the expected kind ({kind.kind})"
        )
    for path, value in _times(obj, kind):
        pattern, layout = (
            (_MICRO_TIME, "2006-01-02T15:04:05.000000Z07:00")
            if path[-1] in ("eventTime", "lastObservedTime", "renewTime", "acquireTime")
            else (_TIME, "2006-01-02T15:04:05Z07:00")
        )
        if value is not None and (not isinstance(value, str) or not pattern.fullmatch(value)):
            problem = _go_time_error(value, layout) if isinstance(value, str) else None
            problem = problem or f"cannot parse {'.'.join(path)}"
            raise decode_error(kind, f'parsing time "{value}" as "{layout}": {problem}')
    if schema is not None:
        violation = schema(obj)
        if violation is not None:
            raise _schema_error(kind, obj, violation)
    return defaults(kind, obj)


def defaults(kind: Kind, obj: Json) -> Json:
    """`obj` as the real server holds and serves it once decoded: a Node's allocatable defaulted
    from its capacity when it has none (SetDefaults_NodeStatus), and the fields a Go struct always
    serializes, an unset time as null and an empty struct as {}: a Node condition's two times, an
    events.k8s.io Event's deprecatedSource and deprecated timestamps. Admission sees them too."""
    if kind.kind == "Node" and isinstance(obj.get("status"), dict):
        status = obj["status"]
        if isinstance(status.get("capacity"), dict) and status.get("allocatable") is None:
            status["allocatable"] = copy.deepcopy(status["capacity"])
        for condition in status.get("conditions") or []:
            if isinstance(condition, dict):
                condition.setdefault("lastHeartbeatTime", None)
                condition.setdefault("lastTransitionTime", None)
    if kind.kind == "Event" and kind.group == "events.k8s.io":
        obj.setdefault("deprecatedSource", {})
        obj.setdefault("deprecatedFirstTimestamp", None)
        obj.setdefault("deprecatedLastTimestamp", None)
    return obj


def _schema_error(kind: Kind, obj: Json, v: SchemaViolation) -> ApiError:
    """A schema violation as the real server answers it with fieldValidation=Strict."""
    where = _field_path(v.path)
    if v.keyword == "additionalProperties":
        fields = ", ".join(f'unknown field "{".".join(filter(None, [where, u]))}"' for u in v.unknown_fields)
        return decode_error(kind, f"strict decoding error: {fields}")
    if v.keyword == "type":
        return decode_error(
            kind,
            f"json: cannot unmarshal {v.value_type} into Go struct field {where} of type {v.schema_type}",
        )
    name = dig(obj, ("metadata", "name")) or ""
    if v.keyword == "required":
        return invalid_error(kind, name, [required(".".join(filter(None, [where, v.missing])))])
    return invalid_error(kind, name, [FieldError("FieldValueInvalid", where, f"Invalid value: {v.message}")])
