"""Scoring API and `txl score`: invariants of per-token log-probabilities with memory."""

import csv
import json
import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from txl.cli import main
from txl.config import RunConfig
from txl.data import ByteTokenizer, CharTokenizer
from txl.errors import TxlError
from txl.evaluation.stream import evaluate
from txl.evaluation.scoring import score, score_texts, token_text, total_metric
from txl.training.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one thread


LENGTHS = (2, 3, 11, 17, 26, 9, 40)  # many segments of tgt_len 5, and lengths off the segment grid


def random_docs(lengths=LENGTHS, vocab=37, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n) for n in lengths]


def causal_logprobs(model, doc):
    """log p(doc[t] | doc[<t]) for t >= 1 from one pass over the whole document (no segmenting)."""
    with torch.no_grad():
        logits = model(torch.as_tensor(doc[None, :-1])).logits[0]
    lp = torch.log_softmax(logits.double(), -1)
    return lp.gather(1, torch.as_tensor(doc[1:, None]))[:, 0].numpy()


@pytest.mark.parametrize("overrides", [{}, {"same_length": True, "clamp_len": 4}, {"mem_len": 0},
                                       {"mem_len": 3, "tgt_len": 4}, {"attn_type": "abs"}])
def test_scores_do_not_depend_on_the_other_documents(overrides):
    model = tiny_model(**overrides)
    docs = random_docs()
    alone = [score(model, [d])[0] for d in docs]
    for batch_size in (2, 3, len(docs)):
        batched = score(model, docs, batch_size=batch_size)
        shuffled = score(model, docs[::-1], batch_size=batch_size)[::-1]
        for a, b, c in zip(alone, batched, shuffled):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=1e-12, equal_nan=True)
            np.testing.assert_allclose(c.logprobs, a.logprobs, rtol=0, atol=1e-12, equal_nan=True)


def test_float32_batching_within_1e5():
    model = tiny_model(dtype=torch.float32)
    docs = random_docs(seed=3)
    batched = score(model, docs, batch_size=4)
    for doc, b in zip(docs, batched):
        a = score(model, [doc])[0]
        assert np.nanmax(np.abs(a.logprobs - b.logprobs)) < 1e-5


def test_segmenting_with_memory_equals_one_long_causal_pass():
    model = tiny_model()  # tgt_len 5
    docs = random_docs((40, 23, 7), seed=1)
    scores = score(model, docs, batch_size=2, tgt_len=5, mem_len=64)
    for doc, s in zip(docs, scores):
        assert math.isnan(s.logprobs[0])  # the first token has no context: not scored
        np.testing.assert_allclose(s.logprobs[1:], causal_logprobs(model, doc), rtol=0, atol=1e-12)
    # a short memory really loses context: segmenting is then not the long pass
    short = score(model, docs[:1], tgt_len=5, mem_len=2)[0]
    assert np.abs(short.logprobs[1:] - causal_logprobs(model, docs[0])).max() > 1e-6


@pytest.mark.parametrize("span", [dict(tgt_len=5, mem_len=7), dict(tgt_len=4, mem_len=3, same_length=True),
                                  dict(tgt_len=6, mem_len=0)])
def test_document_loss_equals_evaluate_on_the_same_tokens(span):
    model = tiny_model()
    docs = random_docs(seed=2)
    for doc, s in zip(docs, score(model, docs, batch_size=3, **span)):
        ref = evaluate(model, doc, batch_size=1, **span)
        assert s.n_scored == ref.n_tokens == doc.size - 1
        assert s.loss == pytest.approx(ref.loss, rel=1e-12)


def test_totals_and_metrics_follow_from_the_token_logprobs():
    model = tiny_model()
    scores = score(model, random_docs(seed=4), batch_size=3)
    for s in scores:
        lp = s.logprobs[1:]
        assert s.n_scored == s.n_tokens - 1 and np.all(lp < 0)
        assert s.total == pytest.approx(lp.sum(), rel=1e-12)
        assert s.bits_per_token == pytest.approx(-lp.sum() / math.log(2) / lp.size, rel=1e-12)
        assert s.metric("bpc") == pytest.approx(s.bits_per_token, rel=1e-12)
        assert s.perplexity == pytest.approx(math.exp(-lp.mean()), rel=1e-12)
    value, count = total_metric(scores, "bpc")
    assert count == sum(s.n_scored for s in scores)
    assert value == pytest.approx(-sum(s.total for s in scores) / count / math.log(2), rel=1e-12)


def test_carry_memory_treats_documents_as_one_stream():
    model = tiny_model()
    docs = random_docs((12, 9, 14), seed=5)
    reset = score(model, docs)
    carried = score(model, docs, carry_memory=True)
    # reset: the second document scores as if alone; carried: its scores change, its first token is scored
    np.testing.assert_allclose(reset[1].logprobs, score(model, [docs[1]])[0].logprobs, atol=1e-12, equal_nan=True)
    assert math.isnan(reset[1].logprobs[0]) and not math.isnan(carried[1].logprobs[0])
    assert np.nanmax(np.abs(carried[1].logprobs[1:] - reset[1].logprobs[1:])) > 1e-6
    np.testing.assert_allclose(carried[0].logprobs, reset[0].logprobs, atol=1e-12, equal_nan=True)
    # the stream's total is evaluate's on the concatenation
    stream = np.concatenate(docs)
    ref = evaluate(model, stream, batch_size=1)
    assert sum(s.n_scored for s in carried) == ref.n_tokens
    assert -sum(s.total for s in carried) / ref.n_tokens == pytest.approx(ref.loss, rel=1e-12)
    # with no memory at all nothing but the one boundary token can carry over
    no_mem = score(model, docs, carry_memory=True, mem_len=0, tgt_len=100)
    assert no_mem[1].n_scored == docs[1].size


def test_score_restores_the_model_and_rejects_bad_documents():
    model = tiny_model()
    model.train()
    before = model.config
    score(model, random_docs(), tgt_len=3, mem_len=11)
    assert model.training and model.config is before
    for docs, expect in (([], "no documents"), ([np.array([3])], "document 0 has 1 token"),
                         ([np.zeros((2, 3), dtype=np.int64)], "1-D"), ([np.array([1, 99])], "outside the vocabulary")):
        with pytest.raises(TxlError, match=expect):
            score(model, docs)
    with pytest.raises(TxlError, match="batch_size"):
        score(model, random_docs(), batch_size=0)
    score(model, [np.array([3]), np.array([4])], carry_memory=True)  # one token each: fine as a stream


def test_token_text_is_printable():
    byte = ByteTokenizer()
    assert [token_text(byte, i) for i in (97, 10, 0xE2, 92)] == ["a", "\\x0a", "\\xe2", "\\"]
    assert token_text(CharTokenizer(list("ab\n")), 2) == "\n"


# --- the command line --------------------------------------------------------------------------

TEXT = "to be, or not to be: that is the question.\nwhether 'tis nobler in the mind to suffer\n"


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny float32 char-level checkpoint with eval span tgt_len 6 / mem_len 10."""
    tokenizer = CharTokenizer.build(TEXT)
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size)
    run = RunConfig.from_dict({"eval": {"tgt_len": 6, "mem_len": 10, "batch_size": 3}})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, run, {"step": 0})
    return tmp_path / "ckpt"


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT[:50], encoding="utf-8")
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "b.txt").write_text(TEXT[10:90], encoding="utf-8")
    (folder / "c.txt").write_text("to be", encoding="utf-8")
    lines = [json.dumps({"text": TEXT[:20]}), "", json.dumps({"text": TEXT[40:]})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    names = [str(tmp_path / "a.txt"), str(folder / "b.txt"), str(folder / "c.txt"),
             f"{tmp_path / 'd.jsonl'}:1", f"{tmp_path / 'd.jsonl'}:3"]
    texts = [TEXT[:50], TEXT[10:90], "to be", TEXT[:20], TEXT[40:]]
    return [tmp_path / "a.txt", folder, tmp_path / "d.jsonl"], names, texts


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_jsonl_and_tsv_outputs(checkpoint, inputs, tmp_path, capsys):
    files, names, texts = inputs
    code, out, err = run_cli(capsys, "score", "--checkpoint", checkpoint, *files)
    assert code == 0, err
    assert "scored 5 document(s)" in err and "tgt_len=6, mem_len=10" in err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["document"] for r in rows] == names
    ckpt = load_checkpoint(checkpoint)
    e = ckpt.run.eval  # eval span and batch size from the run config
    expected = score_texts(ckpt.model, ckpt.tokenizer, texts, batch_size=e.batch_size, tgt_len=e.tgt_len,
                           mem_len=e.mem_len, clamp_len=e.clamp_len, same_length=e.same_length)
    for row, text, s in zip(rows, texts, expected):
        toks = row["tokens"]
        assert row["n_tokens"] == len(text) == len(toks) and row["n_scored"] == len(text) - 1
        assert "".join(t["text"] for t in toks) == text and toks[0]["logprob"] is None
        assert [t["position"] for t in toks] == list(range(len(text)))
        assert sum(t["logprob"] for t in toks[1:]) == pytest.approx(row["logprob"], rel=1e-12)
        assert row["bpc"] == pytest.approx(-row["logprob"] / math.log(2) / row["n_scored"], rel=1e-12)
        assert row["logprob"] == pytest.approx(s.total, abs=1e-5)

    out_file = tmp_path / "out" / "scores.tsv"
    out_file.parent.mkdir()  # the folder of an output file must exist: txl creates none for it
    code, out, err = run_cli(capsys, "score", checkpoint, *files, "--format", "tsv", "--output", out_file)  # hidden old spelling
    assert code == 0 and out == "", err
    with open(out_file, newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert list(table[0]) == ["document", "position", "token_id", "token", "logprob"]
    assert len(table) == sum(len(t) for t in texts)
    for row in rows:
        mine = [r for r in table if r["document"] == row["document"]]
        assert len(mine) == row["n_tokens"] and mine[0]["logprob"] == ""
        assert sum(float(r["logprob"]) for r in mine[1:]) == pytest.approx(row["logprob"], rel=1e-12)

    code, out, err = run_cli(capsys, "score", checkpoint, *files, "--format", "tsv", "--no-per-token")
    table = list(csv.DictReader(out.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert code == 0 and [r["document"] for r in table] == names
    assert [float(r["bpc"]) for r in table] == pytest.approx([r["bpc"] for r in rows], rel=1e-12)

    code, out, err = run_cli(capsys, "score", checkpoint, *files, "--no-per-token", "--carry-memory")
    carried = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "memory carried" in err and "tokens" not in carried[0]
    assert carried[0]["logprob"] == pytest.approx(rows[0]["logprob"], abs=1e-4)  # nothing before the first
    assert carried[1]["n_scored"] == rows[1]["n_tokens"]
    assert abs(carried[1]["logprob"] - rows[1]["logprob"]) > 1e-3  # the memory really carried


def test_cli_byte_checkpoint_scores_any_bytes(tmp_path, capsys):
    model = tiny_model(dtype=torch.float32, vocab_size=256)
    run = RunConfig()
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), run, {"step": 0})
    (tmp_path / "bin").write_bytes(b"caf\xc3\xa9\n\xff\x00tab\there")
    code, out, err = run_cli(capsys, "score", tmp_path / "ckpt", tmp_path / "bin", "--format", "tsv")
    assert code == 0, err
    table = list(csv.reader(out.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert [r[3] for r in table[1:]] == ["c", "a", "f", "\\xc3", "\\xa9", "\\x0a", "\\xff", "\\x00", "t", "a", "b",
                                         "\\x09", "h", "e", "r", "e"]
    assert "ppl" not in table[0] and all(len(r) == 5 for r in table)


@pytest.mark.parametrize("make_args,expect", [
    (lambda d, c: [d / "missing.txt"], "does not exist"),
    (lambda d, c: [d / "empty.txt"], "empty"),
    (lambda d, c: [d / "one.txt"], "has 1 token(s), nothing to score"),
    (lambda d, c: [d / "empty.jsonl"], "empty.jsonl:1 is empty"),
    (lambda d, c: [d / "bad.jsonl"], "bad.jsonl:2 must be a JSON object"),
    (lambda d, c: [d / "binary.txt"], "not UTF-8"),
    (lambda d, c: [d / "unknown.txt"], "unknown.txt: text contains 1 character not in the char vocabulary"),
    (lambda d, c: [d / "ok.txt", "--batch-size", "0"], "--batch-size must be >= 1"),
    (lambda d, c: [d / "ok.txt", "--mem-len", "-1"], "--mem-len must be >= 0"),
    (lambda d, c: [d / "ok.txt", "--checkpoint", d], "not a txl checkpoint"),  # the hidden option wins
    (lambda d, c: [d / "ok.txt", "--format", "csv"], "invalid choice"),
])
def test_cli_bad_input_gives_one_line_and_no_output(checkpoint, tmp_path, capsys, make_args, expect):
    (tmp_path / "ok.txt").write_text("to be", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "one.txt").write_text("t")
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    (tmp_path / "bad.jsonl").write_text('{"text": "to be"}\n["to be"]\n')
    (tmp_path / "binary.txt").write_bytes(b"to be \xff\xfe")
    (tmp_path / "unknown.txt").write_text("to be Z")
    out_file = tmp_path / "scores.jsonl"
    code, out, err = run_cli(capsys, "score", checkpoint, "--out", out_file, *make_args(tmp_path, checkpoint))
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("txl: error: "), err
    assert expect in lines[0]
    assert out == "" and not out_file.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".scores.jsonl")]  # no temporary left


def test_model_score_takes_texts_with_a_tokenizer():
    from txl.data.tokenizers import ByteTokenizer

    model = tiny_model(vocab_size=256)
    texts = ["hello there", "a longer second document."]
    by_text = score(model, texts, tokenizer=ByteTokenizer(), tgt_len=4, mem_len=8)
    by_ids = score(model, [list(t.encode()) for t in texts], tgt_len=4, mem_len=8)
    assert [s.total for s in by_text] == [s.total for s in by_ids]
    with pytest.raises(TxlError, match="tokenizer="):
        score(model, texts)
