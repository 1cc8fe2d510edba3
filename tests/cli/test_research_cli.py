"""txl recl, txl eval --dynamic / --sweep-mem and txl plot end to end on tiny runs."""

import json

import numpy as np
import pytest

from txl.cli import main
from txl.evaluation.dynamic import dynamic_evaluate
from txl.evaluation.stream import evaluate
from txl_studies.recl.measure import context_losses, recl_table, scored_positions
from txl.data.corpus import load_run_corpus
from txl.training.checkpoint import load_checkpoint

TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "train.batch_size=4", "train.max_steps=6", "train.eval_interval=3",
        "train.sample_tokens=0", "train.warmup_steps=2", "eval.mem_len=16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("research")
    corpus = base / "corpus.txt"
    corpus.write_text("".join(f"line {i % 7}: the quick brown fox jumps over the lazy dog.\n" for i in range(80)))
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(base / "cache"))
    for name, extra in (("xl", ["model.mem_len=8"]), ("vanilla", ["model.attn_type=abs", "model.mem_len=0"])):
        assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(base / name), "-q", *TINY, *extra]) == 0
    yield base, corpus
    mp.undo()


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_recl_command_writes_table_json_and_plot(runs, capsys):
    base, corpus = runs
    out_dir = base / "recl"
    code, out, err = run_cli(capsys, "recl", base / "xl", base / "vanilla", "--data", corpus, "--start", "2",
                             "--delta", "3", "--max-context", "14", "--positions", "60", "--out", out_dir)
    assert code == 0, err
    assert "| model | r = 0.1 | r = 0.5 | r = 1 |" in out and "| xl |" in out and "| vanilla |" in out
    saved = json.loads((out_dir / "recl.json").read_text())
    assert saved["contexts"] == [2, 5, 8, 11, 14] and saved["names"] == ["xl", "vanilla"]
    assert (out_dir / "recl_gain.png").stat().st_size > 5_000
    # the saved numbers are the definition applied to independently measured window losses
    losses = []
    for name in ("xl", "vanilla"):
        ckpt = load_checkpoint(base / name)
        tokens = np.asarray(ckpt.tokenizer.encode_file_bytes(corpus.read_bytes(), source=str(corpus)))
        losses.append(context_losses(ckpt.model, tokens, saved["contexts"], scored_positions(len(tokens), 14, 60)))
    again = recl_table(np.stack(losses), ["xl", "vanilla"], saved["contexts"])
    assert saved["recl"] == {str(r): again.recl[r] for r in again.ratios}
    np.testing.assert_allclose(saved["gains"]["0.1"], again.gains[0.1], rtol=1e-9)
    code, out, err = run_cli(capsys, "recl", base / "xl", "--data", corpus, "--start", "4", "--max-context", "6")
    assert code == 2 and "max-context" in err and out == ""
    before = (out_dir / "recl.json").read_bytes()
    code, out, err = run_cli(capsys, "recl", base / "xl", "--data", corpus, "--out", out_dir)
    assert code == 2 and "already exists" in err and (out_dir / "recl.json").read_bytes() == before


def test_recl_without_data_scores_the_runs_own_test_split(runs, capsys):
    base, corpus = runs
    code, out, err = run_cli(capsys, "recl", base / "xl", base / "vanilla", "--start", "2", "--delta", "2",
                             "--max-context", "6", "--positions", "5", "--out", base / "recl-own")
    assert code == 0, err
    saved = json.loads((base / "recl-own" / "recl.json").read_text())
    ckpt = load_checkpoint(base / "xl")
    test_split = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer).test
    losses = [context_losses(load_checkpoint(base / n).model, test_split, saved["contexts"],
                             scored_positions(len(test_split), 6, 5)) for n in ("xl", "vanilla")]
    again = recl_table(np.stack(losses), ["xl", "vanilla"], saved["contexts"])
    assert saved["recl"] == {str(r): again.recl[r] for r in again.ratios}


def test_eval_dynamic_prints_static_and_dynamic_on_the_same_segments(runs, capsys):
    base, corpus = runs
    code, out, err = run_cli(capsys, "eval", base / "xl", "--data", corpus, "--dynamic", "--dynamic-method", "sgd",
                             "--dynamic-lr", "0.05", "--max-tokens", "300", "--json")
    assert code == 0, err
    res = json.loads(out)
    ckpt = load_checkpoint(base / "xl")
    tokens = ckpt.tokenizer.encode_file_bytes(corpus.read_bytes(), source=str(corpus))
    static = evaluate(ckpt.model, tokens, batch_size=1, mem_len=16, max_tokens=300)
    assert res["static"] == pytest.approx(static.value, rel=1e-9) and res["n_tokens"] == 300
    dynamic = dynamic_evaluate(ckpt.model, tokens, lr=0.05, method="sgd", mem_len=16, max_tokens=300)
    assert res["protocol"] == "dynamic-sgd" and res["dynamic"] == pytest.approx(dynamic.value, rel=1e-9)
    assert abs(res["dynamic"] - res["static"]) > 1e-4  # adapting on the text changed the score
    code, out, err = run_cli(capsys, "eval", base / "xl", "--max-tokens", "200", "--dynamic")  # rms, train stats
    assert code == 0 and "stats=train" in out and "static" in out, err
    for bad, expect in ((["--dynamic", "--sliding-window", "8"], "choose one"), (["--dynamic-lr", "0.1"], "--dynamic"),
                        (["--plot", str(base / "p.png")], "--sweep-mem"), (["--dynamic", "--warmup"], "warm-up"),
                        (["--sweep-mem", "0,x"], "integers"), (["--dynamic", "--dynamic-decay", "1.5"], "decay"),
                        (["--sliding-window", "8", "--mem-len", "32", "--warmup"], "--mem-len, --warmup would be ignored")):
        code, out, err = run_cli(capsys, "eval", base / "xl", *bad)
        assert code == 2 and expect in err and len(err.strip().splitlines()) == 1, (bad, err)


def test_eval_sweep_mem_table_and_plot(runs, capsys):
    base, corpus = runs
    plot = base / "sweep.png"
    code, out, err = run_cli(capsys, "eval", base / "xl", "--data", corpus, "--sweep-mem", "16,0,8",
                             "--max-tokens", "400", "--plot", plot, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert [r["mem_len"] for r in res["results"]] == [0, 8, 16]
    ckpt = load_checkpoint(base / "xl")
    tokens = ckpt.tokenizer.encode_file_bytes(corpus.read_bytes(), source=str(corpus))
    for r in res["results"]:
        assert r["value"] == pytest.approx(evaluate(ckpt.model, tokens, mem_len=r["mem_len"], max_tokens=400).value)
    assert plot.stat().st_size > 5_000
    code, out, err = run_cli(capsys, "eval", base / "vanilla", "--sweep-mem", "0,8")
    assert code == 2 and "no memory" in err


def test_plot_command_learning_curves_and_attention(runs, capsys):
    base, _ = runs
    code, out, err = run_cli(capsys, "plot", base / "xl", base / "vanilla", "--out", base / "plots")
    assert code == 0, err
    assert {p.name for p in (base / "plots").iterdir()} >= {"curves_steps.png", "curves_time.png", "lr.png",
                                                           "throughput.png"}
    code, out, err = run_cli(capsys, "plot", "--attention", base / "xl", "--text", "the quick brown fox " * 3,
                             "--out", base / "plots")
    assert code == 0, err
    assert (base / "plots" / "attention_distance.png").stat().st_size > 5_000 and "layer 0:" in out
    (base / "fox.txt").write_text("the quick brown fox " * 3, encoding="utf-8")
    code, out2, err = run_cli(capsys, "plot", base / "xl", "--attention", "--data", base / "fox.txt",
                              "--out", base / "plots", "--force")  # the grammar's spelling; --force: replace it
    assert code == 0 and out2 == out, err
    code, out, err = run_cli(capsys, "plot", base / "nowhere")
    assert code == 2 and "metrics.csv" in err
    code, out, err = run_cli(capsys, "plot", "--attention", base / "xl")
    assert code == 2 and "--text" in err
    (base / "empty.txt").write_text("", encoding="utf-8")
    code, out, err = run_cli(capsys, "plot", base / "xl", "--attention", "--data", base / "empty.txt", "--out",
                             base / "plots2")
    assert code == 2 and err.strip().splitlines()[-1] == (f"txl: error: --data {base / 'empty.txt'} encodes to no "
                                                          "tokens; give a longer text")
    assert not (base / "plots2").exists()
