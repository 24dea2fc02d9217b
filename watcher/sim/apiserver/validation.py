"""The rules the real server checks beyond the schema: object metadata (names, labels,
annotations), the events.k8s.io/v1 rules of pkg/apis/core/validation/events.go, and Node
conditions. Each check returns the field errors a 422 Invalid lists."""

from __future__ import annotations

import re

from watcher.sim.apiserver.errors import FieldError, invalid, required
from watcher.sim.apiserver.kinds import EVENTS, Kind
from watcher.sim.apiserver.values import Json, dig

__all__ = ["validate_meta", "validate_rules"]

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_CONDITION_STATUSES = ("True", "False", "Unknown")


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
    errors = _event_regarding(event) + _event_reporter(event)
    series = event.get("series")
    if series is not None and (old is None or series != old.get("series")):  # checked when it changes
        if series.get("count", 0) < 2:
            errors.append(
                FieldError("FieldValueInvalid", "series.count", 'Invalid value: "": should be at least 2')
            )
        if not series.get("lastObservedTime"):
            errors.append(required("series.lastObservedTime"))
    if old is None:
        return errors + _new_event(event)
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


def _event_regarding(event: Json) -> list[FieldError]:
    """The object an Event is about, and its namespace against the Event's."""
    errors: list[FieldError] = []
    namespace = dig(event, ("metadata", "namespace")) or ""
    regarding = event.get("regarding")
    if not regarding:
        errors.append(
            required("regarding")
        )  # stricter than the real server: an event must be about something
    regarding_ns = (regarding or {}).get("namespace", "")
    # With an eventTime (a new-style Event) only a cluster-scoped object's Event is held to a
    # namespace; one about a namespaced object may be in any (legacyValidateEvent).
    legacy = not event.get("eventTime")
    if (not regarding_ns and namespace not in ("default", "kube-system")) or (
        legacy and regarding_ns and regarding_ns != namespace
    ):
        errors.append(invalid("involvedObject.namespace", regarding_ns, "does not match event.namespace"))
    return errors


def _event_reporter(event: Json) -> list[FieldError]:
    """Who reports the Event, what it did and why, and the note's length."""
    errors: list[FieldError] = []
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
    return errors


def _new_event(event: Json) -> list[FieldError]:
    """What a created Event must hold: a known type, and none of the deprecated core/v1 fields."""
    errors: list[FieldError] = []
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


def validate_rules(kind: Kind, obj: Json, old: Json | None) -> list[FieldError]:
    if kind is EVENTS:
        return _validate_event(obj, old)
    if kind.kind == "Node":
        return _validate_node(obj)
    if kind.kind == "DeviceTaintRule":
        return _validate_device_taint_rule(obj, old)
    return []


_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")


def _validate_device_taint_rule(obj: Json, old: Json | None) -> list[FieldError]:
    """A taint's effect must be one this server knows, checked only when it is new or changed
    (pkg/apis/resource/validation validateDeviceTaint: a rule a newer server stored keeps its
    effect, which is why consumers read an unknown one as None)."""
    effect = dig(obj, ("spec", "taint", "effect"))
    if old is not None and dig(old, ("spec", "taint", "effect")) == effect:
        return []
    where = "spec.taint.effect"
    if not effect:
        return [FieldError("FieldValueRequired", where, "Required value")]
    if effect not in _TAINT_EFFECTS:
        supported = ", ".join(f'"{e}"' for e in _TAINT_EFFECTS)
        return [
            FieldError(
                "FieldValueNotSupported",
                where,
                f'Unsupported value: "{effect}": supported values: {supported}',
            )
        ]
    return []
