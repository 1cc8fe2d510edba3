"""Segment-level recurrence invariants in float64 with large random weights, at 1e-10.

Two checks, for "rel" (shared and per-layer u/v), "shaw" and "rope", with and without ``same_length`` and
``clamp_len``:

* segments carried through the memory give the logits of one long pass, wherever the two are
  the same computation (memory long enough, or ``same_length``, whose window is the same in both);
* any split into segments, with any memory length, gives the logits of :mod:`txl.model.reference`,
  the paper's equations (§3.2, §3.3) written plainly, which owns no memory at all: position t of a
  segment starting at s sees positions ``max(s - mem_len, 0) .. t`` (the memory holds the layer
  inputs of the last ``mem_len`` positions, each computed by its own segment), and with
  ``same_length`` only ``t - mem_len + 1 .. t``.

At ``init_std=0.02`` in float32 a bookkeeping bug (e.g. layer 0's memory fed to every layer)
moves logits by ~1e-4, close to float32 noise; here every parameter is drawn with a large scale
and the arithmetic is float64, so such bugs move logits by O(0.1-1) while correct code agrees to
~1e-14. Each test also feeds a deliberately wrong memory and asserts the tolerance catches it.
"""

import pytest
import torch

from conftest import run_segments, tiny_model
from txl.segments import decoding_state
from txl.kernels import cpu
from txl.model import reference

TOL = 1e-10  # float64 rounding differences between the batched and per-position sums are ~1e-14
CAUGHT = 1e-4  # a wrong memory must move some logit by at least this, 10^6 times the tolerance


pytestmark = pytest.mark.usefixtures("one_thread")


def randomize(model, seed=0, scale=0.5):
    """Every parameter re-drawn: weights, u/v and Shaw tables ~ N(0, scale), biases ~ N(0, scale),
    LayerNorm gains ~ N(1, scale), so no term of the score is negligible."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale
            p.copy_(noise + 1.0 if name.endswith("layer_norm.weight") else noise)
    return model


def build(seed=0, **overrides):
    """A float64 three-layer model with randomized weights (vocabulary 37, d_model 16, two heads)."""
    return randomize(tiny_model(seed=seed, dtype=torch.float64, **overrides), seed)


def reference_logits(model, ids, lengths):
    """Logits of ``ids`` [B, L] fed as segments of ``lengths``, from :mod:`txl.model.reference`: each
    segment's keys rebuilt from the history of layer inputs (memory = the last ``mem_len`` positions),
    distances as indices, every sum an einsum."""
    return reference.forward(model, ids, lengths).logits


ATTN = {"rel": dict(attn_type="rel"), "rel-untied": dict(attn_type="rel", untie_r=True),
        "shaw": dict(attn_type="shaw", shaw_max_dist=5), "rope": dict(attn_type="rope")}
SPANS = {"plain": {}, "same_length": dict(same_length=True), "clamp_len": dict(clamp_len=3),
         "both": dict(same_length=True, clamp_len=3)}
# Shaw has no clamp_len: its table clips distances at shaw_max_dist (5 above, 3 for "clamp_len")
SHAW_CLAMP = dict(shaw_max_dist=3)


def overrides(attn, span):
    values = {**ATTN[attn], **SPANS[span]}
    if attn == "shaw" and "clamp_len" in values:
        del values["clamp_len"]
        values.update(SHAW_CLAMP)
    if attn == "rope":  # rotary positions have no clamp_len (every distance rotates)
        values.pop("clamp_len", None)
    return values


def wrong_memories(mems):
    """Memories with the bookkeeping bugs the invariants exist to catch."""
    n = len(mems)
    yield "layer 0 memory fed to every layer", [mems[0]] * n
    yield "memory shifted by one position", [torch.cat([m[:, :1], m[:, :-1]], 1) for m in mems]
    yield "layers' memories in reverse order", mems[::-1]
    yield "memory of the layer outputs instead of inputs", [*mems[1:], mems[-1]]


def assert_close(a, b, what):
    err = (a - b).abs().max().item()
    assert torch.allclose(a, b, rtol=TOL, atol=TOL), f"{what}: max |diff| = {err:.3e}"


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_segments_with_memory_equal_one_long_pass(attn, span, pre_lnorm, device):
    # mem_len = 9 >= the 3 + 4 tokens before the last segment: without same_length the memory holds
    # the whole history, so the split is invisible; with same_length every query sees its last 9
    # positions in both computations (and the early ones everything before them)
    model = build(mem_len=9, pre_lnorm=pre_lnorm, **overrides(attn, span)).to(device)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    full = model(ids).logits
    pieces, mems = run_segments(model, ids, [3, 4, 5])
    assert_close(pieces, full, "segments vs one long pass")
    assert_close(full, reference_logits(model, ids, [12]), "long pass vs per-position reference")
    assert [m.shape for m in mems] == [(2, 9, 16)] * 3 and not any(m.requires_grad for m in mems)

    # the tolerance catches wrong bookkeeping: re-run the last segment with corrupted memories
    _, mems7 = run_segments(model, ids[:, :7], [3, 4])
    last = model(ids[:, 7:], mems=mems7).logits
    assert_close(last, full[:, 7:], "last segment with the right memory")
    for name, bad in wrong_memories(mems7):
        moved = (model(ids[:, 7:], mems=bad).logits - full[:, 7:]).abs().max().item()
        assert moved > CAUGHT, f"{name} moves logits by only {moved:.1e}"


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("attn", ATTN)
def test_segments_with_a_short_memory_equal_the_reference(attn, span):
    # mem_len 4 < history: the memory forgets, so segments differ from one long pass (unless
    # same_length, which forgets the same way) but must equal the per-position reference
    model = build(seed=2, mem_len=4, **overrides(attn, span))
    ids = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(3))
    lengths = [5, 1, 3, 6, 1]
    pieces, _ = run_segments(model, ids, lengths)
    assert_close(pieces, reference_logits(model, ids, lengths), "segments vs per-position reference")
    full = model(ids).logits
    if model.config.same_length:
        assert_close(pieces, full, "same_length segments vs one long pass")
    else:  # forgetting is real: the reference is not just the long pass
        assert (pieces - full).abs().max() > CAUGHT


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("attn", ATTN)
def test_evaluation_fast_paths_equal_the_reference(attn, span, monkeypatch, device):
    # without autograd a segment attends in blocks of rows and heads (attention.biased_attention, here
    # one head of one row per block); with the memory as tensors and as a decoding state's keys and
    # values, the logits must stay the per-position reference
    monkeypatch.setattr(cpu, "BLOCK_BYTES", 64)
    model = build(seed=2, mem_len=4, **overrides(attn, span)).eval().to(device)
    ids = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(3)).to(device)
    lengths = [5, 1, 3, 6, 1]
    ref = reference_logits(model, ids, lengths)
    with torch.no_grad():
        pieces, _ = run_segments(model, ids, lengths)
        state, cached, start = decoding_state(model, model.config.span), [], 0
        for n in lengths:
            cached.append(model(ids[:, start:start + n], caches=state).logits)
            start += n
    assert_close(pieces, ref, "segments without autograd vs per-position reference")
    assert_close(torch.cat(cached, 1), ref, "decoding-state segments vs per-position reference")


@pytest.mark.parametrize("attn", ATTN)
def test_reference_detects_the_memory_bugs(attn):
    # the reference itself tells the right bookkeeping from the wrong ones (so it is not vacuous)
    model = build(seed=4, mem_len=5, **ATTN[attn])
    ids = torch.randint(0, 37, (1, 10), generator=torch.Generator().manual_seed(5))
    ref = reference_logits(model, ids, [5, 5])
    mems = model(ids[:, :5]).mems
    assert_close(model(ids[:, 5:], mems=mems).logits, ref[:, 5:], "second segment")
    for name, bad in wrong_memories(mems):
        moved = (model(ids[:, 5:], mems=bad).logits - ref[:, 5:]).abs().max().item()
        assert moved > CAUGHT, f"{name} moves logits by only {moved:.1e}"


def test_same_length_without_memory_is_plain_causal_attention():
    # same_length needs mem_len > 0 to restrict anything: with mem_len = 0 it equals plain causal
    # attention, and a model that has seen 10 tokens still sees them all in one pass
    for attn in ATTN:
        a = build(seed=6, mem_len=0, same_length=True, **ATTN[attn])
        b = build(seed=6, mem_len=0, same_length=False, **ATTN[attn])
        ids = torch.randint(0, 37, (2, 10), generator=torch.Generator().manual_seed(7))
        out = a(ids)
        assert torch.equal(out.logits, b(ids).logits)
        assert_close(out.logits, reference_logits(b, ids, [10]), attn)
        assert [m.shape for m in out.mems] == [(2, 0, 16)] * 3
        # the empty memory is a no-op for the next segment: it sees only itself
        assert_close(a(ids[:, 4:], mems=a(ids[:, :4]).mems).logits, a(ids[:, 4:]).logits, attn)


@pytest.mark.parametrize("attn", ATTN)
def test_the_spans_really_change_the_logits(attn):
    # the settings above are not no-ops at this size: each moves the long-pass logits, and only at
    # the positions it should (same_length: queries with more than mem_len = 9 positions of history)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(1))
    base = build(mem_len=9, **ATTN[attn])(ids).logits
    same = build(mem_len=9, same_length=True, **ATTN[attn])(ids).logits
    assert torch.equal(same[:, :9], base[:, :9])
    assert (same[:, 9:] - base[:, 9:]).abs().amax(dim=(0, 2)).min() > CAUGHT
    if attn == "rope":
        return  # (no clamp_len)
    clamp = dict(shaw_max_dist=2) if attn == "shaw" else dict(clamp_len=2)
    model = build(mem_len=9, **{**ATTN[attn], **clamp})
    weights = build(mem_len=9, **ATTN[attn]).state_dict()
    # same weights; Shaw keeps the vectors of distances 0..2 of the base model's table
    model.load_state_dict({k: w[:3] if k.endswith("r_emb") else w for k, w in weights.items()})
    clamped = model(ids).logits
    assert torch.equal(clamped[:, :3], base[:, :3])  # distances <= 2 only
    assert (clamped[:, 3:] - base[:, 3:]).abs().max() > CAUGHT
