"""The fake API server's objects: the kinds it serves, its Status errors, how it decodes and
validates what it receives (as the real server: pkg/apis/core/validation/events.go for
events.k8s.io/v1, the OpenAPI schema through kubernetes_validate), the core v1 view of an
events.k8s.io/v1 Event (pkg/apis/events/v1/conversion.go), and field and label selectors.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from watcher.sim.fake_apiserver_patch import MergeKeys

Json = dict[str, Any]

_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real server's generateName uses
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_CONDITION_STATUSES = ("True", "False", "Unknown")


@dataclasses.dataclass(frozen=True)
class Kind:
    group: str
    resource: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified_resource(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
KINDS: dict[tuple[str, str], Kind] = {
    k: v
    for v in (
        Kind("", "nodes", "Node", False, _ALL_VERBS, ("no",), ("status",)),
        Kind("", "pods", "Pod", True, _ALL_VERBS, ("po",)),
        Kind(
            "",
            "namespaces",
            "Namespace",
            False,
            ("create", "delete", "get", "list", "patch", "update"),
            ("ns",),
        ),
        Kind("", "events", "Event", True, _ALL_VERBS, ("ev",)),
        Kind("events.k8s.io", "events", "Event", True, _ALL_VERBS, ("ev",)),
        Kind("coordination.k8s.io", "leases", "Lease", True, _ALL_VERBS),
    )
    for k in [(v.group, v.resource)]
}
EVENTS = KINDS[("events.k8s.io", "events")]
CORE_EVENTS = KINDS[("", "events")]

# Lists merged by key under a strategic merge patch (the patchMergeKey tags of k8s.io/api).
MERGE_KEYS: dict[str, MergeKeys] = {
    "Node": {
        ("metadata", "ownerReferences"): "uid",
        ("metadata", "finalizers"): "",
        ("spec", "taints"): "key",
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
        ("status", "volumesAttached"): "name",
    },
    "Event": {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""},
    "Lease": {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""},
}

# The fields a list's fieldSelector may name, per kind and view (the real server's selectable
# fields, with events.k8s.io's names converted to the stored ones); anything else is a 400.
_EVENT_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "reason": ("reason",),
    "type": ("type",),
    "reportingComponent": ("reportingController",),
    **{
        f"involvedObject.{f}": ("regarding", f)
        for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    },
}
_SOURCE = ("deprecatedSource", "component")
_SELECTABLE: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("", "events"): {**_EVENT_FIELDS, "source": _SOURCE},
    ("events.k8s.io", "events"): {
        **{k: v for k, v in _EVENT_FIELDS.items() if not k.startswith(("involvedObject.", "reporting"))},
        "reportingController": ("reportingController",),
        **{f"regarding.{p[1]}": p for k, p in _EVENT_FIELDS.items() if k.startswith("involvedObject.")},
    },
    ("", "pods"): {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
        "spec.nodeName": ("spec", "nodeName"),
        "status.phase": ("status", "phase"),
    },
    ("", "nodes"): {"metadata.name": ("metadata", "name"), "spec.unschedulable": ("spec", "unschedulable")},
    ("", "namespaces"): {"metadata.name": ("metadata", "name"), "status.phase": ("status", "phase")},
    ("coordination.k8s.io", "leases"): {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
    },
}


class ApiError(Exception):
    """An answer other than success, as a v1 Status."""

    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Json:
        body: Json = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body |= {"message": self.message, "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One field.Error of the real validation: `field: Body`."""

    type: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, FieldValueDuplicate
    field: str
    body: str

    def cause(self) -> Json:
        return {"reason": self.type, "message": self.body, "field": self.field}


def required(field: str) -> FieldError:
    return FieldError("FieldValueRequired", field, "Required value")


def invalid(field: str, value: Any, detail: str) -> FieldError:
    shown = json.dumps(value) if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return FieldError("FieldValueInvalid", field, f"Invalid value: {shown}: {detail}")


def not_found(kind: Kind, name: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.resource} if kind.group else None
    details = details or {"name": name, "kind": kind.resource}
    return ApiError(404, "NotFound", f'{kind.qualified_resource} "{name}" not found', details)


def conflict(kind: Kind, name: str) -> ApiError:
    message = (
        f'Operation cannot be fulfilled on {kind.qualified_resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    details: Json = {"name": name, "kind": kind.resource} | ({"group": kind.group} if kind.group else {})
    return ApiError(409, "Conflict", message, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid_error(kind: Kind, name: str, errors: Sequence[FieldError]) -> ApiError:
    listed = [f"{e.field}: {e.body}" for e in errors]
    summary = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
    details: Json = {"name": name, "kind": kind.kind, "causes": [e.cause() for e in errors]}
    if kind.group:
        details["group"] = kind.group
    return ApiError(422, "Invalid", f'{kind.qualified_kind} "{name}" is invalid: {summary}', details)


def decode_error(kind: Kind, detail: str) -> ApiError:
    return bad_request(f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: {detail}')


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def timestamp(t: dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: dt.datetime | None = None) -> str:
    """A MicroTime as the real server writes one: six fractional digits, UTC."""
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dig(obj: Any, path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def resource_list(group: str) -> Json:
    resources: list[Json] = []
    for k in KINDS.values():
        if k.group != group:
            continue
        entry: Json = {
            "name": k.resource,
            "singularName": k.kind.lower(),
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": list(k.verbs),
        }
        if k.short_names:
            entry["shortNames"] = list(k.short_names)
        resources.append(entry)
        for sub in k.subresources:
            resources.append(
                {
                    "name": f"{k.resource}/{sub}",
                    "singularName": "",
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1" if group else "v1",
        "resources": resources,
    }


VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.8",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def core_event(event: Json) -> Json:
    """The core v1 view of a stored events.k8s.io/v1 Event (pkg/apis/events/v1/conversion.go)."""
    out: Json = {"kind": "Event", "apiVersion": "v1", "metadata": copy.deepcopy(event.get("metadata", {}))}
    out["involvedObject"] = copy.deepcopy(event.get("regarding", {}))
    out["reason"] = event.get("reason", "")
    out["message"] = event.get("note", "")
    out["source"] = copy.deepcopy(event.get("deprecatedSource", {}))
    out["firstTimestamp"] = event.get("deprecatedFirstTimestamp")
    out["lastTimestamp"] = event.get("deprecatedLastTimestamp")
    if event.get("deprecatedCount"):
        out["count"] = event["deprecatedCount"]
    if event.get("type"):
        out["type"] = event["type"]
    out["eventTime"] = event.get("eventTime")
    for field in ("series", "related"):
        if field in event:
            out[field] = copy.deepcopy(event[field])
    if event.get("action"):
        out["action"] = event["action"]
    out["reportingComponent"] = event.get("reportingController", "")
    out["reportingInstance"] = event.get("reportingInstance", "")
    return out


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


def _first_schema_error(validator: ModuleType, version: str, obj: Json) -> Any:
    try:
        validator.validate(obj, version, strict=True)
    except validator.ValidationError as err:
        return err
    return None


def validate_meta(meta: Json) -> list[FieldError]:
    name = meta.get("name", "")
    if not name:
        return [
            FieldError(
                "FieldValueRequired", "metadata.name", "Required value: name or generateName is required"
            )
        ]
    errors: list[FieldError] = []
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        errors.append(
            invalid(
                "metadata.name",
                name,
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                "'-' or '.', and must start and end with an alphanumeric character",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        errors += _qualified_name_errors("metadata.labels", key)
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            errors.append(
                invalid(
                    "metadata.labels",
                    value,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                    "or '.', and must start and end with an alphanumeric character (at most 63)",
                )
            )
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += _qualified_name_errors("metadata.annotations", key)
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        errors.append(
            FieldError(
                "FieldValueTooLong", "metadata.annotations", "Too long: must have at most 262144 bytes"
            )
        )
    return errors


def _field_path(parts: Sequence[Any]) -> str:
    """A schema error's path as the real server writes a field: `status.conditions[1].type`."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _qualified_name_errors(field: str, value: str) -> list[FieldError]:
    prefix, _, name = value.rpartition("/")
    ok = bool(name) and len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None
    if "/" in value:
        ok = ok and bool(prefix) and len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
    if ok:
        return []
    return [
        invalid(
            field,
            value,
            "name part must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character",
        )
    ]


def _validate_event(event: Json, old: Json | None) -> list[FieldError]:
    """pkg/apis/core/validation/events.go for a request to events.k8s.io/v1 (field paths are the
    internal type's, as the real server reports them: involvedObject, message, source)."""
    errors: list[FieldError] = []
    namespace = dig(event, ("metadata", "namespace")) or ""
    regarding = event.get("regarding")
    if not regarding:
        errors.append(
            required("regarding")
        )  # stricter than the real server: an event must be about something
    regarding_ns = (regarding or {}).get("namespace", "")
    if (not regarding_ns and namespace not in ("default", "kube-system")) or (
        regarding_ns and regarding_ns != namespace
    ):
        errors.append(invalid("involvedObject.namespace", regarding_ns, "does not match event.namespace"))
    controller = event.get("reportingController", "")
    if not controller:
        errors.append(required("reportingController"))
    else:
        errors += _qualified_name_errors("reportingController", controller)
    limits = (
        ("reportingInstance", "reportingInstance", 128),
        ("action", "action", 128),
        ("reason", "reason", 128),
    )
    for field, path, limit in limits:
        value = event.get(field, "")
        if not value:
            errors.append(required(path))
        elif len(value.encode()) > limit:
            errors.append(
                FieldError(
                    "FieldValueInvalid", path, f'Invalid value: "": can have at most {limit} characters'
                )
            )
    if len(event.get("note", "").encode()) > 1024:
        errors.append(
            FieldError("FieldValueInvalid", "message", 'Invalid value: "": can have at most 1024 characters')
        )
    series = event.get("series")
    if series is not None and (old is None or series != old.get("series")):  # checked when it changes
        if series.get("count", 0) < 2:
            errors.append(
                FieldError("FieldValueInvalid", "series.count", 'Invalid value: "": should be at least 2')
            )
        if not series.get("lastObservedTime"):
            errors.append(required("series.lastObservedTime"))
    if old is None:
        if event.get("type") not in ("Normal", "Warning"):
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    "type",
                    f'Invalid value: "": has invalid value: {event.get("type", "")}',
                )
            )
        for field, path in (
            ("deprecatedFirstTimestamp", "firstTimestamp"),
            ("deprecatedLastTimestamp", "lastTimestamp"),
            ("deprecatedCount", "count"),
            ("deprecatedSource", "source"),
        ):
            if event.get(field):
                errors.append(FieldError("FieldValueInvalid", path, 'Invalid value: "": needs to be unset'))
        return errors
    immutable = (
        ("regarding", "involvedObject"), ("reason", "reason"), ("note", "message"),
        ("deprecatedSource", "source"), ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"), ("deprecatedCount", "count"), ("type", "type"),
        ("eventTime", "eventTime"), ("action", "action"), ("related", "related"),
        ("reportingController", "reportingController"), ("reportingInstance", "reportingInstance"),
    )  # fmt: skip
    for field, path in immutable:
        if event.get(field) != old.get(field):
            errors.append(invalid(path, event.get(field), "field is immutable"))
    return errors


def _validate_node(node: Json) -> list[FieldError]:
    errors: list[FieldError] = []
    conditions = dig(node, ("status", "conditions")) or []
    seen: set[str] = set()
    for i, c in enumerate(conditions):
        where = f"status.conditions[{i}]"
        if not c.get("type"):
            errors.append(required(f"{where}.type"))
        elif c["type"] in seen:
            errors.append(
                FieldError("FieldValueDuplicate", f"{where}.type", f'Duplicate value: "{c["type"]}"')
            )
        seen.add(c.get("type", ""))
        if c.get("status") not in _CONDITION_STATUSES:
            if not c.get("status"):
                errors.append(required(f"{where}.status"))
            else:
                supported = ", ".join(f'"{s}"' for s in _CONDITION_STATUSES)
                errors.append(
                    FieldError(
                        "FieldValueNotSupported",
                        f"{where}.status",
                        f'Unsupported value: "{c["status"]}": supported values: {supported}',
                    )
                )
    return errors


def field_selector(kind: Kind, text: str) -> Callable[[Json], bool]:
    """A fieldSelector (`a=b,c!=d`, `==` too) over the fields the real server lets one select, for
    the object as stored (an Event in its events.k8s.io form, whichever view was asked)."""
    fields = _SELECTABLE.get((kind.group, kind.resource), {})
    terms: list[tuple[tuple[str, ...], bool, str]] = []
    for term in filter(None, text.split(",")):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if m is None:
            raise bad_request(f'invalid field selector: "{term}"')
        label, op, value = m.groups()
        if label not in fields:
            raise bad_request(f"field label not supported: {label}")
        terms.append((fields[label], op == "!=", value))

    def match(obj: Json) -> bool:
        for path, negate, value in terms:
            found = dig(obj, path)
            if path == _SOURCE and not found:  # the server's fallback for events without a source
                found = obj.get("reportingController")
            text = "" if found is None else (str(found).lower() if isinstance(found, bool) else str(found))
            if (text == value) == negate:
                return False
        return True

    return match


def label_selector(text: str) -> Callable[[Json], bool]:
    """Equality-based label selectors only (`a=b,c!=d`); set-based ones are refused."""
    terms: list[tuple[str, bool, str]] = []
    for term in filter(None, text.split(",")):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if m is None:
            raise bad_request(f"set-based label selectors are not served by the fake API server: {term}")
        terms.append((m.group(1), m.group(2) == "!=", m.group(3)))

    def match(obj: Json) -> bool:
        labels = dig(obj, ("metadata", "labels")) or {}
        return all((labels.get(k) == v) != negate for k, negate, v in terms)

    return match


def decode(kind: Kind, body: Any, validator: ModuleType | None, version: str) -> Json:
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
            raise decode_error(kind, f'parsing time "{value}" as "{layout}": cannot parse {".".join(path)}')
    if validator is not None:
        err = _first_schema_error(validator, version, obj)
        if err is not None:
            where = _field_path(err.path)
            if err.validator == "additionalProperties":
                unknown = sorted(set(err.instance) - set(err.schema.get("properties", {})))
                fields = ", ".join(f'unknown field "{".".join(filter(None, [where, u]))}"' for u in unknown)
                raise decode_error(kind, f"strict decoding error: {fields}")
            if err.validator == "type":
                raise decode_error(
                    kind,
                    f"json: cannot unmarshal {type(err.instance).__name__} into Go struct field {where} "
                    f"of type {err.validator_value}",
                )
            name = dig(obj, ("metadata", "name")) or ""
            if err.validator == "required":
                missing = err.message.split("'")[1] if "'" in err.message else ""
                raise invalid_error(kind, name, [required(".".join(filter(None, [where, missing])))])
            raise invalid_error(
                kind, name, [FieldError("FieldValueInvalid", where, f"Invalid value: {err.message}")]
            )
    return obj


def validate_rules(kind: Kind, obj: Json, old: Json | None) -> list[FieldError]:
    if kind is EVENTS:
        return _validate_event(obj, old)
    if kind.kind == "Node":
        return _validate_node(obj)
    return []
