"""txl.runtime.resident_bytes: a process's VmRSS."""

import os
from pathlib import Path

import pytest

from txl import runtime

LINUX = Path("/proc/self/status").is_file()


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
    # what does not fit on that device is refused there, whatever the host has
    with pytest.raises(TxlError, match=r"the buffers needs 5.0 MiB, more than the 4.0 MiB .* use less"):
        runtime.check_fits(5 * 2**20, "the buffers", "use less", torch.device("cuda", 1))
    runtime.check_fits(5 * 2**20, "the buffers", "use less", torch.device("cpu"))  # the host has the room


def test_generation_refuses_a_decoding_state_the_memory_cannot_hold(monkeypatch):
    """The caller checks the state's buffers (nbytes) against the memory of the model's device before the
    first call: one line naming mem_len; a state sized by the text (prompt + new tokens) fits where a
    mem_len of a million would not."""
    import torch

    from conftest import tiny_model
    from txl.errors import TxlError
    from txl.generation import generate, stream

    model = tiny_model(tgt_len=4, mem_len=1_000_000)
    asked = []

    def available(device=None):
        asked.append(device)
        return 200_000

    monkeypatch.setattr(runtime, "available_memory_bytes", available)
    prompt = torch.randint(0, 37, (2, 9))
    out = generate(model, prompt, 6, temperature=0)  # 15 slots of 2 rows: a few KiB
    assert out.shape == (2, 15) and asked == [torch.device("cpu")]
    monkeypatch.setattr(stream, "DecodingState", lambda *args, max_tokens, **kw: __import__(
        "txl.model", fromlist=["DecodingState"]).DecodingState(*args, **kw))  # no bound: a million slots
    with pytest.raises(TxlError, match=r"a decoding state with mem_len 1,000,000 needs .* use a smaller mem_len"):
        generate(model, prompt, 6, temperature=0)


def test_progress_off_a_terminal_is_a_few_whole_lines(capsys):
    from txl.runtime import progress_bar

    with progress_bar(10_000, True, "reading", initial=0, leave=True) as bar:  # a log file or a pipe, not a terminal
        for _ in range(10_000):
            bar.update(1)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and 1 <= len(lines) <= 3, lines  # no carriage-return stream: the start and the end
    assert lines[-1].startswith("reading: 100%") and "10000/10000" in lines[-1]
    with progress_bar(50, True, "quiet") as bar:  # a bar cleared when done (leave=False) writes no blank line
        bar.update(50)
    assert all(line.strip() for line in capsys.readouterr().err.splitlines())


def test_progress_on_a_terminal_redraws_in_place(monkeypatch, capsys):
    import sys

    from txl.runtime import progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress_bar(3, True, "reading") as bar:
        bar.update(3)
    err = capsys.readouterr().err
    assert err.startswith("\rreading:") and "\n" not in err  # redrawn in place, then cleared
