"""AttentionSpan, the segment loop, and that nothing changes model.config at run time."""

import copy

import numpy as np
import pytest
import torch

import txl
from conftest import tiny_model
from txl_recipes.plot.attention import mean_attention_distance
from txl_studies.recl.measure import context_losses
from txl.errors import TxlError
from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics
from txl.evaluation.scoring import score_tokens
from txl.segments import segments
from txl.evaluation.stream import evaluate, evaluate_sliding_window
from txl.generation import generate
from txl.model import AttentionSpan, DecodingState, resolve_span
from txl.model.memory import update_mems


def test_span_validation_and_overrides():
    model = tiny_model(tgt_len=5, mem_len=7, clamp_len=3)
    span = model.config.span
    assert span == AttentionSpan(5, 7, 3, False) == AttentionSpan.of(model.config)
    assert span.replace(mem_len=0) == AttentionSpan(5, 0, 3, False)
    assert span.replace() is span
    assert resolve_span(model.config, tgt_len=2, same_length=True) == AttentionSpan(2, 7, 3, True)
    assert resolve_span(model.config, AttentionSpan(9, 1)) == AttentionSpan(9, 1, 0, False)
    assert txl.AttentionSpan is AttentionSpan
    with pytest.raises(AttributeError):
        span.mem_len = 3  # frozen
    for bad in (dict(tgt_len=0, mem_len=1), dict(tgt_len=1, mem_len=-1), dict(tgt_len=1.5, mem_len=1),
                dict(tgt_len=1, mem_len=1, same_length=1)):
        with pytest.raises(TxlError):
            AttentionSpan(**bad)
    with pytest.raises(TxlError, match="AttentionSpan"):
        model(torch.zeros(1, 3, dtype=torch.int64), span={"mem_len": 3})
    assert not hasattr(model, "set_attention_span")


@pytest.mark.parametrize("attn_type", ["rel", "shaw", "rope"])
def test_forward_with_a_span_equals_a_model_built_with_it(attn_type):
    extra = dict(shaw_max_dist=20) if attn_type == "shaw" else {}
    clamp_len = 0 if attn_type == "rope" else 4  # (rotary positions have no clamp_len)
    trained = tiny_model(attn_type=attn_type, tgt_len=5, mem_len=3, **extra)
    built = tiny_model(attn_type=attn_type, tgt_len=5, mem_len=9, clamp_len=clamp_len, same_length=True, **extra)
    built.load_state_dict(trained.state_dict())
    span = AttentionSpan(tgt_len=5, mem_len=9, clamp_len=clamp_len, same_length=True)
    x = torch.randint(0, 37, (2, 20))
    m_a = m_b = None
    for s in range(0, 20, 5):
        a = trained(x[:, s:s + 5], mems=m_a, span=span)
        b = built(x[:, s:s + 5], mems=m_b)
        assert torch.allclose(a.logits, b.logits, rtol=0, atol=1e-12)
        assert all(torch.equal(p, q) for p, q in zip(a.mems, b.mems))
        m_a, m_b = a.mems, b.mems
    assert m_a[0].size(1) == 9 and trained.config.mem_len == 3


def test_segment_loop_reads_every_column_once_with_the_previous_memory():
    model = tiny_model(mem_len=64, tgt_len=5)
    x = torch.randint(0, 37, (2, 23))
    y = torch.randint(0, 37, (2, 23))
    segs = list(segments(model, x, y, span=AttentionSpan(4, 64)))
    assert [s.start for s in segs] == [0, 4, 8, 12, 16, 20] and [s.index for s in segs] == list(range(6))
    assert torch.equal(torch.cat([s.inputs for s in segs], 1), x) and torch.equal(torch.cat([s.labels for s in segs], 1), y)
    assert segs[0].mems is None
    assert all(later.mems is earlier.output.mems for earlier, later in zip(segs, segs[1:]))
    assert not any(s.output.loss.requires_grad for s in segs)  # grad=False: no autograd
    # with a memory covering everything, the segments give the one long pass
    losses = torch.cat([s.output.token_loss for s in segs], 1)
    full = model(x, labels=y).token_loss
    assert torch.allclose(losses, full, atol=1e-10)


def test_segment_loop_drops_finished_rows_with_their_memory():
    model = tiny_model(mem_len=6, tgt_len=5)
    x = torch.randint(0, 37, (3, 12))
    segs = list(segments(model, x, span=AttentionSpan(4, 6), lengths=[4, 12, 9]))
    assert [s.rows.tolist() for s in segs] == [[0, 1, 2], [1, 2], [1, 2]]
    assert segs[1].mems[0].size(0) == 2
    alone = list(segments(model, x[1:2], span=AttentionSpan(4, 6)))
    for s, a in zip(segs, alone):  # row 1 reads the same with or without the other rows
        assert torch.allclose(s.output.logits[list(s.rows.tolist()).index(1)], a.output.logits[0], atol=1e-10)
    with pytest.raises(TxlError):
        next(segments(model, x, span=AttentionSpan(4, 6), lengths=[1, 2]))
    with pytest.raises(TxlError):
        next(segments(model, x, span={"tgt_len": 4}))


def test_segment_loop_with_grad_backpropagates_each_segment():
    model = tiny_model(mem_len=6, tgt_len=5)
    x = torch.randint(0, 37, (1, 10))
    with torch.no_grad():
        for seg in segments(model, x, x, span=AttentionSpan(5, 6), grad=True):
            seg.output.loss.backward()  # the caller's no_grad does not leak into the loop
            assert model.word_emb.emb_layers[0].weight.grad is not None
            model.zero_grad(set_to_none=True)
        assert not torch.is_grad_enabled()


def test_update_mems_detach_flag():
    h = [torch.randn(2, 4, 3, requires_grad=True)]
    old = [torch.randn(2, 3, 3)]
    kept = update_mems(old, h, 5)
    assert kept[0].shape == (2, 5, 3) and not kept[0].requires_grad and kept[0].is_contiguous()
    graph = update_mems(old, h, 5, detach=False)
    assert graph[0].requires_grad and torch.equal(graph[0], kept[0])
    assert update_mems(None, h, 0)[0].shape == (2, 0, 3)


@pytest.mark.parametrize("untie_r", [False, True])
def test_uv_resolved_once_and_registered_once(untie_r):
    model = tiny_model(untie_r=untie_r)
    owners = [layer.attn.pos if untie_r else model for layer in model.layers]
    for layer, owner in zip(model.layers, owners):
        assert layer.attn.pos.r_w_bias is owner.r_w_bias and layer.attn.pos.r_r_bias is owner.r_r_bias
    names = sorted(n for n, _ in model.named_parameters())
    assert ("r_w_bias" in names) != untie_r and ("layers.0.attn.pos.r_w_bias" in names) == untie_r
    assert len(list(model.parameters())) == len(names)
    model.float()  # conversions keep the ties
    assert all(layer.attn.pos.r_w_bias is owner.r_w_bias for layer, owner in zip(model.layers, owners))
    copied = copy.deepcopy(model)
    assert copied.layers[0].attn.pos.r_w_bias is (copied.layers[0].attn.pos if untie_r else copied).r_w_bias


@pytest.mark.parametrize("untie_r", [False, True])
def test_uv_are_read_at_call_time_by_functional_call(untie_r):
    from torch.func import functional_call

    model = tiny_model(untie_r=untie_r)
    ids = torch.randint(0, 37, (2, 5))
    name = "layers.0.attn.pos.r_w_bias" if untie_r else "r_w_bias"
    u = dict(model.named_parameters())[name].detach().clone().requires_grad_(True)
    plain = model(ids).logits
    shifted = functional_call(model, {name: u + 5.0}, (ids,)).logits
    assert (shifted - plain).abs().max() > 1e-5  # the passed u is the one used (with a stale u: exactly 0)
    functional_call(model, {name: u}, (ids,)).logits.sum().backward()
    assert u.grad is not None and u.grad.abs().sum() > 0


def test_decoding_cache_is_typed():
    model = tiny_model(mem_len=6, tgt_len=4)
    state = DecodingState(model.config.n_layer, AttentionSpan(4, 6))
    with torch.no_grad():
        out = model(torch.randint(0, 37, (2, 9)), caches=state, span=AttentionSpan(4, 6))
    # capacity mem_len + 1: a one-token step sees the memory and itself
    assert state.capacity == 7 and state.length == 7 and state.next_slot == 0
    assert state.room("cpu") == 7 + 7  # the slots and the spare room of segment views (2 tgt_len, at most S)
    assert all(c.keys.shape == (2, 2, 14, 6) and c.hidden.shape == (2, 14, 16) for c in state.layers)
    assert out.mems is None and [m.size(1) for m in state.mems()] == [6, 6, 6]
    with pytest.raises(TxlError, match="differs from the decoding state"):
        with torch.no_grad():
            model(torch.randint(0, 37, (2, 1)), caches=state, span=AttentionSpan(4, 5))


def test_no_function_changes_model_config():
    model = tiny_model(mem_len=7, tgt_len=5)
    config, saved = model.config, model.config.to_dict()
    tokens = np.random.default_rng(0).integers(0, 37, size=60)
    model.train()
    evaluate(model, tokens, batch_size=2, tgt_len=3, mem_len=11, clamp_len=2, same_length=True, warmup=True)
    evaluate(model, tokens, batch_size=1, span=AttentionSpan(6, 0))
    evaluate_sliding_window(model, tokens, context=9, stride=3)
    score_tokens(model, [tokens[:20], tokens[20:33]], tgt_len=4, mem_len=2, same_length=True)
    dynamic_evaluate(model, tokens, lr=1e-3, method="sgd", tgt_len=6, mem_len=12)
    gradient_statistics(model, tokens, tgt_len=4, mem_len=3, n_segments=3)
    generate(model, torch.as_tensor(tokens[None, :9]), 5, temperature=0, mem_len=20, tgt_len=2)
    mean_attention_distance(model, tokens, tgt_len=4, mem_len=9, max_segments=3)
    context_losses(model, tokens, [2, 5], np.array([10, 20]))
    assert model.config is config and model.config.to_dict() == saved
    assert model.training  # modes restored


def test_generation_span_sets_the_memory_length():
    model = tiny_model(mem_len=3, tgt_len=2)
    prompt = torch.randint(0, 37, (1, 5))
    long = generate(model, prompt, 12, temperature=0, mem_len=64)
    roomy = tiny_model(mem_len=64, tgt_len=2)
    assert torch.equal(long, generate(roomy, prompt, 12, temperature=0))
    assert model.config.mem_len == 3


def test_negative_clamp_len_is_refused_in_a_span():
    from txl.errors import TxlError
    from txl.model import AttentionSpan

    with pytest.raises(TxlError, match="clamp_len must be >= 0"):
        AttentionSpan(4, 8, clamp_len=-1)
