"""RECL (paper §4.3, appendix C): the definition on hand-built loss arrays, then a small end-to-end run."""

import json
import math

import numpy as np
import pytest
import torch

from txl.errors import TxlError
from txl_studies.recl.measure import (baseline, context_losses, gain_curve, recl_from_gains, recl_table, relative_gain,
                      top_positions)


def test_baseline_is_the_per_position_minimum_over_models():
    losses = np.array([[1.0, 5.0, 2.0], [3.0, 0.5, 2.5], [2.0, 4.0, 0.1]])
    assert baseline(losses).tolist() == [1.0, 0.5, 0.1]
    with pytest.raises(TxlError):
        baseline(np.array([[1.0, np.nan]]))
    with pytest.raises(TxlError):
        baseline(np.zeros((0, 3)))


def test_top_r_keeps_the_hardest_positions_by_baseline():
    base = np.array([0.3, 2.0, 1.0, 5.0, 0.1, 4.0, 3.0, 0.2, 0.0, 1.5])
    assert top_positions(base, 0.1).tolist() == [3]
    assert top_positions(base, 0.3).tolist() == [3, 5, 6]
    assert top_positions(base, 0.5).tolist() == [1, 3, 5, 6, 9]
    assert top_positions(base, 1.0).tolist() == list(range(10))
    assert top_positions(base, 0.01).tolist() == [3]  # at least one position
    assert top_positions(np.ones(4), 0.5).tolist() == [0, 1]  # ties: earlier positions first
    for r in (0.0, 1.5, -0.1):
        with pytest.raises(TxlError):
            top_positions(base, r)


def test_relative_gain_matches_the_appendix_formula_by_hand():
    # two models, four positions; baseline at c = [1, 2, 3, 4] (model 0 best at 0,2; model 1 at 1,3)
    short = np.array([[1.0, 2.5, 3.0, 4.5], [1.5, 2.0, 3.5, 4.0]])
    long = np.array([[0.5, 2.0, 1.0, 4.2], [2.0, 1.0, 3.0, 5.0]])
    # r = 0.5: T = positions 2 and 3 (baseline 3 and 4)
    f_cc = (3.0 + 4.0) / 2
    f0 = (min(3.0, 1.0) + min(4.0, 4.2)) / 2  # model 0 improves at 2; at 3 it is clipped to the baseline
    f1 = (min(3.0, 3.0) + min(4.0, 5.0)) / 2  # model 1 never beats the baseline: gain 0
    expected = [(math.exp(f_cc) - math.exp(f)) / math.exp(f_cc) for f in (f0, f1)]
    np.testing.assert_allclose(relative_gain(short, long, 0.5), expected, rtol=1e-12)
    assert relative_gain(short, long, 0.5)[1] == 0.0
    # r = 1: all positions
    base = short.min(axis=0)
    f_cc = base.mean()
    f0 = np.minimum(base, long[0]).mean()
    np.testing.assert_allclose(relative_gain(short, long, 1.0)[0], 1 - math.exp(f0 - f_cc), rtol=1e-12)


def test_a_worse_loss_never_counts_and_the_shared_baseline_is_fair():
    rng = np.random.default_rng(0)
    short = rng.uniform(0.5, 3.0, size=(3, 50))
    long = short + rng.uniform(0.0, 1.0, size=short.shape)  # every model gets worse with context
    assert np.all(relative_gain(short, long, 0.5) == 0.0)
    # a model that is the baseline everywhere and one that is worse at c both need to beat the same b
    short = np.stack([np.full(20, 2.0), np.full(20, 3.0)])
    long = np.stack([np.full(20, 1.5), np.full(20, 1.5)])
    g = relative_gain(short, long, 1.0)
    assert g[0] == g[1] == pytest.approx(1 - math.exp(-0.5))


def test_recl_walk_stops_at_the_first_gain_below_the_threshold():
    contexts = [100, 200, 300, 400, 500]
    assert recl_from_gains(contexts, np.array([0.05, 0.02, 0.005, 0.3])) == (300, False)  # later gain ignored
    assert recl_from_gains(contexts, np.array([0.001, 0.5, 0.5, 0.5])) == (100, False)
    assert recl_from_gains(contexts, np.array([0.01, 0.01, 0.01, 0.01])) == (500, True)  # >= threshold continues
    assert recl_from_gains(contexts, np.array([0.01, 0.0099999, 0.5, 0.5])) == (200, False)
    with pytest.raises(TxlError):
        recl_from_gains(contexts, np.array([0.1]))


def test_recl_table_on_a_synthetic_group():
    """Model A keeps improving up to c=300, model B stops after c=100, model C never improves."""
    contexts = [100, 200, 300, 400]
    P = 40
    rng = np.random.default_rng(1)
    hard = rng.uniform(2.0, 3.0, P)
    a = np.stack([hard, hard - 0.3, hard - 0.6, hard - 0.6])
    b = np.stack([hard + 0.1, hard - 0.2, hard - 0.2, hard - 0.2])
    c = np.stack([hard + 0.5] * 4)
    losses = np.stack([a, b, c])
    result = recl_table(losses, ["A", "B", "C"], contexts)
    for r in (0.1, 0.5, 1.0):
        assert result.recl[r] == {"A": 300, "B": 200, "C": 100}
        assert not any(result.censored[r].values())
    gains = gain_curve(losses, 1.0)
    assert gains.shape == (3, 3)
    assert gains[2].tolist() == [0.0, 0.0, 0.0]
    # step 100 -> 200: baseline is A's loss at 100 (hard); A and B both reach hard - 0.3 / - 0.2
    assert gains[0, 0] == pytest.approx(1 - math.exp(-0.3))
    assert gains[1, 0] == pytest.approx(1 - math.exp(-0.2))
    table = result.markdown()
    assert table.splitlines()[0] == "| model | r = 0.1 | r = 0.5 | r = 1 |"
    assert "| A | 300 | 300 | 300 |" in table
    json.dumps(result.to_dict())
    with pytest.raises(TxlError):
        recl_table(losses, ["A", "B"], contexts)
    with pytest.raises(TxlError):
        recl_table(losses, ["A", "B", "C"], [100, 300, 200, 400])


def test_context_losses_are_exact_window_losses(make_model):
    """l(c, t) = -log P(x_t | x_{t-c..t-1}): equals a direct forward of that window, whatever the memory setting."""
    model = make_model(seed=3, mem_len=7)
    tokens = np.random.default_rng(0).integers(0, 37, size=60)
    positions = np.array([20, 33, 59])
    out = context_losses(model, tokens, [4, 9, 20], positions, batch_size=2)
    assert out.shape == (3, 3)
    for k, c in enumerate([4, 9, 20]):
        for j, t in enumerate(positions):
            window = torch.as_tensor(tokens[t - c:t])[None]
            with torch.no_grad():
                logp = torch.log_softmax(model(window).logits[0, -1], dim=-1)
            assert out[k, j] == pytest.approx(-float(logp[tokens[t]]), rel=1e-9)
    # tokens before t - c do not matter; the token at t does not leak into its own context
    changed = tokens.copy()
    changed[: 59 - 20] = (changed[: 59 - 20] + 1) % 37
    np.testing.assert_allclose(context_losses(model, changed, [4, 9, 20], [59])[:, 0], out[:, 2], rtol=1e-12)
    assert model.config.mem_len == 7  # span restored
    with pytest.raises(TxlError):
        context_losses(model, tokens, [4, 30], positions)  # position 20 has no 30 tokens of context
