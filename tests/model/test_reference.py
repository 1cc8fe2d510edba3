"""txl.model.reference, the plain statement of the mathematics, against the independent oracle
(transformers 4.35.2's TransfoXL) and its own invariants; the fast paths are held to it in
test_memory_invariants, test_compressive, test_model_attention and test_model_shaw."""

import pytest
import torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel

from conftest import run_segments
from test_memory_invariants import build
from tests.convert.hf_helpers import hf_model_to_txl
from txl.errors import TxlError
from txl.model import reference

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("case", [
    dict(untie_r=False),
    dict(untie_r=True, same_length=True, clamp_len=3),
    dict(untie_r=False, pre_lnorm=True, same_length=True),
])
def test_reference_equals_transformers_over_three_segments(case):
    cfg = TransfoXLConfig(vocab_size=50, d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=6,
                          cutoffs=[], div_val=1, d_embed=16, dropout=0.0, dropatt=0.0, eos_token_id=None,
                          **{"clamp_len": 0, "same_length": False, **case})
    torch.manual_seed(0)
    hf = TransfoXLLMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    txl = hf_model_to_txl(hf).eval()
    ids = torch.randint(0, 50, (3, 15), generator=torch.Generator().manual_seed(1))
    mems, want = [torch.zeros(0, 3, 16) for _ in range(2)], []  # transformers from an empty memory
    with torch.no_grad():
        for s in range(3):
            out = hf(input_ids=ids[:, 5 * s:5 * s + 5], mems=mems)
            mems = out.mems
            want.append(out.prediction_scores)
    got = torch.log_softmax(reference.forward(txl, ids, [5, 5, 5]).logits, dim=-1)
    assert torch.allclose(got, torch.cat(want, 1), atol=1e-5), (got - torch.cat(want, 1)).abs().max()


def test_probabilities_distances_and_states_are_what_they_claim():
    model = build(seed=3, mem_len=4, same_length=True)
    ids = torch.randint(0, 37, (2, 11), generator=torch.Generator().manual_seed(2))
    out = reference.forward(model, ids, [5, 6])
    assert out.logits.shape == (2, 11, 37) and len(out.layer_inputs) == 3
    assert torch.equal(out.layer_inputs[0], model.word_emb(ids))  # layer 0 reads the embedding
    # second segment: 4 memory keys then 6 of its own; query i sees distances 0 .. mem_len - 1 only
    dist = out.distances[1]
    assert dist.shape == (6, 10) and dist[0].tolist() == [4, 3, 2, 1, 0, -1, -2, -3, -4, -5]
    for p in out.probs[1]:
        assert p.shape == (2, 2, 6, 10)
        assert torch.allclose(p.sum(-1), torch.ones(2, 2, 6, dtype=p.dtype), atol=1e-12)
        hidden = (dist < 0) | (dist >= 4)
        assert torch.equal(p[..., hidden], torch.zeros_like(p[..., hidden]))
        assert (p[..., ~hidden] > 0).all()


@pytest.mark.parametrize("span", [dict(mem_len=0), dict(mem_len=2, same_length=True)])
def test_vanilla_model_equals_the_reference_segment_by_segment(span):
    # the vanilla model reads each segment alone and causally, whatever its span's memory settings
    model = build(seed=5, attn_type="abs", **span)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(4))
    want = reference.forward(model, ids, [4, 5]).logits
    got = torch.cat([model(ids[:, :4]).logits, model(ids[:, 4:]).logits], 1)  # no memory: each alone
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10), (got - want).abs().max()
    assert reference.forward(model, ids[:, 4:], [5]).logits.equal(want[:, 4:])  # segments are independent


def test_reference_is_not_the_fast_path_by_accident():
    # a memory of 2 on 3 segments: the reference forgets exactly as the model does, and both differ
    # from reading with an unbounded memory
    model = build(seed=7, mem_len=2)
    ids = torch.randint(0, 37, (1, 12), generator=torch.Generator().manual_seed(8))
    want = reference.forward(model, ids, [4, 4, 4]).logits
    got, _ = run_segments(model, ids, [4, 4, 4])
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10)
    assert (reference.forward(model, ids, [12]).logits - want).abs().max() > 1e-4


def test_bad_calls_are_refused():
    model = build(seed=1)
    ids = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(TxlError, match="sum to the 6 tokens"):
        reference.forward(model, ids, [4, 4])
    with pytest.raises(TxlError, match="positive"):
        reference.forward(model, ids, [6, 0])
    model.train()
    with pytest.raises(TxlError, match="evaluation mode"):
        reference.forward(model, ids, [6])
