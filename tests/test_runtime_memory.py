"""Resident memory helpers of txl.runtime: VmRSS, and handing the C heap's free pages back (used by txl serve
after large answers, docs/serving.md "Measured: hostile traffic")."""

import os
from pathlib import Path

import pytest

from txl import runtime

LINUX = Path("/proc/self/status").is_file()


@pytest.mark.skipif(not LINUX, reason="reads VmRSS from /proc (Linux)")
@pytest.mark.skipif(bool(os.environ.get("LD_PRELOAD")), reason="another allocator may be preloaded")
def test_release_free_memory_hands_the_freed_heap_back_to_the_system():
    blocks = [bytes(2000) for _ in range(40_000)]  # 80 MB of blocks from glibc's malloc (over pymalloc's 512 B)
    pinned = blocks[-1]  # keeps the heap's top in use: glibc cannot shrink the heap by itself
    full = runtime.resident_bytes()
    del blocks
    if not runtime.release_free_memory():
        pytest.skip("not glibc: there is no malloc_trim")
    after = runtime.resident_bytes()
    assert full - after >= 0.8 * 80e6, (full, after)
    assert len(pinned) == 2000


def test_release_free_memory_is_false_where_there_is_no_malloc_trim(monkeypatch):
    import ctypes

    def no_libc(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    runtime._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    try:
        assert runtime._malloc_trim() is None and runtime.release_free_memory() is False
    finally:
        runtime._malloc_trim.cache_clear()


@pytest.mark.skipif(not LINUX, reason="reads VmRSS from /proc (Linux)")
def test_resident_bytes_of_this_process_and_of_another():
    own = runtime.resident_bytes()
    assert abs(own - runtime.resident_bytes(os.getpid())) < 16 << 20  # the same process, read twice
    assert own > 10 << 20  # a Python with torch imported holds more than 10 MiB
    assert runtime.resident_bytes(2**22 + 12345) is None  # no such process


@pytest.mark.skipif(not LINUX, reason="reads /proc (Linux)")
def test_the_peak_is_at_least_the_resident_memory_and_grows_with_an_allocation():
    now, peak = runtime.resident_bytes(), runtime.resident_bytes(field="VmHWM")
    assert peak >= now
    block = b"\x01" * (200 << 20)  # 200 MiB, written: resident
    assert runtime.resident_bytes(field="VmHWM") >= now + (150 << 20)
    assert runtime.resident_bytes() >= now + (150 << 20) and len(block) == 200 << 20


def test_a_cuda_device_s_room_is_its_own_free_memory_not_the_host_s(monkeypatch):
    # through a fake device query: buffers on a GPU are limited by its free memory
    import torch

    from txl.errors import TxlError
    from txl.model import AttentionSpan, DecodingState

    asked = []

    def mem_get_info(device=None):
        asked.append(str(device))
        return 3 * 2**20, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * 2**20)  # torch's cache: 5 MiB,
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 * 2**20)  # 1 of them unused
    assert runtime.available_memory_bytes(torch.device("cuda", 1)) == 4 * 2**20
    assert runtime.available_memory_bytes("cuda") == 4 * 2**20 and asked == ["cuda:1", "cuda"]
    assert runtime.available_memory_bytes(1) == 4 * 2**20 and asked[-1] == "cuda:1"  # an index names a GPU
    host = runtime.available_memory_bytes()
    assert runtime.available_memory_bytes(torch.device("cpu")) == host and host > 3 * 2**20
    # a decoding state whose buffers live on that device refuses what does not fit there
    state = DecodingState(2, AttentionSpan(tgt_len=4, mem_len=8))
    state.device = torch.device("cuda", 1)
    with pytest.raises(TxlError, match="more than the 4"):
        state.check_fits(5 * 2**20, "its keys and values")
    state.device = torch.device("cpu")
    state.check_fits(5 * 2**20, "its keys and values")  # the host has the room


def test_a_decoding_state_asks_for_the_room_of_the_device_its_call_runs_on(monkeypatch):
    import torch

    from conftest import tiny_model
    from txl.model import DecodingState, decoding

    model = tiny_model(mem_len=40)
    asked = []

    def available(device=None):
        asked.append(device)
        return 1 << 40

    monkeypatch.setattr(decoding, "available_memory_bytes", available)
    state = DecodingState(3, model.config.span)
    with torch.no_grad():
        model(torch.randint(0, 37, (1, 5)), caches=state)
        for _ in range(30):  # steps that grow the buffers
            model(torch.randint(0, 37, (1, 1)), caches=state)
    assert asked and all(d == torch.device("cpu") for d in asked) and state.device == torch.device("cpu")
