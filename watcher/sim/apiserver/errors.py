"""The fake API server's answers other than success: a v1 Status (`ApiError`), and the field
errors of the real validation that a 422 Invalid lists as its causes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from watcher.sim.apiserver.kinds import Kind
from watcher.sim.apiserver.values import Json

__all__ = [
    "ApiError",
    "FieldError",
    "bad_request",
    "conflict",
    "decode_error",
    "invalid",
    "invalid_error",
    "not_found",
    "required",
]


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
    # The real server names the kind of the internal object it validated: an events.k8s.io
    # Event is stored and validated as the core one, so its 422 names no group.
    group = "" if kind.group == "events.k8s.io" else kind.group
    if group:
        details["group"] = group
    qualified = f"{kind.kind}.{group}" if group else kind.kind
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details)


def decode_error(kind: Kind, detail: str) -> ApiError:
    return bad_request(f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: {detail}')
