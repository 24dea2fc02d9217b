"""Protobuf's wire format read without a schema: enough to look inside a message whose .proto we
do not vendor (the kubelet's Pods API sends each Pod as `bytes`, a k8s.io/api core/v1 Pod).

`fields(data)` gives (field number, value) in order: ints for varints and fixed-width fields,
bytes for length-delimited ones (strings, sub-messages, packed lists). Groups are refused.
"""

from __future__ import annotations

__all__ = ["fields", "first", "every"]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            out.append((number, value))
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated length-delimited field")
            out.append((number, data[at : at + size]))
            at += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, int.from_bytes(data[at : at + width], "little")))
            at += width
        else:
            raise ValueError(f"wire type {wire} (groups) not supported")
    return out


def every(data: bytes, number: int) -> list[bytes]:
    """Every length-delimited value of field `number`."""
    return [v for n, v in fields(data) if n == number and isinstance(v, bytes)]


def first(data: bytes, *path: int) -> bytes | None:
    """The first length-delimited value down a path of field numbers (None when absent)."""
    for number in path:
        found = every(data, number)
        if not found:
            return None
        data = found[0]
    return data
