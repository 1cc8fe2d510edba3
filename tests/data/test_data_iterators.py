"""Tests for txl.data.iterators.LMOrderedIterator: every target visited exactly once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from txl.data.iterators import IGNORE_INDEX, LMOrderedIterator, sample_segment_length
from txl.errors import TxlError


def _check_segments(segments, n_tok: int, context: int) -> list[int]:
    """Assert the labels of ``segments`` (tokens = arange) score W+1..N-1 once; return lengths."""
    scored: list[int] = []
    lengths = []
    for x, y in segments:
        assert x.shape == y.shape and x.dtype == torch.int64 and y.dtype == torch.int64
        lengths.append(x.shape[1])
        mask = y != IGNORE_INDEX
        # the label at (b, p) is the token after the input at (b, p)
        assert torch.equal(y[mask], x[mask] + 1)
        scored.extend(y[mask].tolist())
    assert sorted(scored) == list(range(context + 1, n_tok))
    return lengths


def _whole(it: LMOrderedIterator) -> tuple[torch.Tensor, torch.Tensor]:
    """The iterator's whole input and label streams [B, W + L], read as one segment."""
    return it.segment(0, it.stream_len)


def _variable_segments(it: LMOrderedIterator, generator: torch.Generator, **keywords):
    """Segments of drawn lengths after the context, as training reads them (txl.training.lm_task)."""
    for pos, seq_len in it.positions():
        if pos >= it.context:
            break
        yield it.segment(pos, seq_len)
    pos = it.context
    while pos < it.stream_len:
        x, y = it.segment(pos, sample_segment_length(it.tgt_len, generator, **keywords))
        pos += x.size(1)
        yield x, y


@settings(max_examples=150, deadline=None)
@given(
    n_tok=st.integers(2, 120),
    batch_size=st.integers(1, 9),
    tgt_len=st.integers(1, 17),
    context=st.integers(0, 12),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_target_exactly_once(n_tok: int, batch_size: int, tgt_len: int, context: int, seed: int) -> None:
    if n_tok < context + 2:
        with pytest.raises(TxlError, match="fewer than the"):
            LMOrderedIterator(np.arange(n_tok), batch_size, tgt_len, context=context)
        return
    it = LMOrderedIterator(np.arange(n_tok), batch_size, tgt_len, context=context, pad_id=-7)
    n = n_tok - 1 - context
    L = -(-n // batch_size)
    inputs, labels = _whole(it)
    assert inputs.shape == labels.shape == (batch_size, context + L)
    assert it.stream_len == context + L and it.n_targets == n
    assert int((labels != IGNORE_INDEX).sum()) == n
    # stream b starts at s_b - W = b*L; padding past the end of the data
    expect = torch.arange(context + L) + L * torch.arange(batch_size)[:, None]
    assert torch.equal(inputs, torch.where(expect < n_tok, expect, torch.tensor(-7)))
    assert (labels[:, :context] == IGNORE_INDEX).all()

    lengths = _check_segments(it, n_tok, context)
    assert len(lengths) == len(it)
    assert all(1 <= s <= tgt_len for s in lengths)
    bounds = np.cumsum(lengths).tolist()
    assert bounds[-1] == it.stream_len
    if context:
        assert context in bounds  # a segment boundary exactly at W

    gen = torch.Generator().manual_seed(seed)
    var = list(_variable_segments(it, gen, std=2, min_len=1, max_deviation=2))
    var_lengths = _check_segments(var, n_tok, context)
    assert sum(var_lengths) == it.stream_len
    if context:
        assert context in np.cumsum(var_lengths).tolist()


def test_small_example_values() -> None:
    # N=10, W=2: targets 3..9 (n=7), B=3 -> L=3, streams start at 2, 5, 8
    it = LMOrderedIterator(torch.arange(10) * 10, batch_size=3, tgt_len=2, context=2)
    inputs, labels = _whole(it)
    assert inputs.tolist() == [[0, 10, 20, 30, 40], [30, 40, 50, 60, 70], [60, 70, 80, 90, 0]]
    assert labels.tolist() == [
        [-100, -100, 30, 40, 50],
        [-100, -100, 60, 70, 80],
        [-100, -100, 90, -100, -100],
    ]
    assert it.positions() == [(0, 2), (2, 2), (4, 1)]
    assert len(it) == 3
    x, y = it.segment(3, 10)
    assert x.tolist() == [[30, 40], [60, 70], [90, 0]]
    assert y.tolist() == [[40, 50], [70, 80], [-100, -100]]


def test_context_chunks_shorter_last() -> None:
    it = LMOrderedIterator(np.arange(50), batch_size=2, tgt_len=4, context=6)
    assert [p for p, _ in it.positions()][:3] == [0, 4, 6]
    assert it.positions()[:2] == [(0, 4), (4, 2)]


def test_varlen_is_deterministic_with_seed_and_varies() -> None:
    it = LMOrderedIterator(np.arange(5000), batch_size=2, tgt_len=20)

    def lengths(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [x.shape[1] for x, _ in _variable_segments(it, gen)]

    a, b = lengths(0), lengths(0)
    assert a == b
    assert len(set(a)) > 3  # lengths really vary
    assert max(a[:-1]) <= 20 + 3 * 5 and min(a[:-1]) >= 5


def test_errors() -> None:
    with pytest.raises(TxlError, match="fewer than the 2"):
        LMOrderedIterator(np.arange(1), 1, 4)
    with pytest.raises(TxlError, match="batch_size"):
        LMOrderedIterator(np.arange(10), 0, 4)
    with pytest.raises(TxlError, match="tgt_len"):
        LMOrderedIterator(np.arange(10), 1, 0)
    with pytest.raises(ValueError, match="1-D"):
        LMOrderedIterator(np.zeros((2, 5), dtype=np.int64), 1, 4)
    it = LMOrderedIterator(np.arange(10, dtype=np.uint16), 2, 4)
    with pytest.raises(ValueError, match="outside"):
        it.segment(it.stream_len, 1)


def test_sample_segment_length_distribution() -> None:
    gen = torch.Generator().manual_seed(1)
    draws = [sample_segment_length(100, gen) for _ in range(2000)]
    assert min(draws) >= 5 and max(draws) <= 115
    half = sum(1 for d in draws if d < 75)  # bptt = tgt_len / 2 about 5% of the time
    assert 40 < half < 170
    assert all(5 <= sample_segment_length(1, gen) <= 16 for _ in range(50))  # min_len floor, cap
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    seq_a = [sample_segment_length(20, gen_a) for _ in range(10)]
    assert seq_a == [sample_segment_length(20, gen_b) for _ in range(10)]


def _materialised(tokens: np.ndarray, batch_size: int, context: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The streams built whole, padded and unfolded (the construction LMOrderedIterator's reads must equal)."""
    data = torch.from_numpy(np.asarray(tokens).astype(np.int64))
    n_tok = data.numel()
    L = -(-(n_tok - 1 - context) // batch_size)
    total = context + batch_size * L + 1
    padded = torch.full((total,), pad_id, dtype=torch.int64)
    padded[:n_tok] = data
    targets = torch.full((total,), IGNORE_INDEX, dtype=torch.int64)
    targets[:n_tok] = data
    inputs = padded[: total - 1].unfold(0, context + L, L)
    labels = targets[1:].unfold(0, context + L, L).clone()
    labels[:, :context] = IGNORE_INDEX
    return inputs, labels


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), batch_size=st.integers(1, 9), tgt_len=st.integers(1, 40), context=st.integers(0, 30),
       pad_id=st.integers(0, 5), data=st.data())
def test_segments_read_on_demand_equal_the_whole_streams(n, batch_size, tgt_len, context, pad_id, data):
    assume(n >= context + 2)
    tokens = np.random.default_rng(n).integers(0, 250, n).astype(np.uint8)
    it = LMOrderedIterator(tokens, batch_size, tgt_len, context=context, pad_id=pad_id)
    inputs, labels = _materialised(tokens, batch_size, context, pad_id)
    assert it.stream_len == inputs.size(1)
    pos = data.draw(st.integers(0, it.stream_len - 1))
    seq_len = data.draw(st.integers(1, 50))
    x, y = it.segment(pos, seq_len)
    end = min(pos + seq_len, it.stream_len)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x, inputs[:, pos:end]) and torch.equal(y, labels[:, pos:end])
    assert all(torch.equal(a, b) for a, b in zip(_whole(it), (inputs, labels)))


def test_a_memory_mapped_corpus_is_read_in_place(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 256, 100_003).astype(np.uint8)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    mapped = np.load(path, mmap_mode="r")
    it = LMOrderedIterator(mapped, 7, 64)
    assert it.tokens is mapped  # kept as given: no int64 copy of the corpus
    inputs, labels = _materialised(tokens, 7, 0, 0)
    for pos, seq_len in it.positions():
        x, y = it.segment(pos, seq_len)
        assert torch.equal(x, inputs[:, pos:pos + seq_len]) and torch.equal(y, labels[:, pos:pos + seq_len])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), batch_size=st.integers(1, 9), tgt_len=st.integers(1, 40), context=st.integers(0, 30),
       data=st.data())
def test_lazy_streams_read_the_columns_and_rows_asked_for(n, batch_size, tgt_len, context, data):
    assume(n >= context + 2)
    tokens = np.random.default_rng(n).integers(0, 250, n).astype(np.uint16)
    it = LMOrderedIterator(tokens, batch_size, tgt_len, context=context, pad_id=3)
    inputs, labels = _materialised(tokens, batch_size, context, 3)
    first = data.draw(st.integers(0, batch_size - 1))
    last = data.draw(st.integers(first + 1, batch_size))
    x, y = it.streams(slice(first, last))
    assert x.shape == y.shape == (last - first, it.stream_len) and x.dim() == 2
    start = data.draw(st.integers(0, it.stream_len - 1))
    stop = data.draw(st.integers(start + 1, it.stream_len))
    cols = slice(start, stop)
    assert torch.equal(x[:, cols], inputs[first:last, cols]) and torch.equal(y[:, cols], labels[first:last, cols])
    pick = torch.tensor(sorted(data.draw(st.sets(st.integers(0, last - first - 1), min_size=1))))
    assert torch.equal(x[pick, cols], inputs[first:last][pick][:, cols])
    assert torch.equal(y[pick, cols], labels[first:last][pick][:, cols])
    other, _ = it.streams(slice(0, first + 1))  # other rows, the same columns: not the block just read
    assert torch.equal(other[:, cols], inputs[:first + 1, cols]) and torch.equal(x[:, cols], inputs[first:last, cols])


def _resident_file_kb() -> int:
    """This process's resident pages of mapped files (kB), from /proc."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTNEED"), reason="needs madvise (Linux)")
def test_reading_a_mapped_split_through_keeps_resident_memory_flat(tmp_path, monkeypatch):
    n = 48 << 20  # 48 MiB of uint8 tokens
    path = tmp_path / "tokens.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n,))[:] = 5
    mapped = np.load(path, mmap_mode="r")
    it = LMOrderedIterator(mapped, 16, 1 << 16)
    it._pages.release_bytes = 4 << 20
    before = _resident_file_kb()
    x, _ = it.streams()
    for pos in range(0, it.stream_len, it.tgt_len):
        assert int(x[:, pos:pos + it.tgt_len].max()) == 5
    grown = _resident_file_kb() - before
    assert it._pages.releases >= (n >> 22) - 1
    assert grown < 16 << 10, f"{grown} kB of the mapped split stayed resident"
    # without releases the same pass leaves the whole split resident: the check above can fail
    it = LMOrderedIterator(np.load(path, mmap_mode="r"), 16, 1 << 16)
    it._pages.release_bytes = 1 << 62
    before = _resident_file_kb()
    x, _ = it.streams()
    for pos in range(0, it.stream_len, it.tgt_len):
        x[:, pos:pos + it.tgt_len]
    assert _resident_file_kb() - before > 40 << 10
