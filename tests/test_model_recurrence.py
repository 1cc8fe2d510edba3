"""Segment-level recurrence invariants: memory = one long causal pass, causality, bookkeeping."""

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError


def run_segments(model, ids, lengths):
    mems, logits = None, []
    start = 0
    for n in lengths:
        out = model(ids[:, start:start + n], mems=mems)
        mems = out.mems
        logits.append(out.logits)
        start += n
    return torch.cat(logits, 1), mems


def test_memory_window_holds_the_most_recent_layer_inputs():
    # with mem_len < history the layer-0 memory after two segments is the scaled embedding of
    # exactly the last mem_len tokens seen
    model = tiny_model(dtype=torch.float64, mem_len=4, n_layer=1)
    ids = torch.randint(0, 37, (1, 15))
    _, mems = run_segments(model, ids, [5, 5])
    emb = model.word_emb(ids[:, 6:10])
    assert torch.allclose(mems[0], emb, atol=1e-12)  # layer-0 memory = embeddings of tokens 6..9


@pytest.mark.parametrize("overrides", [{}, {"attn_type": "shaw", "shaw_max_dist": 6}])
def test_changing_a_token_changes_no_earlier_logit(overrides):
    model = tiny_model(mem_len=8, **overrides)
    ids = torch.randint(0, 37, (2, 10))
    warm = torch.randint(0, 37, (2, 6))
    mems = model(warm).mems
    base = model(ids, mems=mems).logits
    for t in range(ids.size(1)):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % 37
        logits = model(changed, mems=mems).logits
        assert torch.equal(logits[:, :t], base[:, :t])
        assert not torch.allclose(logits[:, t:], base[:, t:])


def test_abs_model_is_causal_and_has_no_memory():
    model = tiny_model(attn_type="abs")
    ids = torch.randint(0, 37, (2, 8))
    out = model(ids)
    assert out.mems is None
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 37
    assert torch.equal(model(changed).logits[:, :5], out.logits[:, :5])
    with pytest.raises(TxlError, match="no memory"):
        model(ids, mems=[torch.zeros(2, 1, 16)] * 3)


def test_memory_lengths_and_content_over_four_segments():
    model = tiny_model(mem_len=7)
    ids = torch.randint(0, 37, (2, 20))
    mems, history = None, []
    lengths = []
    for s in range(4):
        seg = ids[:, 5 * s:5 * s + 5]
        out = model(seg, mems=mems)
        history.append(model.word_emb(seg))  # layer-0 input: scaled embedding
        mems = out.mems
        lengths.append(mems[0].size(1))
        assert all(not m.requires_grad for m in mems)
        assert len(mems) == 3
        expected = torch.cat(history, 1)[:, -7:]  # the most recent states, oldest first
        assert torch.allclose(mems[0], expected)
    assert lengths == [5, 7, 7, 7]


def test_training_with_carried_memory_has_no_autograd_error():
    torch.manual_seed(0)
    model = tiny_model(dtype=torch.float32, mem_len=6, dropout=0.1, dropatt=0.1)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 37, (4, 50 * 5 + 1))
    mems = None
    for step in range(50):
        x = data[:, step * 5:step * 5 + 5]
        y = data[:, step * 5 + 1:step * 5 + 6]
        out = model(x, mems=mems, labels=y)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        mems = out.mems
        assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    assert mems[0].grad_fn is None


@pytest.mark.parametrize("attn_type", ["rel", "abs"])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_fresh_model_is_finite_and_deterministic(attn_type, pre_lnorm):
    a = tiny_model(seed=3, dtype=torch.float32, attn_type=attn_type, pre_lnorm=pre_lnorm, untie_r=True)
    b = tiny_model(seed=3, dtype=torch.float32, attn_type=attn_type, pre_lnorm=pre_lnorm, untie_r=True)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.isfinite(p).all(), name
        assert torch.equal(p, q), f"{name} is not initialised in the constructor"
    ids = torch.randint(0, 37, (2, 5))
    out = a(ids, labels=ids)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    if attn_type == "rel":
        assert torch.isfinite(a(ids, mems=out.mems).logits).all()


def test_loss_is_mean_nll_over_unignored_labels():
    model = tiny_model()
    ids = torch.randint(0, 37, (2, 6))
    labels = torch.randint(0, 37, (2, 6))
    labels[0, :3] = -100
    out = model(ids, labels=labels)
    logp = torch.log_softmax(out.logits, -1)
    keep = labels != -100
    manual = -logp[keep].gather(-1, labels[keep][:, None]).mean()
    assert out.loss.dim() == 0
    assert torch.allclose(out.loss.double(), manual, atol=1e-9)


def test_bad_memory_and_ids_raise_clear_errors():
    model = tiny_model(mem_len=4)
    ids = torch.randint(0, 37, (2, 5))
    mems = model(ids).mems
    with pytest.raises(TxlError, match="batch size"):
        model(torch.randint(0, 37, (3, 5)), mems=mems)
    with pytest.raises(TxlError, match="width"):
        model(ids, mems=[m[..., :8] for m in mems])
    with pytest.raises(TxlError, match="one per layer"):
        model(ids, mems=mems[:2])
    with pytest.raises(TxlError, match="outside the vocabulary"):
        model(torch.full((1, 3), 37))
    with pytest.raises(TxlError, match="outside the vocabulary"):
        model(torch.full((1, 3), -1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_autocast_training_step_is_finite(dtype):
    torch.manual_seed(0)
    model = tiny_model(dtype=torch.float32, cutoffs=[10, 20], div_val=2, d_embed=16)
    model.train()
    ids = torch.randint(0, 37, (2, 5))
    mems = None
    for _ in range(2):
        with torch.autocast("cpu", dtype=dtype):
            out = model(ids, mems=mems, labels=ids)
        out.loss.backward()
        mems = out.mems
        assert torch.isfinite(out.loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
