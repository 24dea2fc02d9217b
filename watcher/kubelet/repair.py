"""Answers with invalid UTF-8 in a string field, repaired instead of refused.

Protobuf refuses a whole message when one string is not valid UTF-8, and device plugins choose
device ids, users choose pod names: one bad byte would blind the agent (and, after the grace,
page `kubelet.unreachable` for a kubelet that answers fine). An answer the API types refuse is
parsed with the same messages declaring every string as bytes (v1/lenient.proto), each invalid
string is rewritten with its bad bytes escaped (`\\xff`: deterministic, so a device keeps its
identity from one answer to the next, and distinct bad bytes stay distinct), and the result is
parsed as usual.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from watcher.kubeletapi.v1 import lenient_pb2

__all__ = ["repair_answers"]


def repair_answers(alloc_raw: bytes | None, list_raw: bytes) -> tuple[bytes | None, bytes, list[str]]:
    """Both answers with their invalid strings escaped, and those strings as they now read.
    Raises DecodeError when an answer is not even well-formed protobuf."""
    repaired: list[str] = []
    if alloc_raw is not None:
        alloc_raw = _repair(lenient_pb2.AllocatableResourcesResponse.FromString(alloc_raw), repaired)
    list_raw = _repair(lenient_pb2.ListPodResourcesResponse.FromString(list_raw), repaired)
    return alloc_raw, list_raw, repaired


def _repair(message: Message, repaired: list[str]) -> bytes:
    _walk(message, repaired)
    return message.SerializeToString()


def _walk(message: Message, repaired: list[str]) -> None:
    for field, value in message.ListFields():
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_BYTES:
            if repeated:
                for i, item in enumerate(value):
                    if (fixed := _text(item, repaired)) is not None:
                        value[i] = fixed
            elif (fixed := _text(value, repaired)) is not None:
                setattr(message, field.name, fixed)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for sub in value if repeated else (value,):
                _walk(sub, repaired)


def _text(raw: bytes, repaired: list[str]) -> bytes | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "backslashreplace")
        repaired.append(text)
        return text.encode()
    return None
