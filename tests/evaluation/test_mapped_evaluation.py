"""Evaluation, dynamic evaluation and RECL read a memory-mapped split in place and score it exactly as in memory."""

import numpy as np
import pytest
import torch

from conftest import tiny_model
from txl.data import mapped
from txl.data.mapped import token_array
from txl.errors import TxlError
from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics
from txl.evaluation.stream import evaluate, evaluate_sliding_window
from txl_studies.recl.measure import context_losses, equal_arrays

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one thread


@pytest.fixture
def split(tmp_path):
    """A token split on disk, read back mapped (as the token cache hands it out), and the same ids in memory."""
    tokens = np.random.default_rng(0).integers(0, 37, 301).astype(np.uint8)
    np.save(tmp_path / "valid.npy", tokens)
    return np.load(tmp_path / "valid.npy", mmap_mode="r"), tokens.tolist()


def test_a_mapped_split_is_not_copied():
    arr = np.arange(10, dtype=np.uint16)
    assert token_array(arr) is arr
    assert token_array(arr, max_tokens=3).base is arr


def test_memory_mapped_evaluation_equals_in_memory_and_one_causal_pass(split):
    mapped_tokens, in_memory = split
    model = tiny_model(mem_len=400)  # float64, memory longer than the split: one long causal pass
    for kwargs in ({}, {"batch_size": 3}, {"batch_size": 2, "warmup": True, "max_tokens": 150, "mem_len": 20}):
        a = evaluate(model, mapped_tokens, **kwargs)
        b = evaluate(model, in_memory, **kwargs)
        assert (a.loss, a.n_tokens) == (b.loss, b.n_tokens)
    whole = torch.tensor(in_memory)
    with torch.no_grad():
        logits = model(whole[None, :-1]).logits[0]
    expected = torch.nn.functional.cross_entropy(logits.double(), whole[1:]).item()
    assert evaluate(model, mapped_tokens, batch_size=1).loss == pytest.approx(expected, rel=1e-12)


def test_sliding_window_dynamic_and_recl_read_a_mapped_split_as_in_memory(split):
    mapped_tokens, in_memory = split
    model = tiny_model()
    a = evaluate_sliding_window(model, mapped_tokens, context=7, stride=3)
    b = evaluate_sliding_window(model, in_memory, context=7, stride=3)
    assert (a.loss, a.n_tokens) == (b.loss, b.n_tokens)
    stats = gradient_statistics(model, mapped_tokens, n_segments=3)
    same = gradient_statistics(model, in_memory, n_segments=3)
    assert stats.keys() == same.keys() and all(torch.equal(stats[k], same[k]) for k in stats)
    a = dynamic_evaluate(model, mapped_tokens, lr=1e-3, stats=stats)
    b = dynamic_evaluate(model, in_memory, lr=1e-3, stats=stats)
    assert a.loss == b.loss and a.segment_losses == b.segment_losses
    positions = np.array([20, 77, 300])
    np.testing.assert_array_equal(context_losses(model, mapped_tokens, [4, 20], positions),
                                  context_losses(model, in_memory, [4, 20], positions))


def test_an_id_outside_the_vocabulary_is_found_in_any_piece(split, monkeypatch):
    mapped_tokens, _ = split
    monkeypatch.setattr(mapped, "CHUNK_TOKENS", 16)
    data = np.array(mapped_tokens)
    data[290] = 99
    with pytest.raises(TxlError, match="token id 99 is outside the vocabulary"):
        token_array(data, vocab_size=37)
    assert token_array(mapped_tokens, vocab_size=37) is mapped_tokens
    assert equal_arrays(mapped_tokens, np.array(mapped_tokens)) and not equal_arrays(mapped_tokens, data)
    assert not equal_arrays(mapped_tokens, data[:-1])
    with pytest.raises(TxlError, match="1-D sequence of integer"):
        token_array(np.zeros(5))
    with pytest.raises(TxlError, match="token id 9223372036854775808 is larger than an int64 id"):
        token_array(np.array([1, 2**63], np.uint64), min_tokens=0)  # an int64 copy would turn it negative


def test_only_the_tokens_read_are_checked_and_a_private_mapping_keeps_its_changes(tmp_path):
    model = tiny_model()
    tokens = np.random.default_rng(1).integers(0, 37, 5000).astype(np.uint8)
    tokens[-1] = 200  # outside the vocabulary, past what max_tokens reads
    np.save(tmp_path / "t.npy", tokens)
    mapped_tokens = np.load(tmp_path / "t.npy", mmap_mode="r")
    assert evaluate(model, mapped_tokens, max_tokens=100).n_tokens == 100
    with pytest.raises(TxlError, match="token id 200 is outside the vocabulary"):
        evaluate(model, mapped_tokens)
    changed = np.load(tmp_path / "t.npy", mmap_mode="c")  # copy-on-write: changes live in its pages only
    changed[-1] = 3
    budget = mapped.PageBudget(changed, release_bytes=1)
    budget.read(len(changed))
    assert budget.releases == 0 and changed[-1] == 3
    assert evaluate(model, changed).n_tokens == 4999


def test_counts_given_to_the_readers_are_checked():
    model = tiny_model()
    tokens = np.random.default_rng(2).integers(0, 37, 300)
    for call in (lambda: evaluate(model, tokens, max_tokens=-5), lambda: evaluate(model, tokens, batch_size=0),
                 lambda: evaluate_sliding_window(model, tokens, context=8, batch_size=0),
                 lambda: evaluate_sliding_window(model, tokens, context=8.5),
                 lambda: gradient_statistics(model, tokens, n_segments=2.5),
                 lambda: dynamic_evaluate(model, tokens, max_tokens=-1)):
        with pytest.raises(TxlError, match="must be an integer"):
            call()
    with pytest.raises(TxlError, match="outside the vocabulary"):
        context_losses(model, np.r_[tokens, 99], [4], np.array([300]))
