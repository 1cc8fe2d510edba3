"""The segment loop read for another head: ``segments(..., hidden=True)``."""

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.segments import segments
from txl.model import AttentionSpan, DecodingState


def test_hidden_states_of_segments_with_a_whole_memory_equal_one_long_pass():
    """With a memory that holds everything read so far, the last layer's states read segment by segment
    equal one causal pass over the whole rows (paper §3.2; float64), also for rows that leave early."""
    model = tiny_model(mem_len=32)
    ids = torch.randint(0, 37, (3, 19), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([19, 6, 13])
    whole, _ = model.hidden_states(ids, None, span=AttentionSpan(19, 0))
    got = torch.zeros_like(whole)
    with torch.no_grad():
        for seg in segments(model, ids, span=AttentionSpan(5, 32), lengths=lengths, hidden=True):
            assert seg.output.logits is None and len(seg.output.mems) == 3
            got[seg.rows, seg.start:seg.start + seg.inputs.size(1)] = seg.hidden
    for b, n in enumerate(lengths.tolist()):  # a row that left was not read past its length
        torch.testing.assert_close(got[b, :n], whole[b, :n], rtol=0, atol=1e-12)
        assert not got[b, -(-n // 5) * 5:].any()


def test_hidden_refuses_labels_and_caches():
    model = tiny_model()
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(TxlError, match="hidden=True"):
        next(segments(model, ids, ids, span=AttentionSpan(2, 2), hidden=True))
    with pytest.raises(TxlError, match="hidden=True"):
        next(segments(model, ids, span=AttentionSpan(2, 2), hidden=True, caches=DecodingState(3, AttentionSpan(2, 2))))
