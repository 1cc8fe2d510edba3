"""The position term as FlexAttention's score_mod (benchmarks/flex_attention.py) equals the bias handed to
scaled_dot_product_attention: layer by layer in float64, and through whole models when every layer
attends with it (two segments with memory, same_length with clamp_len, Shaw's table, left-padded
memories of prompts of different lengths)."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.generation import generate
from txl.model import positions
from txl.model.attention import attention_mask, biased_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from flex_attention import flex_biased_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(B=2, H=3, T=5, M=7, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return rand(B, H, T, D), rand(B, H, T, D), rand(B, H, M + T, D), rand(B, H, M + T, D), rand(H, 4, M + T + 1)


@pytest.mark.parametrize("T,M,same_length,mem_len", [(5, 7, False, 7), (5, 7, True, 4), (6, 0, False, 0), (1, 9, False, 9),
                                                     (4, 9, True, 9)])
def test_one_layer_equals_the_biased_kernel(T, M, same_length, mem_len):
    q_content, q_pos, k, v, r_k = _inputs(T=T, M=M)
    mask = attention_mask(T, M, same_length, mem_len, "cpu")
    want = biased_attention(q_content, q_pos, k, v, r_k, mask, scale=0.5)
    torch.testing.assert_close(flex_biased_attention(q_content, q_pos, k, v, r_k, mask, scale=0.5), want,
                               rtol=0, atol=1e-12)


def test_a_padded_memory_mask_per_row():
    q_content, q_pos, k, v, r_k = _inputs()
    mask = attention_mask(5, 7, False, 7, "cpu")[None, None].repeat(2, 1, 1, 1)
    mask[1, :, :, :3] = True  # row 1's memory starts with three padding positions
    want = biased_attention(q_content, q_pos, k, v, r_k, mask, scale=0.5)
    got = flex_biased_attention(q_content, q_pos, k, v, r_k, mask, scale=0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_shapes_that_disagree_are_refused():
    q_content, q_pos, k, v, r_k = _inputs()
    mask = attention_mask(5, 7, False, 7, "cpu")
    for args in ((q_content, q_pos, k, v, r_k[..., :-2], mask), (q_content[:1], q_pos, k, v, r_k, mask),
                 (q_content, q_pos, k, v, r_k, mask[None, None].repeat(3, 1, 1, 1)), (q_content, q_pos, k, v[:, :, :4], r_k, mask)):
        with pytest.raises(TxlError, match="do not fit together"):
            flex_biased_attention(*args, scale=0.5)


@pytest.fixture
def flex_everywhere(monkeypatch):
    """Every layer of every model attends through FlexAttention's score_mod; yields the list of calls."""
    calls = []

    def attend(q_content, q_pos, k, v, r_k, mask, *, scale, dropout_p=0.0):
        assert dropout_p == 0.0
        calls.append(tuple(mask.shape))
        return flex_biased_attention(q_content, q_pos, k, v, r_k, mask, scale=scale)
    monkeypatch.setattr(positions, "biased_attention", attend)
    return calls


def _two_segments(model, ids):
    first = model(ids[:, :5])
    second = model(ids[:, 5:], mems=first.mems)
    return torch.cat([first.logits, second.logits], dim=1)


@pytest.mark.parametrize("overrides", [dict(), dict(same_length=True, clamp_len=3), dict(attn_type="shaw", shaw_max_dist=6),
                                       dict(pre_lnorm=True, untie_r=True)],
                         ids=["rel", "same_length-clamp_len", "shaw", "pre_lnorm-untie_r"])
def test_whole_models_equal_with_every_layer_on_flex(request, overrides):
    model = tiny_model(**overrides)
    ids = torch.randint(0, 37, (2, 10), generator=torch.Generator().manual_seed(1))
    prompts = [ids[0, :9], ids[1, :4]]  # left-padded memories in the decoding state
    with torch.no_grad():
        want = _two_segments(model, ids)
        want_tokens = generate(model, prompts, 12, temperature=0)
        calls = request.getfixturevalue("flex_everywhere")
        torch.testing.assert_close(_two_segments(model, ids), want, rtol=0, atol=1e-10)
        assert len(calls) == 2 * model.config.n_layer  # every layer of both segments went through it
    got_tokens = generate(model, prompts, 12, temperature=0)  # the prompts are read through it; steps are one query
    assert any(len(shape) == 4 for shape in calls)  # the left-padded memory's per-row mask reached it
    assert all(torch.equal(a, b) for a, b in zip(got_tokens, want_tokens))
