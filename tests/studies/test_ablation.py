"""txl ablate: the Table 6 runner (variants, equal parameters and tokens, evaluation protocols, outputs)."""

import json

import numpy as np
import pytest

from conftest import tiny_model
from conftest import SHAKESPEARE, needs_shakespeare
from txl_studies.ablation.table import (JSON_NAME, PLOT_NAME, TABLE_NAME, VARIANTS, default_base, evaluate_variant,
                          plan_variants, run_ablation)
from txl.cli import main
from txl.config import RunConfig
from txl.errors import TxlError

TINY = {"model": {"n_layer": 1, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 32, "dropout": 0.0,
                  "tgt_len": 8, "mem_len": 8},
        "data": {"tokenizer": "char"},
        "train": {"batch_size": 4, "max_steps": 3, "device": "cpu", "log_interval": 1}}


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "text.txt"
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(300))
    path.write_text(text)
    return path


def tiny_base(tmp_path, **train):
    values = json.loads(json.dumps(TINY))
    values["data"]["cache_dir"] = str(tmp_path / "cache")
    values["train"].update(train)
    return RunConfig.from_dict(values)


def test_runner_trains_every_variant_on_equal_tokens_and_parameters(tmp_path, corpus):
    base = tiny_base(tmp_path)
    out = tmp_path / "ablate"
    # 2 steps of 4 x 8 tokens: the budget is rounded to whole steps
    res = run_ablation(base, str(corpus), out, budget_tokens=2 * 32 + 5, lengths=[8, 4, 16], eval_tokens=60,
                       log=lambda m: None)
    rows = res["variants"]
    assert [r["name"] for r in rows] == [v.name for v in VARIANTS]
    assert res["lengths"] == [4, 8, 16]
    tol = res["param_tolerance"]
    assert tol == 1 * (2 * 16 + 1) // 2
    for r in rows:
        assert r["steps"] == 2 and r["tokens"] == 64  # the same tokens for every variant
        assert abs(r["params"] - rows[0]["params"]) <= tol and r["params_diff"] == r["params"] - rows[0]["params"]
        assert [e["n_tokens"] for e in r["results"]] == [60, 60, 60]  # the same targets in every cell
        assert (out / r["name"] / "best" / "model.safetensors").is_file()
    by_name = {r["name"]: r for r in rows}
    assert by_name["rel-no-recurrence"]["params"] == by_name["txl"]["params"]
    assert by_name["abs"]["d_inner"] > by_name["txl"]["d_inner"]  # pays for the missing position parameters
    assert (by_name["txl"]["train_mem_len"], by_name["rel-no-recurrence"]["train_mem_len"]) == (8, 0)
    assert by_name["shaw"]["attn_type"] == "shaw" and by_name["shaw"]["shaw_max_dist"] == 8 + 8 - 1
    assert by_name["rope"]["attn_type"] == "rope" and by_name["rope"]["d_inner"] > by_name["txl"]["d_inner"]
    # the protocols: vanilla = sliding window of L; memory models = mem_len L with same_length;
    # no recurrence = segments of L without memory
    for e in by_name["abs"]["results"]:
        assert e["settings"] == {"protocol": "sliding-window", "context": e["length"], "stride": 1}
    for name in ("txl", "shaw", "rope"):
        for e in by_name[name]["results"]:
            assert (e["settings"]["mem_len"], e["settings"]["same_length"], e["settings"]["tgt_len"]) == (e["length"], True, 8)
    for e in by_name["rel-no-recurrence"]["results"]:
        assert (e["settings"]["mem_len"], e["settings"]["tgt_len"]) == (0, e["length"])

    assert json.loads((out / JSON_NAME).read_text()) == json.loads(json.dumps(res))
    table = (out / TABLE_NAME).read_text()
    assert table.count("\n| `") == 5 and "bpc L=16" in table
    for r in rows:
        assert f"{r['results'][1]['value']:.4f}" in table and f"{r['params']:,}" in table
    assert (out / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_protocol_sees_the_same_window_as_the_sliding_window():
    # a one-layer relative-attention model scored with mem_len=L + same_length attends, for every
    # target, to exactly the tokens a sliding window of L gives it: both protocols give the same loss
    tokens = np.random.default_rng(0).integers(0, 37, size=60)
    model = tiny_model(mem_len=5, tgt_len=5, n_layer=1)
    for length in (3, 7, 12):
        mem = evaluate_variant(model, tokens, VARIANTS[0], length, "bpc", tgt_len=5, max_tokens=50)
        slide = evaluate_variant(model, tokens, VARIANTS[3], length, "bpc", tgt_len=5, max_tokens=50)
        assert mem.n_tokens == slide.n_tokens == 50
        assert mem.loss == pytest.approx(slide.loss, abs=1e-12)
    # without memory, segments of L see less context on average: a different number
    seg = evaluate_variant(model, tokens, VARIANTS[1], 7, "bpc", tgt_len=5, max_tokens=50)
    assert seg.n_tokens == 50 and seg.loss != pytest.approx(mem.loss, abs=1e-6)
    # with more layers the memory states themselves saw earlier tokens (context grows with depth, §3.2),
    # so the memory protocol is no longer the sliding window
    deep = tiny_model(mem_len=5, tgt_len=5, n_layer=3)
    mem = evaluate_variant(deep, tokens, VARIANTS[0], 7, "bpc", tgt_len=5, max_tokens=50)
    slide = evaluate_variant(deep, tokens, VARIANTS[3], 7, "bpc", tgt_len=5, max_tokens=50)
    assert mem.loss != pytest.approx(slide.loss, abs=1e-12)


def test_default_base_is_parameter_matched():
    planned = plan_variants(default_base(), vocab_size=65)
    counts = [count for _, _, count in planned]
    unit = 4 * (2 * 128 + 1)
    assert counts[0] == counts[1] and all(abs(c - counts[0]) <= unit // 2 for c in counts)
    shaw_cfg = planned[2][1]
    assert shaw_cfg.shaw_max_dist == 127 and shaw_cfg.mem_len == 64


def test_wall_clock_budget_is_measured_and_reported(tmp_path, corpus):
    res = run_ablation(tiny_base(tmp_path), str(corpus), tmp_path / "wall", budget_minutes=0.01, lengths=[4],
                       eval_tokens=20, log=lambda m: None)
    assert res["budget"] == {"tokens": None, "minutes": 0.01, "default_steps": None}
    for r in res["variants"]:
        assert r["steps"] >= 1 and r["tokens"] == r["steps"] * 32 and r["train_wall_s"] >= 0


def test_refuses_a_used_output_folder_and_bad_settings(tmp_path, corpus, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(TxlError, match="not empty"):
        run_ablation(tiny_base(tmp_path), str(corpus), used, log=lambda m: None)
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    with pytest.raises(TxlError, match="tgt_len_schedule"):
        run_ablation(tiny_base(tmp_path, tgt_len_schedule=[[0, 4]]), str(corpus), tmp_path / "x", log=lambda m: None)
    cases = [(["--lengths", "64,x"], "--lengths"), (["--budget-tokens", "5", "--budget-minutes", "1"], "not allowed with"),
             (["--lengths", "0"], "positive"), (["--budget-tokens", "0"], "--budget-tokens must be >= 1, got 0")]
    for extra, message in cases:
        assert main(["ablate", "--data", str(corpus), "--out", str(tmp_path / "cli"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("txl: error:") and message in err and err.count("\n") == 1
    assert main(["ablate", "--data", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


@pytest.mark.slow
@needs_shakespeare
def test_ablate_on_tiny_shakespeare(tmp_path):
    """A CPU-affordable `txl ablate` (2 layers, d_model 64, 300 steps of 16 x 64 characters per variant).

    At such budgets the models are far from converged and the ranking of the variants is not stable
    (this configuration gave the paper's order, txl < rel-no-recurrence < shaw < abs, but the README's
    4-layer run ranks rel-no-recurrence first), so the test asserts only what held with wide margins
    in both: every variant learns; the vanilla model, whose absolute positions past its training
    segment were never trained, gets worse beyond it, while full Transformer-XL does not; and full
    Transformer-XL beats the vanilla model at the best length of each.
    """
    config = tmp_path / "base.toml"
    config.write_text(
        "[model]\nn_layer = 2\nd_model = 64\nn_head = 4\nd_head = 16\nd_inner = 256\ndropout = 0.0\n"
        "tgt_len = 64\nmem_len = 64\n"
        f"[data]\ntokenizer = \"char\"\ncache_dir = \"{tmp_path / 'cache'}\"\n"
        "[train]\nbatch_size = 16\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 30\nlog_interval = 50\ndevice = \"cpu\"\n")
    out = tmp_path / "ablate"
    assert main(["ablate", "--data", str(SHAKESPEARE), "--config", str(config), "--out", str(out),
                 "--budget-tokens", str(300 * 16 * 64), "--lengths", "64,256", "--eval-tokens", "2000", "-q"]) == 0
    res = json.loads((out / JSON_NAME).read_text())
    assert (out / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / TABLE_NAME).read_text().count("\n| `") == 4
    rows = {r["name"]: r for r in res["variants"]}
    assert {r["tokens"] for r in rows.values()} == {300 * 16 * 64}
    assert max(r["params"] for r in rows.values()) - min(r["params"] for r in rows.values()) <= res["param_tolerance"] * 2
    at = {name: {e["length"]: e["value"] for e in r["results"]} for name, r in rows.items()}
    for name, r in rows.items():  # a uniform guess over 65 characters is 6.02 bpc
        assert r["best"]["value"] < 4.0, (name, r["best"])
    assert rows["txl"]["best"]["value"] < rows["abs"]["best"]["value"]
    assert at["abs"][256] > at["abs"][64]  # untrained absolute positions past the segment
    assert at["txl"][256] < at["abs"][256]
    assert at["txl"][256] <= at["txl"][64] + 0.02  # a longer memory does not hurt the relative encoding
