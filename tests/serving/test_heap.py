"""The serve recipe's heap: handing the C heap's free pages back after large answers (docs/serving.md,
"Measured: hostile traffic")."""

import os
from pathlib import Path

import pytest

from txl import runtime
from txl_recipes.serve import heap

LINUX = Path("/proc/self/status").is_file()


@pytest.mark.skipif(not LINUX, reason="reads VmRSS from /proc (Linux)")
@pytest.mark.skipif(bool(os.environ.get("LD_PRELOAD")), reason="another allocator may be preloaded")
def test_release_free_memory_hands_the_freed_heap_back_to_the_system():
    blocks = [bytes(2000) for _ in range(40_000)]  # 80 MB of blocks from glibc's malloc (over pymalloc's 512 B)
    pinned = blocks[-1]  # keeps the heap's top in use: glibc cannot shrink the heap by itself
    full = runtime.resident_bytes()
    del blocks
    if not heap.release_free_memory():
        pytest.skip("not glibc: there is no malloc_trim")
    after = runtime.resident_bytes()
    assert full - after >= 0.8 * 80e6, (full, after)
    assert len(pinned) == 2000


def test_release_free_memory_is_false_where_there_is_no_malloc_trim(monkeypatch):
    import ctypes

    def no_libc(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    try:
        assert heap._malloc_trim() is None and heap.release_free_memory() is False
    finally:
        heap._malloc_trim.cache_clear()
