"""Issue 12 item 11: byte models report bits per byte ("bpb"), char models bits per character ("bpc"),
word/BPE models perplexity ("ppl"), everywhere; old run folders that said "bpc" for byte models still load."""

import csv
import json
import math
import shutil

import numpy as np
import pytest
import torch

from conftest import tiny_model
from txl_recipes.plot.curves import _metric_label, metrics_unit, plot_learning_curves
from txl.cli import main
from txl.data.tokenizers.simple import ByteTokenizer, CharTokenizer
from txl.evaluation.scoring import score_texts, total_metric
from txl.evaluation.stream import evaluate, metric_unit, metric_value, stored_unit

# 4,000 characters, more bytes than characters (2-, 3- and 4-byte UTF-8 characters)
TEXT = ("naïve café — 東京 🐕 ok\n" * 200)[:4000]


def test_unit_per_tokenizer_kind():
    assert [metric_unit(k) for k in ("byte", "char", "word", "bpe")] == ["bpb", "bpc", "ppl", "ppl"]
    assert metric_value(math.log(2) * 3, "bpb") == pytest.approx(3.0) == metric_value(math.log(2) * 3, "bpc")
    assert metric_value(math.log(7), "ppl") == pytest.approx(7.0)
    # files written before the label: "bpc" of a byte run is bits per byte
    assert stored_unit("bpc", "byte") == "bpb" and stored_unit("bpc", "char") == "bpc"
    assert stored_unit("bpb", None) == "bpb" and stored_unit("ppl", "word") == "ppl" and stored_unit("x") is None


@pytest.mark.parametrize("unit", ["PPL", "perplexity", "bits", ""])
def test_an_unknown_unit_is_refused_not_read_as_bits(unit):
    from txl.errors import TxlError
    from txl.evaluation.dynamic import dynamic_evaluate
    from txl.evaluation.stream import evaluate_sliding_window

    model, tokens = tiny_model(vocab_size=11), np.arange(40) % 11
    with pytest.raises(TxlError, match="unit must be one of bpb, bpc, ppl, nats"):
        metric_value(1.0, unit)
    for run in (lambda: evaluate(model, tokens, unit=unit), lambda: dynamic_evaluate(model, tokens, unit=unit),
                lambda: evaluate_sliding_window(model, tokens, context=4, unit=unit)):
        with pytest.raises(TxlError, match="unit must be one of"):
            run()
    assert evaluate(model, tokens, unit="ppl").value == pytest.approx(math.exp(evaluate(model, tokens).loss))


def _uniform(vocab_size: int):
    """A model whose every prediction is uniform over the vocabulary: exactly log2(V) bits per token."""
    model = tiny_model(dtype=torch.float64, vocab_size=vocab_size)
    with torch.no_grad():
        model.word_emb.emb_layers[0].weight.zero_()  # tied with the output weights
        model.crit.out_layers[0].bias.zero_()
    return model


def test_byte_and_char_models_on_the_same_multibyte_text():
    n_chars, n_bytes = len(TEXT), len(TEXT.encode("utf-8"))
    assert n_chars == 4000 and n_bytes > n_chars
    byte_tok, char_tok = ByteTokenizer(), CharTokenizer.build(TEXT)
    results = {}
    for tok, kind in ((byte_tok, "byte"), (char_tok, "char")):
        model = tiny_model(dtype=torch.float64, vocab_size=tok.vocab_size)
        res = evaluate(model, tok.encode(TEXT), unit=metric_unit(kind), batch_size=2)
        results[kind] = res
        # the headline number is the mean loss per token (byte or character) / ln 2, labelled by what a token is
        assert res.value == pytest.approx(res.loss / math.log(2), rel=1e-12)
        assert str(res).startswith(f"{metric_unit(kind)} ")
    assert results["byte"].unit == "bpb" and results["byte"].n_tokens == n_bytes - 1
    assert results["char"].unit == "bpc" and results["char"].n_tokens == n_chars - 1

    # uniform models: exactly 8 bits per byte, log2(V) bits per character; a byte model's bits per
    # character is its bits per byte times bytes per character (the same total of bits)
    ub = evaluate(_uniform(256), byte_tok.encode(TEXT), unit="bpb", batch_size=2)
    uc = evaluate(_uniform(char_tok.vocab_size), char_tok.encode(TEXT), unit="bpc", batch_size=2)
    assert ub.value == pytest.approx(8.0, rel=1e-12)
    assert uc.value == pytest.approx(math.log2(char_tok.vocab_size), rel=1e-12)
    total_bits = ub.value * ub.n_tokens
    assert total_bits / (n_chars - 1) == pytest.approx(8.0 * (n_bytes - 1) / (n_chars - 1), rel=1e-12)

    # per-document scores: the same units
    for tok, kind in ((byte_tok, "byte"), (char_tok, "char")):
        model = tiny_model(dtype=torch.float64, vocab_size=tok.vocab_size)
        scores = score_texts(model, tok, [TEXT[:300], TEXT[300:700]])
        value, count = total_metric(scores, metric_unit(kind))
        assert value == pytest.approx(-sum(s.total for s in scores) / count / math.log(2), rel=1e-12)


TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=6", "train.eval_interval=3",
        "train.log_interval=2", "train.sample_tokens=10", "train.warmup_steps=2", "eval.mem_len=16"]


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_reports_bits_per_byte_for_a_byte_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    code, out, err = _cli(capsys, "train", corpus, "--tokenizer", "byte", "--out", run, "-q", *TINY)
    assert code == 0, err
    assert "valid bpb" in out and "bpc" not in out, out

    code, out, err = _cli(capsys, "eval", run, "--json", tmp_path / "eval.json")
    assert code == 0 and " bpb " in out and "bpc" not in out, err
    assert json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))["unit"] == "bpb"
    code, out, err = _cli(capsys, "eval", run, "--json", "-")
    assert code == 0 and json.loads(out)["unit"] == "bpb", err
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT[:200], encoding="utf-8")
    code, out, err = _cli(capsys, "score", run, doc, "--no-per-token")
    assert code == 0 and '"bpb"' in out and ": bpb " in err, err

    rows = list(csv.DictReader(open(run / "metrics.csv", newline="", encoding="utf-8")))
    assert rows and {r["unit"] for r in rows} == {"bpb"}
    assert json.loads((run / "best" / "state.json").read_text(encoding="utf-8"))["unit"] == "bpb"
    assert metrics_unit(run) == "bpb" and _metric_label(run) == "bpb"

    # a run folder written before the label: no unit column, "bpc" in state.json; it still plots, as bpb
    old = tmp_path / "old"
    shutil.copytree(run, old)
    with open(old / "metrics.csv", "w", newline="", encoding="utf-8") as f:
        fields = [k for k in rows[0] if k != "unit"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: r[k] for k in fields} for r in rows)
    for folder in ("best", "last"):
        path = old / folder / "state.json"
        state = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**state, "unit": "bpc"}), encoding="utf-8")
    assert metrics_unit(old) is None and _metric_label(old) == "bpb"
    data = plot_learning_curves([run, old], tmp_path / "plots", labels=["new", "old"])
    assert np.allclose(data["series"]["new"]["train_metric"], data["series"]["old"]["train_metric"], equal_nan=True)
    code, out, err = _cli(capsys, "plot", old, "--out", tmp_path / "plots2")
    assert code == 0, err
    code, out, err = _cli(capsys, "plot", old, "--out", tmp_path / "plots2")  # again: --out names a folder
    assert code == 2 and err.strip() == (f"txl: error: --out {tmp_path / 'plots2' / 'curves_steps.png'} already "
                                         "exists; add --force to replace it, or choose another --out folder"), err
    (tmp_path / "plots3" / "curves_steps.png").mkdir(parents=True)  # a folder where a figure goes
    code, out, err = _cli(capsys, "plot", old, "--out", tmp_path / "plots3")
    assert code == 2 and err.strip() == (f"txl: error: --out {tmp_path / 'plots3' / 'curves_steps.png'} is a "
                                         "folder; remove it, or choose another --out folder"), err
