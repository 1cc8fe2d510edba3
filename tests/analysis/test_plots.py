"""Plots and analysis: recomputed attention probabilities match the fused path; plotted data match the inputs."""

import csv

import numpy as np
import pytest
import torch

from txl.analysis.attention_maps import segment_probabilities
from txl.errors import TxlError
from txl.analysis.plots import plot_mem_sweep
from txl_recipes.plot.attention import distance_matrix, mean_attention_distance, plot_attention_distance
from txl_recipes.plot.curves import plot_learning_curves, read_metrics


@pytest.mark.parametrize("overrides", [dict(), dict(same_length=True), dict(pre_lnorm=True, untie_r=True),
                                       dict(attn_type="abs", mem_len=0),
                                       dict(attn_type="shaw", shaw_max_dist=4)])
def test_recomputed_probabilities_reproduce_each_attention_output(make_model, overrides):
    """probs @ V -> o_net -> residual/LayerNorm equals the layer's real (SDPA) output, with a memory."""
    model = make_model(seed=7, **overrides)
    x = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(0))
    mems = None if model.config.attn_type == "abs" else model(torch.randint(0, 37, (2, 7))).mems
    outputs = []
    hooks = [layer.attn.register_forward_hook(lambda m, a, out: outputs.append(out)) for layer in model.layers]
    captured = []
    hooks += [layer.attn.register_forward_pre_hook(lambda m, a: captured.append(a)) for layer in model.layers]
    with torch.no_grad():
        probs = segment_probabilities(model, x, mems)
        model(x, mems=mems)
    for h in hooks:
        h.remove()
    assert len(probs) == model.config.n_layer
    for layer, p, args, real in zip(model.layers, probs, captured, outputs):
        attn = layer.attn
        h, mem, _, mask = args[:4]
        assert p.shape == (2, 2, 5, mask.size(1))
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 2, 5, dtype=p.dtype))
        assert torch.all(p[..., mask] == 0)  # hidden keys get no weight
        cat = h if mem is None else torch.cat([mem, h], 1)
        xn = attn.layer_norm(cat) if attn.pre_lnorm else cat
        hd = attn.n_head * attn.d_head
        v = attn._heads(torch.nn.functional.linear(xn, attn.qkv_net.weight[2 * hd:]))
        vec = (p @ v).transpose(1, 2).reshape(2, 5, hd)
        out = attn.o_net(vec)
        expect = h + out if attn.pre_lnorm else attn.layer_norm(h + out)
        torch.testing.assert_close(expect, real, rtol=1e-10, atol=1e-10)


def test_mean_attention_distance_matches_a_direct_computation(make_model):
    model = make_model(seed=8)
    tokens = np.random.default_rng(1).integers(0, 37, 15)
    got = mean_attention_distance(model, tokens, max_segments=2)  # segments of 5, memory 7
    total = torch.zeros(3, 2, dtype=torch.float64)
    mems = None
    for s in (0, 5):
        x = torch.as_tensor(tokens[None, s:s + 5])
        probs = segment_probabilities(model, x, mems)
        with torch.no_grad():
            mems = model(x, mems=mems).mems
        for i, p in enumerate(probs):
            k = p.size(-1)
            for q in range(5):
                for j in range(k):
                    total[i] += p[0, :, q, j] * (k - 5 + q - j)
    np.testing.assert_allclose(got, (total / 10).numpy(), rtol=1e-10)
    assert distance_matrix(2, 4).tolist() == [[2, 1, 0, -1], [3, 2, 1, 0]]
    with pytest.raises(TxlError, match=r"^max_segments must be >= 1, got 0$"):
        mean_attention_distance(model, tokens, max_segments=0)
    with pytest.raises(TxlError, match=r"^the text encodes to no tokens; give a longer text$"):
        mean_attention_distance(model, tokens[:0])


def _write_metrics(path, rows):
    fields = ["step", "tokens", "elapsed_s", "lr", "tgt_len", "mem_len", "train_loss", "train_metric",
              "tokens_per_s", "val_loss", "val_metric"]
    path.mkdir(parents=True)
    with open(path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})


def test_learning_curves_plot_exactly_the_metrics_csv_series(tmp_path):
    rows = [dict(step=s, tokens=s * 100, elapsed_s=s * 0.5, lr=1e-3 / s, train_loss=3.0 / s, train_metric=4.0 / s,
                 tokens_per_s=1000 + s, **({"val_loss": 2.0 / s, "val_metric": 3.0 / s} if s % 2 == 0 else {}))
            for s in range(1, 7)]
    _write_metrics(tmp_path / "a", rows)
    _write_metrics(tmp_path / "b", rows[:3])
    result = plot_learning_curves([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert sorted(p.name for p in result["files"]) == ["curves_steps.png", "curves_time.png", "lr.png", "throughput.png"]
    for p in result["files"]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < p.stat().st_size < 200_000
    a = result["series"]["a"]
    assert a["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert a["val_step"].tolist() == [2, 4, 6] and a["val_metric"].tolist() == pytest.approx([1.5, 0.75, 0.5])
    assert a["lr"].tolist() == pytest.approx([1e-3 / s for s in range(1, 7)])
    assert result["series"]["b"]["tokens_per_s"].tolist() == [1001, 1002, 1003]
    assert np.isnan(read_metrics(tmp_path / "a")["val_metric"][0])
    with pytest.raises(TxlError, match="metrics.csv"):
        plot_learning_curves([tmp_path / "missing"], tmp_path / "out")
    text = (tmp_path / "a" / "metrics.csv").read_bytes()
    (tmp_path / "a" / "metrics.csv").write_bytes(b"\xef\xbb\xbf" + text)  # a byte-order mark: read as without
    assert read_metrics(tmp_path / "a")["step"].tolist() == [1, 2, 3, 4, 5, 6]
    (tmp_path / "a" / "metrics.csv").write_bytes(text.replace(b"2,", b"\xe92,", 1))
    with pytest.raises(TxlError, match=r"metrics.csv is not UTF-8 text \(byte \d+\)"):
        read_metrics(tmp_path / "a")


def test_sweep_and_attention_plots_return_their_data(tmp_path):
    data = plot_mem_sweep([0, 64, 128], [3.1, 3.0, 2.95], "bpc", tmp_path / "s.png")
    assert data == {"mem_len": [0, 64, 128], "bpc": [3.1, 3.0, 2.95]} and (tmp_path / "s.png").stat().st_size > 5_000
    dist = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(plot_attention_distance(dist, tmp_path / "a.png")["distance"], dist)
    with pytest.raises(TxlError):
        plot_mem_sweep([0, 1], [1.0], "bpc", tmp_path / "x.png")


def test_missing_matplotlib_is_one_clear_error(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(TxlError, match=r"in the txl folder, \.venv/bin/python -m pip install -e '\.\[plot\]'"):
        plot_mem_sweep([0], [1.0], "bpc", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
