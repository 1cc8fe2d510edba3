"""Schedules, evaluation protocols and a short real training run on tiny Shakespeare."""

import csv
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from txl.config import load_run_config
from txl.evaluation.stream import evaluate, evaluate_sliding_window
from txl.training.checkpoint import load_checkpoint
from txl.training.loop import train
from txl.training.schedules import learning_rate, segment_span

from conftest import SHAKESPEARE, needs_shakespeare  # noqa: E402,F401  (the ablation tests use them too)


def test_learning_rate_warmup_then_cosine():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert learning_rate(1, **kw) == pytest.approx(0.1)
    assert learning_rate(10, **kw) == pytest.approx(1.0)
    assert learning_rate(60, **kw) == pytest.approx(0.55)  # half way through the cosine
    assert learning_rate(110, **kw) == pytest.approx(0.1)
    values = [learning_rate(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_segment_span_schedule():
    sched = [[0, 64], [1000, 128], [3000, 256, 512]]
    assert segment_span(0, sched, 32, 32) == (64, 64)
    assert segment_span(999, sched, 32, 32) == (64, 64)
    assert segment_span(1000, sched, 32, 32) == (128, 128)  # mem_len follows tgt_len
    assert segment_span(5000, sched, 32, 32) == (256, 512)
    assert segment_span(5, [[10, 8]], 32, 16) == (32, 16)  # before the first entry: the model's


def full_pass_loss(model, tokens):
    x = torch.as_tensor(tokens[:-1], dtype=torch.int64)[None]
    y = torch.as_tensor(tokens[1:], dtype=torch.int64)[None]
    return float(F.cross_entropy(model(x).logits[0].double(), y[0]))


def test_evaluation_with_full_memory_equals_one_long_pass():
    model = tiny_model(mem_len=64, tgt_len=5)
    tokens = np.random.default_rng(0).integers(0, 37, size=41)
    res = evaluate(model, tokens, batch_size=1, tgt_len=7, mem_len=64)
    assert res.n_tokens == 40  # every target scored exactly once
    assert res.loss == pytest.approx(full_pass_loss(model, tokens), abs=1e-9)
    assert model.config.tgt_len == 5 and model.config.mem_len == 64  # settings restored


def test_sliding_window_with_full_context_equals_one_long_pass():
    model = tiny_model(attn_type="abs", tgt_len=64)
    tokens = np.random.default_rng(1).integers(0, 37, size=30)
    res = evaluate_sliding_window(model, tokens, context=40, stride=1, batch_size=4)
    assert res.n_tokens == 29
    assert res.loss == pytest.approx(full_pass_loss(model, tokens), abs=1e-9)


def test_sliding_window_scores_each_target_once_with_limited_context():
    model = tiny_model(attn_type="abs", tgt_len=64)
    tokens = np.random.default_rng(2).integers(0, 37, size=23)
    res = evaluate_sliding_window(model, tokens, context=6, stride=4, batch_size=3)
    # by hand: first window scores 6 targets, later windows score the last <=4 targets each
    total, prev, n = 0.0, 6, 22
    x = torch.as_tensor(tokens, dtype=torch.int64)
    total += float(F.cross_entropy(model(x[None, :6]).logits[0].double(), x[1:7], reduction="sum"))
    while prev < n:
        e = min(prev + 4, n)
        logits = model(x[None, e - 6:e]).logits[0].double()
        total += float(F.cross_entropy(logits[-(e - prev):], x[prev + 1:e + 1], reduction="sum"))
        prev = e
    assert res.n_tokens == 22
    assert res.loss == pytest.approx(total / 22, abs=1e-9)


def test_warmup_scores_only_tokens_with_a_full_memory():
    model = tiny_model(mem_len=8, tgt_len=4)
    tokens = np.random.default_rng(3).integers(0, 37, size=50)
    res = evaluate(model, tokens, batch_size=2, mem_len=8, warmup=True)
    assert res.n_tokens == 49 - 8
    # one stream: the same segments as without warm-up, minus the scores of the first 8 targets
    warm = evaluate(model, tokens, batch_size=1, tgt_len=4, mem_len=8, warmup=True)
    plain = evaluate(model, tokens, batch_size=1, tgt_len=4, mem_len=8)
    x = torch.as_tensor(tokens, dtype=torch.int64)
    first8 = float(F.cross_entropy(model(x[None, :8]).logits[0], x[1:9], reduction="sum"))
    assert warm.loss * 41 == pytest.approx(plain.loss * 49 - first8, abs=1e-9)


@needs_shakespeare
def test_short_training_run_on_tiny_shakespeare(tmp_path):
    run = load_run_config(None, [
        f"data.path={SHAKESPEARE}", "data.tokenizer=char", f"data.cache_dir={tmp_path / 'cache'}",
        f"train.out_dir={tmp_path / 'run'}", "model.n_layer=2", "model.d_model=64", "model.n_head=4",
        "model.d_head=16", "model.d_inner=256", "model.dropout=0.0", "model.tgt_len=32", "model.mem_len=32",
        "train.batch_size=16", "train.max_steps=250", "train.lr=3e-3", "train.min_lr=3e-4", "train.warmup_steps=20",
        "train.eval_interval=100", "train.eval_max_tokens=4000", "train.sample_tokens=50",
        "train.tgt_len_schedule=[[0, 16], [100, 32]]", "eval.max_tokens=8000", "eval.mem_len=128"])
    result = train(run, progress=False, log=lambda msg: None)
    # a uniform guess over the 65 characters is 6.02 bpc, character frequencies alone give ~4.5
    assert result.final.unit == "bpc"
    assert result.final.value < 3.5, result.final
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert {r["tgt_len"] for r in rows if r.get("tgt_len")} == {"16", "32"}  # progressive segment length
    vals = [float(r["val_metric"]) for r in rows if r["val_metric"]]
    assert len(vals) == 3 and vals[-1] < vals[0]
    saved = json.loads((tmp_path / "run" / "best" / "run.json").read_text())
    assert saved["model"]["vocab_size"] == 65 and saved["data"]["tokenizer"] == "char"
    assert len(result.sample) == 50 and result.sample_prompt  # 50 characters after a real prompt

    # evaluation with a memory several times the training one is no worse than without memory
    ckpt = load_checkpoint(tmp_path / "run")
    from txl.data.corpus import load_run_corpus
    corpus = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer)
    with_mem = evaluate(ckpt.model, corpus.valid, tgt_len=32, mem_len=128, max_tokens=8000)
    without = evaluate(ckpt.model, corpus.valid, tgt_len=32, mem_len=0, max_tokens=8000)
    assert with_mem.value < without.value
    assert math.isclose(with_mem.value, result.final.value, rel_tol=1e-6)


@pytest.mark.parametrize("attn_type", ["rel", "abs"])
def test_max_tokens_scores_exactly_that_many_targets_with_warmup(attn_type):
    model = tiny_model(attn_type=attn_type, mem_len=20, tgt_len=5)
    tokens = np.random.default_rng(1).integers(0, 37, size=200)
    for warmup in (False, True):
        assert evaluate(model, tokens, batch_size=1, max_tokens=50, warmup=warmup).n_tokens == 50


def test_training_refuses_segments_whose_scores_cannot_fit(tmp_path, monkeypatch):
    """The training loop, not the model, compares the longest segment's attention scores under autograd
    with the memory available, before the first step: one line naming tgt_len."""
    from txl import runtime
    from txl.errors import TxlError

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3000)
    run = load_run_config(None, [
        f"data.path={text}", "data.tokenizer=char", f"data.cache_dir={tmp_path / 'cache'}",
        f"train.out_dir={tmp_path / 'run'}", "model.n_layer=2", "model.d_model=32", "model.n_head=2",
        "model.d_head=16", "model.d_inner=64", "model.tgt_len=4000", "model.mem_len=4000", "train.batch_size=2",
        "train.max_steps=1"])
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda *device: 2**28)
    with pytest.raises(TxlError, match=r"a segment of 4,000 tokens over 8,000 keys \(batch 2\) .* smaller tgt_len"):
        train(run, progress=False, log=lambda msg: None)
    assert not (tmp_path / "run" / "metrics.csv").exists()
