"""The HTTP side of the fake API server: which resource a URL names, the verb a request is, its
JSON body, and answers with the real server's Content-Type and Status bodies."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from watcher.sim.apiserver.errors import ApiError, bad_request
from watcher.sim.apiserver.kinds import KINDS, Kind

__all__ = [
    "MAX_BODY",
    "PATCH_TYPES",
    "UNKNOWN_FORMAT",
    "Target",
    "error_response",
    "json_body",
    "json_response",
    "resource_path",
    "target",
    "unsupported_patch_type",
    "verb",
]

MAX_BODY = 3 * 1024 * 1024  # the real server's request body limit
UNKNOWN_FORMAT = "the body of the request was in an unknown format - accepted media types include: "
PATCH_TYPES = (
    "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
)


@dataclasses.dataclass(frozen=True)
class Target:
    """The resource a URL names: `/api/v1/namespaces/ml/pods/trainer-0`, `/api/v1/nodes/n/status`."""

    kind: Kind
    namespace: str
    name: str
    sub: str


def target(path: str) -> Target:
    """The resource at `path` (no trailing slash), or 404 as the real server answers an unknown one."""
    missing = ApiError(404, "NotFound", "the server could not find the requested resource")
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3 and parts[1] == "v1":
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4 and parts[2] == "v1":
        group, rest = parts[1], parts[3:]
    else:
        raise missing
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3 or (group, rest[0]) not in KINDS:
        raise missing
    kind = KINDS[(group, rest[0])]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if (sub and sub not in kind.subresources) or (namespace and not kind.namespaced):
        raise missing
    if kind.namespaced and name and not namespace:
        raise missing
    return Target(kind, namespace, name, sub)


def resource_path(path: str) -> tuple[str, str, str, str, str] | None:
    """(group, resource, namespace, name, subresource) of any resource URL, served or not, as
    the authorizer sees it before the URL is resolved; None for a path that is not one."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    return group, rest[0], namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""


def verb(method: str, name: str, query: Mapping[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("1", "true"):
            return "watch"
        return "get" if name else "list"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, method.lower())


async def json_body(request: web.Request, action: str) -> Any:
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
    if action in ("create", "update") and ctype != "application/json":
        raise ApiError(415, "UnsupportedMediaType", f"{UNKNOWN_FORMAT}application/json")
    if ctype == "application/apply-patch+yaml":
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not served by the fake API server")
    if action == "patch" and ctype not in PATCH_TYPES.split(", "):
        raise unsupported_patch_type()  # before the body is read, as the real server checks
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as err:
        if action == "patch":  # checked before any decoding, whatever the patch type
            raise bad_request("invalid JSON patch") from err
        raise bad_request(f"error decoding patch or body: {err}") from err


def unsupported_patch_type() -> ApiError:
    """A PATCH of a type not served: the real server's words, which name none of the types."""
    return ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """JSON with the real server's Content-Type: exactly `application/json`, no charset (clients
    compare it whole: lightkube reads an error as a Status only then)."""
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


def error_response(err: ApiError) -> web.Response:
    headers = {}
    # The real server sends Retry-After whenever the Status carries retryAfterSeconds.
    if err.details and err.details.get("retryAfterSeconds"):
        headers["Retry-After"] = str(err.details["retryAfterSeconds"])
    return json_response(err.status(), status=err.code, headers=headers)
