"""The C allocator, set for an agent whose largest buffers live for one cycle each.

glibc's malloc gives blocks of 128 KiB and more their own mapping and unmaps them when they
are freed, but each time it frees one it raises that threshold to the block's size (up to
32 MiB). After the first cycle, the kubelet's answers, gRPC's buffers for them and their
parse (each about the size of an answer) therefore come from the heap, and when freed they
stay there: the process keeps the high-water mark of a cycle for good. Fixing the threshold
keeps such blocks in their own mappings, returned when freed. On a 40,000-pod node (answers
of 5.6 MiB, `bench/big_node.py --pods 40000`) it took RSS from 113 to 86 MiB between cycles
and from 121 to 104 MiB at a cycle's peak; 64 KiB did better than 32 or 128 KiB.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "return_large_blocks"]

MMAP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD`. False, changing nothing, where the C
    library is not glibc or the operator set MALLOC_MMAP_THRESHOLD_ (theirs is kept)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
