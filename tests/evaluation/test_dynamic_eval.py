"""Dynamic evaluation (Krause et al. 2019): score first, then adapt; no peeking; lr=0 is static evaluation."""

import copy

import numpy as np
import pytest
import torch

from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics
from txl.errors import TxlError
from txl.evaluation.stream import evaluate


def _tokens(n, seed=0, vocab=37):
    return np.random.default_rng(seed).integers(0, vocab, size=n)


def test_lr_zero_is_exactly_the_static_evaluation_and_weights_are_restored(make_model):
    model = make_model(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = _tokens(48)
    static = evaluate(model, tokens, batch_size=1)
    for method in ("sgd", "rms"):
        dyn = dynamic_evaluate(model, tokens, lr=0.0, method=method)
        assert dyn.n_tokens == static.n_tokens == 47
        assert dyn.loss == pytest.approx(static.loss, abs=1e-12)
    adapted = dynamic_evaluate(model, tokens, lr=0.5, method="sgd", decay=0.1)
    assert adapted.loss != pytest.approx(static.loss, abs=1e-6)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_first_segment_is_scored_with_the_trained_weights(make_model):
    model = make_model(seed=2)
    tokens = _tokens(40, seed=1)
    dyn = dynamic_evaluate(model, tokens, lr=1.0, method="sgd")
    x, y = torch.as_tensor(tokens[None, :5]), torch.as_tensor(tokens[None, 1:6])
    with torch.no_grad():
        first = float(model(x, labels=y).loss)
    assert dyn.segment_losses[0] == pytest.approx(first, abs=1e-12)
    assert dyn.segment_tokens == [5] * 7 + [4]


def _reference_sgd(model, tokens, k, lr, decay):
    """Loss of segment k from an independent replay: SGD steps on segments < k only, then score k."""
    m = copy.deepcopy(model)
    trained = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    data = torch.as_tensor(tokens)
    T, mems = m.config.tgt_len, None
    for j in range(k + 1):
        x, y = data[None, j * T:(j + 1) * T], data[None, j * T + 1:(j + 1) * T + 1]
        if j == k:
            with torch.no_grad():
                return float(m(x, mems=mems, labels=y).loss)
        out = m(x, mems=mems, labels=y)
        mems = out.mems
        opt.zero_grad()
        out.loss.backward()
        with torch.no_grad():  # the pull uses the weights before this step
            pulls = {n: decay * (trained[n] - p) for n, p in m.named_parameters()}
        opt.step()
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.add_(pulls[n])


def test_segment_k_is_scored_by_the_model_adapted_on_earlier_segments_only(make_model):
    model = make_model(seed=3)
    tokens = _tokens(41, seed=2)  # 8 full segments of 5
    dyn = dynamic_evaluate(model, tokens, lr=0.3, decay=0.05, method="sgd")
    for k in (1, 3, 7):
        assert dyn.segment_losses[k] == pytest.approx(_reference_sgd(model, tokens, k, 0.3, 0.05), abs=1e-10)


def test_no_peeking_future_text_does_not_change_earlier_scores(make_model):
    model = make_model(seed=4)
    tokens = _tokens(60, seed=3)
    changed = tokens.copy()
    changed[31:] = (changed[31:] + 5) % 37  # targets of segment 6 onwards (segment 6 = inputs 30..34)
    for method in ("sgd", "rms"):
        a = dynamic_evaluate(model, tokens, lr=0.2 if method == "sgd" else 0.01, method=method)
        b = dynamic_evaluate(model, changed, lr=0.2 if method == "sgd" else 0.01, method=method)
        assert a.segment_losses[:6] == pytest.approx(b.segment_losses[:6], abs=1e-12)
        assert a.segment_losses[6] != pytest.approx(b.segment_losses[6], abs=1e-6)


def test_dynamic_evaluation_lowers_the_loss_on_repetitive_text(make_model):
    """A random phrase repeated: the memory (7) cannot reach the previous copy (period 40), adaptation can."""
    model = make_model(seed=5, dtype=torch.float32)
    phrase = _tokens(40, seed=4)
    tokens = np.tile(phrase, 12)
    static = evaluate(model, tokens, batch_size=1)
    sgd = dynamic_evaluate(model, tokens, lr=0.5, method="sgd")
    stats = gradient_statistics(model, _tokens(400, seed=9), n_segments=40)
    rms = dynamic_evaluate(model, tokens, lr=1e-2, method="rms", stats=stats)
    online = dynamic_evaluate(model, tokens, lr=1e-2, method="rms")
    for dyn in (sgd, rms, online):
        assert dyn.loss < static.loss - 0.2
        last_copies = np.mean(dyn.segment_losses[-8:])
        assert last_copies < np.mean(dyn.segment_losses[:8]) - 0.3  # later copies are predicted better
    assert rms.settings["stats"] == "train" and online.settings["stats"] == "online"


def test_gradient_statistics_are_mean_squared_gradients(make_model):
    model = make_model(seed=6)
    tokens = _tokens(16, seed=5)
    stats = gradient_statistics(model, tokens, n_segments=2)
    grads = []
    mems = None
    data = torch.as_tensor(tokens)
    for j in range(2):
        model.zero_grad()
        out = model(data[None, j * 5:(j + 1) * 5], mems=mems, labels=data[None, j * 5 + 1:(j + 1) * 5 + 1])
        out.loss.backward()
        mems = out.mems
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, _ in model.named_parameters():
        torch.testing.assert_close(stats[n], (grads[0][n] ** 2 + grads[1][n] ** 2) / 2)


def test_bad_settings_are_one_line_errors(make_model):
    model = make_model()
    with pytest.raises(TxlError, match="diverged"):
        dynamic_evaluate(model, _tokens(40), lr=1e20, method="sgd")  # float64: only a huge lr overflows
    with pytest.raises(TxlError, match="method"):
        dynamic_evaluate(model, _tokens(20), method="adam")
    with pytest.raises(TxlError, match=r"^decay must be in \[0, 1\), got 1.0$"):
        dynamic_evaluate(model, _tokens(20), decay=1.0)
    for lr in (float("nan"), float("inf"), -1e-4, "1e-4"):  # the command line's rule (txl.config.check_dynamic)
        with pytest.raises(TxlError, match=r"^lr must be a finite number >= 0"):
            dynamic_evaluate(model, _tokens(20), lr=lr)
    with pytest.raises(TxlError, match="fewer than 2"):
        dynamic_evaluate(model, _tokens(1))
