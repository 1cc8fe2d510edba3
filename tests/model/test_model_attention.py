"""Relative attention against a brute-force per-(i, j) computation of the paper's equation (§3.3)."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import layer_attention, reference_attention, tiny_model

from txl.kernels import cpu
from txl.kernels.cpu import Linear, _row_blocks, product
from txl.model.attention import (additive_mask, attention_mask, position_scores, rel_shift, rel_shift_bias,
                                  relative_positions, sinusoid)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rel_shift_matches_index_formula(dtype):
    torch.manual_seed(0)
    for qlen, mlen in [(1, 0), (4, 0), (4, 3), (3, 9), (6, 2)]:
        klen = qlen + mlen
        x = torch.randn(2, 3, qlen, klen + 1, dtype=dtype)  # columns: distances K ... 0
        # one explicit gather: entry (i, j) reads slot j + qlen - i, masked where j > mlen + i
        idx = torch.arange(klen)[None, :] + qlen - torch.arange(qlen)[:, None]
        mask = attention_mask(qlen, mlen, False, 0, "cpu")
        gathered = x.gather(-1, idx.clamp(max=klen).expand(2, 3, qlen, klen))
        out = rel_shift(x)
        assert out.shape == (2, 3, qlen, klen) and out.data_ptr() - x.data_ptr() == qlen * x.element_size()  # a view
        assert torch.equal(out.masked_fill(mask, 0.0), gathered.masked_fill(mask, 0.0))
        for i in range(qlen):
            for j in range(mlen + i + 1):  # causal entries only
                # slot m of x holds distance klen-m; entry (i, j) must hold distance mlen+i-j
                m = klen - (mlen + i - j)
                assert out[..., i, j].equal(x[..., i, m])
        # the view covers the last T*K elements of each [T, K + 1] block, each once
        seen = torch.zeros(qlen * (klen + 1), dtype=torch.long)
        seen[rel_shift(torch.arange(qlen * (klen + 1)).view(qlen, klen + 1)).flatten()] += 1
        assert seen[:qlen].eq(0).all() and seen[qlen:].eq(1).all()


def test_sinusoid_layout():
    pos = torch.tensor([0.0, 1.0, 5.0])
    enc = sinusoid(pos, 8)
    inv = [1.0 / 10000 ** (k / 8) for k in (0, 2, 4, 6)]
    for r, p in enumerate(pos.tolist()):
        expect = [math.sin(p * f) for f in inv] + [math.cos(p * f) for f in inv]
        assert torch.allclose(enc[r], torch.tensor(expect), atol=1e-6)


def brute_force(attn, h, mem, u, v, clamp_len, mask):
    """The layer as :mod:`txl.model.reference` computes it: distances as indices, (a)+(b)+(c)+(d) as
    einsums over the model's weights (its u, v are ``attn.pos.r_w_bias``/``attn.pos.r_r_bias``, as here)."""
    assert u is attn.pos.r_w_bias and v is attn.pos.r_r_bias
    return reference_attention(attn, h, mem, mask, clamp_len)


@pytest.mark.parametrize("mlen,clamp_len,same_length,pre_lnorm", [
    (0, 0, False, False), (3, 0, False, False), (3, 2, False, True), (5, 3, True, False), (2, 0, True, True)])
def test_rel_attention_equals_brute_force(mlen, clamp_len, same_length, pre_lnorm):
    torch.manual_seed(1)
    d, H, D, qlen, mem_len = 8, 2, 3, 4, 5
    attn = layer_attention(d, H, D, pre_lnorm, "rel", untie_r=True).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    h = torch.randn(2, qlen, d, dtype=torch.float64)
    mem = torch.randn(2, mlen, d, dtype=torch.float64) if mlen else None
    klen = qlen + mlen
    pos_emb = sinusoid(relative_positions(klen, clamp_len, "cpu"), d).double()
    mask = attention_mask(qlen, mlen, same_length, mem_len, "cpu")
    fast = attn(h, mem, pos_emb, mask)
    slow = brute_force(attn, h, mem, attn.pos.r_w_bias, attn.pos.r_r_bias, clamp_len, mask)
    assert torch.allclose(fast, slow, atol=1e-10), (fast - slow).abs().max()


@pytest.mark.parametrize("mlen,same_length", [(0, False), (3, False), (0, True), (2, True), (4, True), (8, True)])
@pytest.mark.parametrize("block_bytes", [None, 4 * 4 * 8, 2 * 4 * 8 * 2 * 9])
def test_evaluation_blocks_equal_brute_force(mlen, same_length, block_bytes, monkeypatch):
    """Without autograd on a CPU, attention goes through the batch and heads in blocks of bounded
    memory; it must stay the paper's equation. The smallest limit is at most one head's scores (4
    queries x (mlen + 5) columns x 8 bytes), so each block is one head of one row (6 kernel calls); the
    larger one takes whole batch rows per block (or everything, for short memories)."""
    torch.manual_seed(2)
    d, H, D, qlen, mem_len = 8, 2, 3, 4, 5
    attn = layer_attention(d, H, D, False, "rel", untie_r=True).double().eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    h = torch.randn(3, qlen, d, dtype=torch.float64)
    mem = torch.randn(3, mlen, d, dtype=torch.float64) if mlen else None
    pos_emb = sinusoid(relative_positions(qlen + mlen, 0, "cpu"), d).double()
    mask = attention_mask(qlen, mlen, same_length, mem_len, "cpu")
    slow = brute_force(attn, h, mem, attn.pos.r_w_bias, attn.pos.r_r_bias, 0, mask)
    if block_bytes is not None:
        monkeypatch.setattr(cpu, "BLOCK_BYTES", block_bytes)
    calls, kernel = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, *a, **k: calls.append(q.shape[:2]) or kernel(q, *a, **k))
    with torch.no_grad():
        fast = attn(h, mem, pos_emb, mask)
    assert torch.allclose(fast, slow, rtol=0, atol=1e-10), (fast - slow).abs().max()
    blocks = {None: 1, 4 * 4 * 8: 6, 2 * 4 * 8 * 2 * 9: {0: 1, 2: 2, 3: 2, 4: 2, 8: 3}[mlen]}[block_bytes]
    assert len(calls) == blocks and sum(b * n for b, n in calls) == 3 * 2, calls  # every row's every head once
    with_grad = attn(h, mem, pos_emb, mask)  # autograd: one block
    assert with_grad.requires_grad and torch.allclose(with_grad, slow, rtol=0, atol=1e-10)


def test_mask_causal_and_same_length_counts():
    qlen, mlen, mem_len = 4, 6, 6
    causal = attention_mask(qlen, mlen, False, mem_len, "cpu")
    for i in range(qlen):
        visible = (~causal[i]).nonzero().flatten().tolist()
        assert visible == list(range(mlen + i + 1))
    same = attention_mask(qlen, mlen, True, mem_len, "cpu")
    counts = (~same).sum(1).tolist()
    assert counts == [mem_len] * qlen  # every query sees the same number of keys
    for i in range(qlen):  # ... namely the last mem_len keys up to and including itself
        assert (~same[i]).nonzero().flatten().tolist() == list(range(mlen + i + 1 - mem_len, mlen + i + 1))


@pytest.mark.parametrize("qlen,mlen,mem_len", [(5, 0, 0), (5, 0, 3), (1, 0, 0), (3, 2, 0), (6, 0, 10)])
def test_same_length_never_masks_a_whole_row(qlen, mlen, mem_len):
    mask = attention_mask(qlen, mlen, True, mem_len, "cpu")
    assert (~mask).any(dim=1).all()
    assert not mask[torch.arange(qlen), mlen + torch.arange(qlen)].any()  # a query always sees itself


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (1, 3), (4, 0), (4, 3)])
def test_head_major_position_scores_equal_the_batched_product(qlen, mlen):
    """position_scores returns the [B, H] view of a head-major product; realigned, masked and
    differentiated it must equal the plain batched matmul (r_k broadcast over the batch)."""
    bsz, heads, d_head, klen = 3, 2, 4, qlen + mlen
    mask = attention_mask(qlen, mlen, False, mlen, "cpu")
    additive = additive_mask(mask, torch.float64)
    gen = torch.Generator().manual_seed(qlen * 10 + mlen)
    q = torch.randn(bsz, heads, qlen, d_head, dtype=torch.float64, generator=gen, requires_grad=True)
    r_k = torch.randn(heads, d_head, klen + 1, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(bsz, heads, qlen, klen, dtype=torch.float64, generator=gen).masked_fill(mask, 0.0)
    ours = position_scores(q, r_k)
    assert not ours.is_contiguous() and ours.transpose(0, 1).is_contiguous()  # the layout rel_shift reads in place
    plain = torch.matmul(q, r_k)
    assert torch.allclose(ours, plain, rtol=0, atol=1e-12)
    grads = []
    for x in (ours, plain):
        out = rel_shift_bias(x, additive)
        assert torch.equal(out, rel_shift(plain.detach()).masked_fill(mask, float("-inf")))
        grads.append(torch.autograd.grad((out.masked_fill(mask, 0.0) * weight).sum(), (q, r_k)))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: rel_shift_bias(position_scores(t, r_k.detach()), additive)
                                    .masked_fill(mask, 0.0), (q,))


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (1, 4), (3, 0), (4, 2), (5, 5)])
def test_rel_shift_bias_gradient(qlen, mlen):
    klen = qlen + mlen
    mask = attention_mask(qlen, mlen, False, mlen, "cpu")
    x = torch.randn(2, qlen, klen + 1, dtype=torch.float64, requires_grad=True)
    out = rel_shift_bias(x, additive_mask(mask, torch.float64))
    assert torch.equal(out, rel_shift(x.detach()).masked_fill(mask, float("-inf")))
    # gradient of the visible entries, checked numerically (it is 0 for the slots no visible entry reads)
    assert torch.autograd.gradcheck(lambda t: rel_shift_bias(t, additive_mask(mask, torch.float64))
                                    .masked_fill(mask, 0.0), (x,))


@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("out_features", [5, 8, 24])
@pytest.mark.parametrize("with_bias", [False, True])
def test_step_products_equal_linear(rows, out_features, with_bias):
    """The decoding step's products (row blocks of W for one or two rows, (W @ x.T).T for more) and the
    output layer's few-row product are F.linear, in float64 and in bf16."""
    gen = torch.Generator().manual_seed(rows * out_features)
    x = torch.randn(rows, 1, 6, dtype=torch.float64, generator=gen)
    weight = torch.randn(out_features, 6, dtype=torch.float64, generator=gen)
    bias = torch.randn(out_features, dtype=torch.float64, generator=gen) if with_bias else None
    want = torch.nn.functional.linear(x, weight, bias)
    out = product(x, weight, bias)
    assert out.shape == (rows, 1, out_features)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(product(x[:, 0], weight, bias), want[:, 0], rtol=0, atol=1e-12)
    layer = Linear(6, out_features, bias=with_bias).double()
    with torch.no_grad():
        layer.weight.copy_(weight)
        if with_bias:
            layer.bias.copy_(bias)
        torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)
        torch.testing.assert_close(layer(x, slice(1, 4)), want[..., 1:4], rtol=0, atol=1e-12)  # output rows
    half = product(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
    assert half.dtype == torch.bfloat16 and torch.allclose(half.double(), out, atol=0.1)


def test_row_blocks_divide_the_weight_and_follow_the_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert [_row_blocks(n) for n in (5, 6, 8, 768)] == [1, 2, 2, 2]  # two blocks even on one thread
        torch.set_num_threads(4)
        assert [_row_blocks(n) for n in (5, 6, 12, 768)] == [1, 2, 4, 4]
        torch.set_num_threads(16)
        assert [_row_blocks(n) for n in (6, 12, 768)] == [2, 4, 8]
    finally:
        torch.set_num_threads(threads)


def test_blocks_are_as_few_as_the_limit_allows_and_never_larger():
    for n in range(1, 25):
        for most in range(1, 25):
            step = cpu.even_step(n, most)
            assert step <= most and -(-n // step) == -(-n // most), (n, most, step)


@pytest.mark.parametrize("detach_mems", [True, False])
@pytest.mark.parametrize("autocast", [False, True])
def test_training_gradients_skip_only_the_detached_memory_rows(detach_mems, autocast, monkeypatch):
    """Training with a detached memory computes no input gradient for the memory's rows of the key/value
    product; every parameter's gradient equals the one of plain F.linear (float64, and bf16 autocast on a
    float32 model). A memory that keeps its graph (detach_mems=False) takes the plain product, so the
    earlier segment's gradient flows as before."""
    model = tiny_model(tgt_len=4, mem_len=5, dropout=0.0)
    model = (model.float() if autocast else model).train()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randint(0, 37, (3, 9), generator=torch.Generator().manual_seed(1))
    used = []
    backward = cpu._MemoryRowsProduct.backward

    def spy(ctx, grad):
        used.append(ctx.mlen)
        return backward(ctx, grad)

    monkeypatch.setattr(cpu._MemoryRowsProduct, "backward", staticmethod(spy))

    def gradients(product):
        monkeypatch.setattr(cpu, "_memory_rows", product)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            mems = model(x[:, :4], detach_mems=detach_mems).mems
            loss = model(x[:, 4:8], labels=x[:, 5:9], mems=mems).loss
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    got = gradients(cpu._memory_rows)
    want = gradients(lambda x, w, b, mlen: F.linear(x, w, b))
    assert used == ([4] * model.config.n_layer if detach_mems else [])
    for ours, theirs in zip(got, want):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert all(g.abs().sum() > 0 for g in want)
