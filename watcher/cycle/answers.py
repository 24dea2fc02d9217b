"""A cycle's two answers made an Inventory: the decoder's fast path, text repaired, the GC held off.

The reactor decodes under `gc_paused` and through `inventory_from_answers`: answers whose strings
are invalid UTF-8 are repaired rather than refused, and an older inventory equal to the answers
is kept instead of a second copy of it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from google.protobuf.message import DecodeError

from watcher.kubelet.decoding import Decoder
from watcher.kubelet.repair import repair_answers
from watcher.model.inventory import Inventory

__all__ = ["gc_paused", "inventory_from_answers"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Defer the cyclic garbage collector while an inventory is built and diffed.

    The model makes no reference cycles (frozen records, tuples), so nothing is
    lost by waiting; what is won is the p99: a full collection landing in the
    middle of a large node's thousands of fresh objects doubled a cycle's time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def inventory_from_answers(
    decoder: Decoder, before: Inventory | None, alloc_raw: bytes | None, list_raw: bytes
) -> tuple[Inventory, list[str]]:
    """The answers' inventory, and the strings that had to be repaired (invalid UTF-8)."""
    try:
        return _inventory_from(decoder, before, alloc_raw, list_raw), []
    except DecodeError:
        alloc_raw, list_raw, repaired = repair_answers(alloc_raw, list_raw)  # or DecodeError
        if not repaired:
            raise
        return _inventory_from(decoder, before, alloc_raw, list_raw), repaired


def _inventory_from(
    decoder: Decoder, before: Inventory | None, alloc_raw: bytes | None, list_raw: bytes
) -> Inventory:
    if before is not None:
        decoder.seed(before)  # after a restart: the saved pods, not a second copy of them
    after, _ = decoder.decode(alloc_raw, list_raw)
    if before is not None and after is not before and after.content_hash == before.content_hash:
        # The decoder compares with the last answer it decoded; ours may be older (a
        # restored state, a commit that failed) yet equal. Keep one copy of it.
        decoder.adopt(before)
        return before
    return after
