"""The three PATCH formats of the Kubernetes API, applied the way the API server applies them.

- `strategic_merge`: `application/strategic-merge-patch+json`. Maps merge recursively and `null`
  deletes a key; a list with a merge key (`status.conditions` by `type` on a Node) merges element by
  element, other lists are replaced whole. Directives: `$patch: delete` on a list element or a map,
  `$patch: replace` on a map or as a list element, `$setElementOrder/<list>`,
  `$deleteFromPrimitiveList/<list>`. `$retainKeys` is refused (nothing here sends it).
- `merge_patch`: `application/merge-patch+json`, RFC 7386: lists are always replaced whole.
- `json_patch`: `application/json-patch+json`, RFC 6902, `test` included.

Each raises PatchError for a patch the server would refuse with 400 BadRequest (or, for a failed
`test`, 422).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["MergeKeys", "PatchError", "json_patch", "merge_patch", "strategic_merge"]

# Where a list is merged rather than replaced, by path of keys from the object's root: the merge
# key of its elements, or "" for a list of scalars merged as a set (like metadata.finalizers).
MergeKeys = Mapping[tuple[str, ...], str]


class PatchError(Exception):
    """A patch the server refuses; `code` is the HTTP status it answers with."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


_DIRECTIVE = "$patch"
_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"


# What Go's encoding/json calls a JSON value that cannot be decoded into the patch's map.
_GO_JSON_TYPES = ((bool, "bool"), (str, "string"), (list, "array"), (int, "number"), (float, "number"))


def strategic_merge(original: Any, patch: Any, keys: MergeKeys) -> Any:
    """`original` with the strategic merge `patch` applied (neither is modified)."""
    if patch is None:
        patch = {}  # JSON null decodes into the patch's map as an empty one
    if not isinstance(patch, dict):
        found = next(name for t, name in _GO_JSON_TYPES if isinstance(patch, t))
        raise PatchError(f"json: cannot unmarshal {found} into Go value of type map[string]interface {{}}")
    merged = _merge_map(original if isinstance(original, dict) else {}, patch, keys, ())
    return {} if merged is None else merged


def _merge_map(
    original: dict[str, Any], patch: dict[str, Any], keys: MergeKeys, path: tuple[str, ...]
) -> dict[str, Any] | None:
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        replaced: dict[str, Any] = _strip({k: v for k, v in patch.items() if k != _DIRECTIVE})
        return replaced
    if directive == "delete":
        return None
    if directive is not None and directive != "merge":
        raise PatchError(f"Unknown patch type: {directive!r}")
    result = copy.deepcopy(original)
    orders: dict[str, Any] = {}
    for key, value in patch.items():
        if key == _DIRECTIVE:
            continue
        if key.startswith("$retainKeys"):
            raise PatchError("$retainKeys is not supported by this server")
        if key.startswith(_ORDER):
            orders[key.removeprefix(_ORDER)] = value
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            name = key.removeprefix(_DELETE_PRIMITIVE)
            if not isinstance(value, list) or not isinstance(result.get(name, []), list):
                raise PatchError(f"invalid {key}: both sides must be lists")
            result[name] = [v for v in result.get(name, []) if v not in value]
            continue
        _merge_value(result, key, value, keys, (*path, key))
    for name, order in orders.items():
        if name in result:
            result[name] = _reorder(result[name], order, keys.get((*path, name), ""), name)
    return result


def _merge_value(
    result: dict[str, Any], key: str, value: Any, keys: MergeKeys, path: tuple[str, ...]
) -> None:
    """One key of a patch into `result`: null deletes, a map merges, a list with a merge key merges,
    anything else replaces."""
    current = result.get(key)
    if value is None:
        result.pop(key, None)
    elif isinstance(value, dict):
        merged = _merge_map(current if isinstance(current, dict) else {}, value, keys, path)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    elif isinstance(value, list) and path in keys:
        result[key] = _merge_list(current if isinstance(current, list) else [], value, keys, path)
    else:
        result[key] = _strip(copy.deepcopy(value))


def _merge_list(original: list[Any], patch: list[Any], keys: MergeKeys, path: tuple[str, ...]) -> list[Any]:
    merge_key = keys[path]
    if any(isinstance(e, dict) and e.get(_DIRECTIVE) == "replace" for e in patch):
        return [_strip(e) for e in patch if not (isinstance(e, dict) and e.get(_DIRECTIVE) == "replace")]
    if merge_key == "":  # a set of scalars: the union
        result = list(original)
        result.extend(v for v in patch if v not in result)
        return _in_server_order(result, list(original), list(patch), lambda v: v)
    result = copy.deepcopy(original)
    for element in patch:
        if not isinstance(element, dict) or merge_key not in element:
            raise PatchError(f"map: {element} does not contain declared merge key: {merge_key}")
        at = next((i for i, e in enumerate(result) if e.get(merge_key) == element[merge_key]), None)
        if element.get(_DIRECTIVE) == "delete":
            result = [e for e in result if e.get(merge_key) != element[merge_key]]
        elif at is None:
            result.append(_strip(element))
        else:
            merged = _merge_map(result[at], element, keys, path)
            if merged is None:
                del result[at]
            else:
                result[at] = merged
    return _in_server_order(
        result,
        [e.get(merge_key) for e in original],
        [e[merge_key] for e in patch if e.get(_DIRECTIVE) != "delete"],
        lambda e: e.get(merge_key),
    )


def _in_server_order(merged: list[Any], server: list[Any], patched: list[Any], ident: Any) -> list[Any]:
    """The merged list in the order the API server gives it (strategicpatch's normalizeElementOrder):
    the elements the patch names in its order, those it does not in the stored order, interleaved
    by the stored order; an element new to the list goes before the stored ones still to come (a
    new condition comes first)."""
    ours = sorted((e for e in merged if ident(e) in patched), key=lambda e: patched.index(ident(e)))
    theirs = [e for e in merged if ident(e) not in patched]
    out: list[Any] = []
    while ours or theirs:
        if not ours:
            out += theirs
            break
        if not theirs:
            out += ours
            break
        left, right = ident(theirs[0]), ident(ours[0])
        if left in server and right in server and server.index(left) < server.index(right):
            out.append(theirs.pop(0))
        else:
            out.append(ours.pop(0))
    return out


def _reorder(items: Any, order: Any, merge_key: str, name: str) -> Any:
    """The list in `$setElementOrder/name`'s order; elements it does not name keep theirs, after."""
    if not isinstance(items, list) or not isinstance(order, list):
        raise PatchError(f"invalid $setElementOrder/{name}: both sides must be lists")
    if merge_key:
        if not all(isinstance(o, dict) and merge_key in o for o in order):
            raise PatchError(f"invalid $setElementOrder/{name}: every element needs {merge_key}")
        wanted = [o[merge_key] for o in order]

        def ident(e: Any) -> Any:
            return e.get(merge_key) if isinstance(e, dict) else e
    else:
        wanted = list(order)

        def ident(e: Any) -> Any:
            return e

    named = sorted((e for e in items if ident(e) in wanted), key=lambda e: wanted.index(ident(e)))
    return named + [e for e in items if ident(e) not in wanted]


def _strip(value: Any) -> Any:
    """A value with any leftover `$patch` keys removed (they are never stored)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != _DIRECTIVE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def merge_patch(original: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` removes a member, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(original: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of `original`; a failed `test` is a 422, a malformed operation a 400."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a JSON array of operations")
    doc = copy.deepcopy(original)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], _pointer(op["path"])
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"testing value {op['path']} failed: test operation failed", code=422)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    return doc


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(f"invalid JSON pointer: {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text.split("/")[1:]] if text else []


def _get(doc: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"doc is missing path: /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        return None
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(path)}")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(path)}")
    return doc
