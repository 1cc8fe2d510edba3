"""Rotary positions with the memory (``attn_type="rope"``, :class:`txl.model.positions.Rotary`).

The invariants shared with the other schemes run in their parametrized tests (test_memory_invariants:
two segments = one pass and any split = the reference, float64 1e-10; test_decoding: the ring buffer and
each sub-layer's step = the forward; test_generation and test_beam_batch: cached = uncached decoding;
test_compressive: compressed memory = brute force). Here: what is particular to rotations.
"""

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.model import AttentionSpan, DecodingState, TransformerXLConfig, TransformerXLLM
from txl.model.positions import rotary_angles, rotate_half

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_rotated_product_depends_on_the_difference_of_positions_only():
    # (R_a q)·(R_b k) is the same for (a, b) and (a + s, b + s), even for s in the millions (angles are
    # computed in float64), and differs for another difference
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)

    def product(a, b):
        ca, sa = rotary_angles(torch.full((5,), a), 8)
        cb, sb = rotary_angles(torch.full((5,), b), 8)
        return (rotate_half(q, ca, sa) * rotate_half(k, cb, sb)).sum(-1)

    for shift in (1, 1000, 3_000_000):
        torch.testing.assert_close(product(7 + shift, 3 + shift), product(7, 3), rtol=0, atol=1e-8)
    assert (product(7, 3) - product(7, 4)).abs().max() > 1e-2
    # a rotation keeps lengths
    c, s = rotary_angles(torch.arange(5), 8)
    torch.testing.assert_close(rotate_half(q, c, s).norm(dim=-1), q.norm(dim=-1), rtol=0, atol=1e-12)


def test_a_state_far_into_the_text_gives_the_logits_of_a_fresh_one():
    # the ring buffer keeps keys rotated at their text positions: a state whose count starts in the
    # millions reads a text exactly as one that starts at 0 (float32: angles are built in float64)
    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(vocab_size=37, n_layer=2, d_model=32, n_head=2, d_head=16,
                                                d_inner=64, dropout=0.0, tgt_len=4, mem_len=6,
                                                attn_type="rope")).eval()
    tokens = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(1))
    fresh, far = DecodingState(2, model.config.span), DecodingState(2, model.config.span)
    far.seen = 3_000_000
    with torch.no_grad():
        for t, size in ((0, 4), (4, 1), (5, 1), (6, 4), *((i, 1) for i in range(10, 30))):
            x = tokens[:, t:t + size]
            torch.testing.assert_close(model(x, caches=far).logits, model(x, caches=fresh).logits, rtol=0,
                                       atol=2e-4)
    assert far.seen == 3_000_030 and fresh.seen == 30


def test_rotary_needs_an_even_d_head_and_no_clamp_len():
    with pytest.raises(TxlError, match="even model.d_head"):
        TransformerXLConfig(vocab_size=5, d_head=3, attn_type="rope")
    with pytest.raises(TxlError, match="clamp_len=4 has no meaning"):
        TransformerXLConfig(vocab_size=5, attn_type="rope", clamp_len=4)
    model = tiny_model(attn_type="rope")
    with pytest.raises(TxlError, match="clamp_len=3 has no meaning"):
        model(torch.zeros(1, 4, dtype=torch.long), span=AttentionSpan(tgt_len=4, mem_len=7, clamp_len=3))
    assert model.config.has_memory and not tiny_model(attn_type="abs", mem_len=0).config.has_memory
    # a run's evaluation span too, before any training
    from txl.config import RunConfig

    with pytest.raises(TxlError, match="eval.clamp_len=16 has no meaning"):
        RunConfig.from_dict({"model": {"attn_type": "rope"}, "eval": {"clamp_len": 16}}).check()


def test_rotary_adds_no_parameters_and_round_trips(tmp_path):
    rope, rel = tiny_model(attn_type="rope", untie_r=True), tiny_model(attn_type="rel", untie_r=True)
    names = {n for n, _ in rope.named_parameters()}
    assert {n for n, _ in rel.named_parameters()} - names == {
        f"layers.{i}.attn.pos.{p}" for i in range(3) for p in ("r_net.weight", "r_w_bias", "r_r_bias")}
    assert rope.config.parameter_count() >= sum(p.numel() for p in rope.parameters())
    rope.save_pretrained(tmp_path)
    loaded = TransformerXLLM.from_pretrained(tmp_path).double()
    x = torch.randint(0, 37, (2, 9))
    out = rope(x[:, :5])
    torch.testing.assert_close(loaded(x[:, 5:], mems=loaded(x[:, :5]).mems).logits,
                               rope(x[:, 5:], mems=out.mems).logits, rtol=0, atol=1e-12)


def test_rotary_keeps_the_keys_in_the_autocast_dtype():
    model = tiny_model(attn_type="rope", dtype=torch.float32, mem_len=6)
    state = DecodingState(3, model.config.span)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 37, (2, 5)), caches=state)
        model(torch.randint(0, 37, (2, 1)), caches=state)
    assert state.dtype == torch.bfloat16
    assert all(c.keys.dtype == c.values.dtype == torch.bfloat16 for c in state.layers)
