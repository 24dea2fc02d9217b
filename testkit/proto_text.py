"""The fields of top-level messages in a .proto file, read from its text: enough to hold our
vendored subset of Kubernetes' generated.proto files to upstream's (which have no nested
messages, groups or oneofs in the messages we vendor).

`messages(text, package)` maps each message's full name to {field name: (number, label, type)},
with message types fully qualified and maps as "map<key,value>".
"""

from __future__ import annotations

import re

__all__ = ["Field", "messages", "scalar"]

Field = tuple[int, str, str]  # number, label ("optional"/"repeated"/"required"/""), type

SCALARS = frozenset(
    {"double", "float", "bool", "string", "bytes"}
    | {f"{kind}{bits}" for kind in ("int", "uint", "sint", "fixed", "sfixed") for bits in (32, 64)}
)
# A message's body runs to the first "}" alone on a line; "message X {}" is an empty one.
_MESSAGE = re.compile(r"^message (\w+) \{(?:\}|$(.*?)^\})$", re.M | re.S)
_FIELD = re.compile(r"^\s*(optional|repeated|required)?\s*([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*[;\[]", re.M)
_MAP = re.compile(r"^\s*map<\s*([\w.]+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;", re.M)


def scalar(name: str) -> bool:
    return name in SCALARS


def _qualify(name: str, package: str) -> str:
    if scalar(name):
        return name
    if name.startswith("."):
        return name[1:]
    return name if "." in name else f"{package}.{name}"


def messages(text: str, package: str) -> dict[str, dict[str, Field]]:
    """Every top-level message of `text` (a .proto in `package`) with its fields."""
    text = re.sub(r"//[^\n]*", "", text)
    out: dict[str, dict[str, Field]] = {}
    for match in _MESSAGE.finditer(text):
        name, body = match.group(1), match.group(2) or ""
        fields: dict[str, Field] = {}
        for key, value, field, number in _MAP.findall(body):
            fields[field] = (int(number), "repeated", f"map<{key},{_qualify(value, package)}>")
        for label, type_, field, number in _FIELD.findall(body):
            if type_ == "map" or field in fields:
                continue
            fields[field] = (int(number), label, _qualify(type_, package))
        out[f"{package}.{name}"] = fields
    return out
