"""Shaw et al. (2018) relative attention with memory (attn_type="shaw"), the Table 6 comparison."""

import pytest
import torch

from conftest import layer_attention, reference_attention, tiny_model
from txl.errors import TxlError
from txl.generation import generate
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.model.attention import attention_mask


def shaw_brute_force(attn, h, mem, max_dist, mask):
    """The layer as :mod:`txl.model.reference` computes it: (q_i·k_j + q_i·a_{min(i-j, max_dist)}) / sqrt(D)."""
    assert attn.pos.max_dist == max_dist
    return reference_attention(attn, h, mem, mask)


@pytest.mark.parametrize("mlen,max_dist,same_length,pre_lnorm", [
    (0, 10, False, False), (3, 10, False, False), (3, 2, False, True), (5, 3, True, False), (4, 1, True, True)])
def test_shaw_attention_equals_brute_force(mlen, max_dist, same_length, pre_lnorm):
    torch.manual_seed(2)
    d, H, D, qlen, mem_len = 8, 2, 3, 4, 5
    attn = layer_attention(d, H, D, pre_lnorm, "shaw", shaw_max_dist=max_dist).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    assert attn.pos.r_emb.shape == (max_dist + 1, H, D)  # per layer: one vector per clipped distance and head
    assert not hasattr(attn, "r_net") and not hasattr(attn, "r_w_bias")  # no W_kR, no u/v
    h = torch.randn(2, qlen, d, dtype=torch.float64)
    mem = torch.randn(2, mlen, d, dtype=torch.float64) if mlen else None
    mask = attention_mask(qlen, mlen, same_length, mem_len, "cpu")
    fast = attn(h, mem, None, mask)
    slow = shaw_brute_force(attn, h, mem, max_dist, mask)
    assert torch.allclose(fast, slow, atol=1e-10), (fast - slow).abs().max()


def test_shaw_positions_matter():
    # the table is really used: changing the vector of distance 1 changes the output of every query
    # with a visible key at distance 1, and nothing else
    torch.manual_seed(0)
    attn = layer_attention(8, 2, 4, False, "shaw", shaw_max_dist=6).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    h = torch.randn(1, 4, 8, dtype=torch.float64)
    mask = attention_mask(4, 0, False, 0, "cpu")
    base = attn(h, None, None, mask)
    with torch.no_grad():
        attn.pos.r_emb[1] += 1.0
    changed = attn(h, None, None, mask)
    assert torch.equal(changed[:, 0], base[:, 0])  # query 0 sees only itself (distance 0)
    assert not torch.allclose(changed[:, 1:], base[:, 1:])


def test_shaw_cached_generation_equals_recomputing_the_prefix():
    """With a memory holding the whole text, cached decoding equals re-reading everything each step
    (cached = uncached with a sliding memory is tested with the other attention types in test_generation)."""
    model = tiny_model(tgt_len=4, attn_type="shaw", shaw_max_dist=8, mem_len=64)
    prompt = torch.randint(0, 37, (2, 9))
    ours = generate(model, prompt, 15, temperature=0)
    full = prompt
    for _ in range(15):
        full = torch.cat([full, model(full).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(ours, full)


def test_shaw_table_is_trained_and_saved(tmp_path):
    model = tiny_model(dtype=torch.float32, attn_type="shaw", shaw_max_dist=5, mem_len=4)
    model.train()
    ids = torch.randint(0, 37, (2, 6))
    out = model(ids, labels=ids)
    model(ids, mems=out.mems, labels=ids).loss.backward()
    for layer in model.layers:
        assert layer.attn.pos.r_emb.grad is not None and layer.attn.pos.r_emb.grad.abs().sum() > 0
    model.eval()
    model.save_pretrained(tmp_path)
    again = TransformerXLLM.from_pretrained(tmp_path)
    assert again.config.attn_type == "shaw" and again.config.shaw_max_dist == 5
    assert torch.equal(again(ids).logits, model(ids).logits)


def test_shaw_needs_a_clipping_distance():
    with pytest.raises(TxlError, match="shaw_max_dist"):
        TransformerXLConfig(attn_type="shaw")
    with pytest.raises(TxlError, match="shaw_max_dist"):
        TransformerXLConfig(shaw_max_dist=-1)
