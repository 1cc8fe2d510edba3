"""`txl bench` runs end to end on a tiny config (speed itself is measured by the benchmark, not by tests)."""

import pytest

from txl_studies.speed.bench import BENCH_SMALL, EVAL_PRESETS, eval_flops_per_token, eval_speedup, format_table, run_bench, train_flops_per_token
from txl_studies.speed.generation import generation_lengths
from txl.model import TransformerXLConfig

TINY = dict(vocab_size=64, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=16, mem_len=16,
            dropout=0.1)


def test_bench_against_hf_reports_every_measure():
    res = run_bench(vs_hf=True, device="cpu", batch=2, config=TINY, repeats=1, gen_tokens=4, memory=False,
                    gen_contexts=(8, 16), gen_batches=(1, 3), log=lambda _: None)
    for impl in ("txl", "hf"):
        for key in ("train_tokens_per_s", "eval_tokens_per_s"):
            assert res["impls"][impl][key] > 0
    assert set(res["ratios_txl_over_hf"]) >= {"train_tokens_per_s", "eval_tokens_per_s"}
    assert 0 < res["impls"]["txl"]["train_fraction_of_matmul_peak"]
    points = {(r["context"], r["batch"], r["mode"]) for r in res["generation"]}
    assert points == {(c, b, m) for c in (8, 16) for b in (1, 3) for m in ("greedy", "top_p")}
    for r in res["generation"]:
        assert r["txl_tokens_per_s"] > 0 and r["gpt2_tokens_per_s"] > 0
        assert abs(r["ratio"] - r["txl_tokens_per_s"] / r["gpt2_tokens_per_s"]) < 1e-9
    table = format_table(res)
    assert "train_tokens_per_s" in table and "txl/HF" in table and "| 16 | 3 | top_p |" in table


def test_reduced_precision_run_also_measures_the_reference_in_float32():
    res = run_bench(vs_hf=True, device="cpu", dtype="bfloat16", batch=2, config=TINY, repeats=1, gen_tokens=2,
                    memory=False, gen_contexts=(8,), gen_batches=(1,), log=lambda _: None)
    assert set(res["impls"]) == {"txl", "hf_float32"} and "ratios_txl_over_hf" not in res
    ours, ref = res["impls"]["txl"], res["impls"]["hf_float32"]
    for key in ("train_tokens_per_s", "eval_tokens_per_s"):
        assert res["ratios_txl_over_hf_float32"][key] == ours[key] / ref[key]
    assert "| txl/HF float32 |" in format_table(res)
    peak32 = ref["train_flops_per_s"] / ref["train_fraction_of_matmul_peak"]
    assert abs(peak32 / res["matmul_peak_flops_float32"] - 1) < 1e-12


def test_generation_against_length_without_gpt2():
    rows = generation_lengths(TINY, [4, 24], device="cpu", repeats=1, gen_tokens=3, with_gpt2=False,
                              log=lambda _: None)
    assert [r["length"] for r in rows] == [4, 24]
    assert all(r["txl_tokens_per_s"] > 0 and r["gpt2_tokens_per_s"] is None for r in rows)


def test_flop_count_grows_with_memory():
    c = TransformerXLConfig(**TINY)
    assert train_flops_per_token(c, 16, 32) > train_flops_per_token(c, 16, 0) > 0


def test_eval_speedup_rows():
    res = eval_speedup([16, 32], device="cpu", batch=2, repeats=1, config=TINY, log=lambda _: None)
    assert [r["attention_length"] for r in res["rows"]] == [16, 32]
    assert all(r["speedup"] > 0 for r in res["rows"])
    c = TransformerXLConfig(**TINY)
    for row in res["rows"]:
        van, xl = eval_flops_per_token(c, row["attention_length"], row["tgt_len"])
        assert row["flop_ratio"] == van / xl


def test_eval_flop_counts_by_hand():
    # TINY, window 2, segment 1: per position 2 layers x (6*32*32 + 2*32*32 + 4*32*64) + softmax
    # layer 2*32*64 = 36,864; vanilla 2 positions + 2 layers x 2*32*(2*3) causal pairs; txl one
    # position + 2 layers x 6*32 x 3 keys
    assert eval_flops_per_token(TransformerXLConfig(**TINY), 2, 1) == (2 * 36864 + 768, 36864 + 1152)
    # bench-small at the paper's longest length: a causal vanilla does ~1,760x txl's FLOPs, less than
    # the paper's 1,874x (measured against a dense masked softmax)
    van, xl = eval_flops_per_token(TransformerXLConfig(**BENCH_SMALL), 3800, 128)
    assert 1700 < van / xl < 1800
    # the paper's large model (the one evaluated at 3,800) leaves room above the paper's ratios
    large = TransformerXLConfig(**EVAL_PRESETS["enwik8-large"][0])
    assert (large.n_layer, large.d_model, large.n_head, large.d_head, large.d_inner) == (24, 1024, 8, 128, 3072)
    ratios = [(lambda f: f[0] / f[1])(eval_flops_per_token(large, n, 128)) for n in (800, 1800, 2800, 3800)]
    assert all(r > paper for r, paper in zip(ratios, (363, 773, 1409, 1874)))


def test_eval_speedup_model_flag_picks_the_preset(capsys, monkeypatch):
    from conftest import run_cli
    from txl_studies.speed import bench

    seen = {}

    def fake(lengths, *, device, batch, repeats, config, log):
        seen.update(lengths=lengths, batch=batch, config=config)
        return {"rows": []}

    monkeypatch.setattr(bench, "eval_speedup", fake)
    code, _, _ = run_cli(capsys, "bench", "--eval-speedup", "--model", "enwik8-large", "--lengths", "800")
    assert code == 0 and seen == {"lengths": [800], "batch": 1, "config": bench.ENWIK8_LARGE}


def test_bench_skips_an_emulated_half_precision_and_says_why(capsys, monkeypatch, tmp_path):
    from conftest import run_cli
    from txl import runtime

    monkeypatch.setattr(runtime, "native_dtype_support", lambda device, dtype: False)
    out_json = tmp_path / "b.json"
    code, out, _ = run_cli(capsys, "bench", "--device", "cpu", "--dtype", "bfloat16", "--json", out_json)
    assert code == 0 and "skipping --dtype bfloat16" in out and "AVX512-BF16 or AMX" in out
    assert not out_json.exists()  # nothing measured, nothing written


@pytest.mark.parametrize("argv, flag", [
    (["--eval-speedup", "--gen-lengths", "128"], "--gen-lengths"),
    (["--eval-speedup", "--batch-size", "2"], "--batch-size"),
    (["--eval-speedup", "--vs", "hf"], "--vs hf"),
    (["--gen-lengths", "64", "--dtype", "bfloat16"], "--dtype"),
    (["--gen-lengths", "64", "--no-memory"], "--no-memory"),
    (["--lengths", "128"], "--lengths"),
    (["--model", "enwik8-large"], "--model"),
])
def test_bench_refuses_a_flag_its_mode_would_ignore(capsys, argv, flag):
    from conftest import one_error_line, run_cli

    code, _, err = run_cli(capsys, "bench", *argv)
    assert code == 2 and f"{flag} does not apply to" in one_error_line(err)
