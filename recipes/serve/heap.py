"""The C heap of a long-running server: handing its free pages back to the system after a large answer
(docs/serving.md, "Measured: hostile traffic")."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` as a ctypes function, or None where there is none (macOS, musl)."""
    try:
        import ctypes

        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (ImportError, OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``); returns whether
    it could (False off glibc, e.g. macOS or musl; with another allocator preloaded it does nothing).

    A large answer's temporary objects (a token entry per token of a 131,072-token append: about
    42 MiB at its peak) are all freed, but what glibc's ``malloc`` served (larger objects, numpy and
    torch buffers, the pools Python takes for its small objects) stays in glibc's heaps as free pages,
    so a long-running process's resident memory keeps its peaks (docs/serving.md, "Measured: hostile
    traffic"). ``malloc_trim`` walks every heap, locking each in turn: call it after such a peak, not
    per request. Safe from any thread.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
