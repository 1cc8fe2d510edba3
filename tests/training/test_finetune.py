"""Fine-tuning on prompt/completion pairs: what the loss counts, the memory over long prompts, exact resume, bad input."""

import csv
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import txl.training.loop as loop
from conftest import one_error_line, run_cli, tiny_model
from txl.config import IGNORE_INDEX, RunConfig
from txl.data import ByteTokenizer, CharTokenizer, WordTokenizer
from txl.data.pairs import END_TEXT, SEPARATOR_TEXT, Pair, add_markers, encode_pair, find_markers, pair_batch
from txl.errors import TxlError
from txl.evaluation.completions import completion_losses, grad_window
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.training.checkpoint import load_checkpoint, save_checkpoint
from txl.training.finetune import PairsObjective
from txl.training.loop import finetune

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8, mem_len=8, dropout=0.0, dropatt=0.0)


def make_lm(folder, tokenizer, seed=0, uniform=False, **overrides):
    """An LM checkpoint folder (no training needed): a seeded model, or one whose output is uniform."""
    torch.manual_seed(seed)
    config = TransformerXLConfig(vocab_size=tokenizer.vocab_size, **{**SMALL, **overrides})
    model = TransformerXLLM(config)
    if uniform:
        with torch.no_grad():
            for layer in model.crit.out_layers:
                layer.weight.zero_()
                layer.bias.zero_()
    save_checkpoint(folder, model, tokenizer, RunConfig(model=config), {"step": 0})
    return folder


def write_pairs(path, n=24, seed=0, prompt_len=(10, 60)):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega"]
    with open(path, "w") as f:
        for i in range(n):
            doc = " ".join(rng.choice(words, int(rng.integers(*prompt_len))))
            f.write(json.dumps({"prompt": doc, "completion": f"{doc.split()[0]} and {doc.split()[-1]}"}) + "\n")
    return path


def brute_force_completion_nll(model, ids, start):
    """Sum of -log p(target) over the completion and END targets, from one forward over the whole row."""
    x = torch.as_tensor(ids[:-1])[None]
    logp = torch.log_softmax(model(x).logits[0].double(), -1)
    targets = torch.as_tensor(ids[1:])
    return -sum(logp[t, targets[t]] for t in range(start - 1, len(ids) - 1))


def test_loss_is_the_completion_nll_of_the_whole_row_read_in_segments():
    # a memory holding every earlier position makes segment-by-segment reading equal one forward
    tok = CharTokenizer(list("abcdefgh \n"))
    tok, markers, added = add_markers(tok)
    model = tiny_model(tgt_len=4, mem_len=64, vocab_size=tok.vocab_size)
    pairs = [Pair("abc def gh" * 3, "ha ha", "x:1"), Pair("ab", "cdefg", "x:2"), Pair("h" * 13, "a", "x:3")]
    rows = [encode_pair(tok, markers, p) for p in pairs]
    x, y = pair_batch(rows)
    got = completion_losses(model, x, y, span=model.config.span)
    want = torch.stack([brute_force_completion_nll(model, ids, start) for ids, start in rows])
    assert torch.allclose(got, want, rtol=0, atol=1e-10)
    # only the completion and END are scored: as many targets as completion tokens + 1 per row
    assert (y != IGNORE_INDEX).sum(1).tolist() == [len(p.completion) + 1 for p in pairs]


def test_known_value_a_uniform_model_costs_log_v_per_completion_token(tmp_path):
    tok = ByteTokenizer()
    lm = make_lm(tmp_path / "lm", tok, uniform=True)
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=10, prompt_len=(3, 20))
    result = finetune(lm, pairs, out_dir=tmp_path / "run", progress=False, log=lambda m: None,
                      overrides=["train.max_steps=1", "train.batch_size=8", "train.log_interval=1", "train.eval_interval=1",
                                 "train.sample_tokens=0", "data.split=[0.8, 0.2, 0.0]"])
    row = next(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    completions = [json.loads(line)["completion"] for line in open(pairs)][:8]  # the 8 train pairs, one step
    assert int(row["tokens"]) == sum(len(c.encode()) + 1 for c in completions)  # completion bytes + END each
    assert float(row["train_loss"]) == pytest.approx(math.log(256), abs=1e-6)
    assert result.final.n_tokens == sum(len(json.loads(line)["completion"]) + 1 for line in list(open(pairs))[8:])


def test_a_long_prompt_reaches_the_completion_through_the_memory():
    tok, markers, _ = add_markers(CharTokenizer(list("abcdefgh")))
    base = Pair("abcdefgh" * 4, "hgf", "x")  # 32 prompt tokens: 8 segments of 4 before the completion
    changed = Pair("abcdefgh" * 2 + "h" + "bcdefgh" + "abcdefgh", "hgf", "x")  # token 16 differs
    rows = [encode_pair(tok, markers, p) for p in (base, changed)]
    x, y = pair_batch(rows)
    for mem_len, differs in ((24, True), (0, False)):
        model = tiny_model(tgt_len=4, mem_len=mem_len, vocab_size=tok.vocab_size)
        loss = completion_losses(model, x, y, span=model.config.span)
        assert bool(loss[0] != loss[1]) == differs, (mem_len, loss)
    # the prompt cut to its last tgt_len tokens reads differently from the whole prompt
    model = tiny_model(tgt_len=4, mem_len=24, vocab_size=tok.vocab_size)
    cut = pair_batch([encode_pair(tok, markers, base, max_prompt_tokens=4)])
    assert not torch.isclose(completion_losses(model, *cut, span=model.config.span)[0],
                             completion_losses(model, x, y, span=model.config.span)[0])


@pytest.mark.parametrize("grad_segments, reached", [(1, {4, 5}), (2, {4, 5}), (3, {3, 4, 5}), (0, {0, 1, 2, 3, 4, 5})])
def test_gradient_flows_through_the_last_k_segments_only(grad_segments, reached):
    tok, markers, _ = add_markers(CharTokenizer(list("abcdefgh")))
    model = tiny_model(tgt_len=4, mem_len=8, vocab_size=tok.vocab_size)
    ids, start = encode_pair(tok, markers, Pair("abcdefgh" * 2 + "abc", "ab", "x"))  # 22 inputs: 6 segments of 4
    x, y = pair_batch([(ids, start)])  # targets 19..21 scored: segments 4 and 5
    assert grad_window(y, 4, grad_segments or None).tolist() == [min(reached)]
    emb = model.word_emb.emb_layers[0]
    captured = []

    def keep(module, inputs, out):
        if out.requires_grad:
            out.retain_grad()
        captured.append(out)

    handle = emb.register_forward_hook(keep)
    objective = PairsObjective(model, grad_segments or None, "float32")
    objective(x, labels=y, span=model.config.span).token_loss.sum().backward()
    handle.remove()
    got = {k for k, out in enumerate(captured) if out.grad is not None and bool(out.grad.abs().sum() > 0)}
    assert len(captured) == 6 and got == reached  # segments 4 and 5 hold the completion; the last K at least


def test_markers_for_every_tokenizer_kind():
    from txl.data import BPETokenizer

    byte = ByteTokenizer()
    assert find_markers(byte).sep_id == 0x1D and find_markers(byte).end_id == 0x04
    bpe = BPETokenizer.build(["hello world\n", "hello there\n"] * 5, vocab_size=270)
    tok, markers, added = add_markers(bpe)
    assert added == 0 and tok.decode([markers.sep_id]) == SEPARATOR_TEXT and tok.decode([markers.end_id]) == END_TEXT
    char, markers, added = add_markers(CharTokenizer(list("ab")))
    assert added == 2 and (markers.sep_id, markers.end_id) == (2, 3) and char.encode("ab").tolist() == [0, 1]
    word, markers, added = add_markers(WordTokenizer(["<unk>", "<eos>", "hi"]))
    assert added == 2 and word.words[markers.sep_id] == "<sep>" and word.words[markers.end_id] == "<eoc>"
    ids, start = encode_pair(word, markers, Pair("hi there", "hi", "x"))
    assert ids.tolist() == [2, 0, 1, markers.sep_id, 2, 1, markers.end_id] and start == 4
    with pytest.raises(TxlError, match="reserved marker"):
        encode_pair(byte, find_markers(byte), Pair("a\x04b", "c", "x"))
    with pytest.raises(TxlError, match="not a fine-tuned model"):
        find_markers(CharTokenizer(list("ab")))


def test_char_and_word_models_grow_their_vocabulary(tmp_path):
    text = "alpha beta gamma delta kappa omega and \n"
    for tok in (CharTokenizer.build(text), WordTokenizer.build([text])):
        lm = make_lm(tmp_path / f"lm-{tok.kind}", tok)
        pairs = write_pairs(tmp_path / "pairs.jsonl", n=10)
        finetune(lm, pairs, out_dir=tmp_path / f"run-{tok.kind}", progress=False, log=lambda m: None,
                 overrides=["train.max_steps=2", "train.batch_size=2", "train.eval_interval=2", "train.sample_tokens=5",
                            "data.split=[0.8, 0.2, 0.0]"])
        after = load_checkpoint(tmp_path / f"run-{tok.kind}" / "last")
        assert after.tokenizer.vocab_size == tok.vocab_size + 2 and after.model.config.vocab_size == tok.vocab_size + 2
        markers = find_markers(after.tokenizer)
        assert (markers.sep_id, markers.end_id) == (tok.vocab_size, tok.vocab_size + 1)


def losses(run_dir):
    return {int(r["step"]): r["train_loss"] for r in csv.DictReader(open(run_dir / "metrics.csv")) if r["train_loss"]}


def test_crash_then_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch, capsys):
    lm = make_lm(tmp_path / "lm", ByteTokenizer(), tgt_len=12)
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=20, prompt_len=(3, 10))  # prompts of 2 to 6 segments
    args = ["train.max_steps=12", "train.batch_size=3", "train.eval_interval=4", "train.log_interval=1",
            "train.sample_tokens=0", "model.dropout=0.1", "finetune.grad_segments=2", "train.grad_accum_steps=3"]
    finetune(lm, pairs, out_dir=tmp_path / "straight", overrides=args, progress=False, log=lambda m: None)
    real_lr = loop.learning_rate

    def crash_at_7(step, **kw):  # last/ holds step 4
        if step == 7:
            raise RuntimeError("simulated crash")
        return real_lr(step, **kw)

    monkeypatch.setattr(loop, "learning_rate", crash_at_7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(lm, pairs, out_dir=tmp_path / "crashed", overrides=args, progress=False, log=lambda m: None)
    monkeypatch.setattr(loop, "learning_rate", real_lr)
    code, out, err = run_cli(capsys, "finetune", "--resume", tmp_path / "crashed", "-q")
    assert code == 0, err
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "crashed")
    assert sorted(resumed) == list(range(1, 13))
    assert all(resumed[s] == straight[s] for s in range(5, 13)), (straight, resumed)
    a = load_file(tmp_path / "straight" / "last" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "last" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


@pytest.mark.parametrize("line, expect", [
    ('{"prompt": "a", "completion": "b"}\n{"prompt": "a"', "line 2 is not valid JSON"),
    ('{"prompt": "a", "completion": 3}', 'line 1: "completion" must be a string, got a number'),
    ('{"prompt": "a"}', 'line 1 has no "completion" (each line needs string "prompt" and "completion")'),
    ('{"completion": "b", "text": "a"}', 'line 1 has no "prompt" (each line needs string "prompt" and "completion")'),
    ('["a", "b"]', "line 1 must be a JSON object"),
    ('{"prompt": "a", "completion": ""}', 'line 1 has an empty "completion"'),
    ('{"prompt": "a\\u0004", "completion": "b"}', "reserved marker"),
    ("", "holds no pairs"),
])
def test_bad_pairs_give_one_error_line_and_write_nothing(tmp_path, capsys, line, expect):
    lm = make_lm(tmp_path / "lm", ByteTokenizer())
    (tmp_path / "pairs.jsonl").write_text(line)
    code, out, err = run_cli(capsys, "finetune", "--init", lm, "--data", tmp_path / "pairs.jsonl", "--out",
                             tmp_path / "run", "-q")
    assert code == 2 and expect in one_error_line(err)
    assert not (tmp_path / "run").exists()


def test_cli_refusals(tmp_path, capsys):
    lm = make_lm(tmp_path / "lm", ByteTokenizer())
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=4)
    for argv, expect in (
        (["--data", pairs, "--out", tmp_path / "r"], "--init"),
        (["--init", tmp_path / "nope", "--data", pairs, "--out", tmp_path / "r"], "does not exist"),
        (["--init", lm, "--data", pairs, "--out", tmp_path / "r", "model.n_layer=3"], "model.n_layer is 3"),
        (["--init", lm, "--data", pairs, "--out", tmp_path / "r", "--grad-segments", "-1"],
         "--grad-segments must be >= 0, got -1"),
        (["--init", lm, "--data", pairs, "--out", tmp_path / "r", "data.split=[1.0, 0.0, 0.0]"], "valid split"),
        (["--resume", lm], "not a run directory"),
        (["--init", make_lm(tmp_path / "cmem", ByteTokenizer(), cmem_len=4), "--data", pairs, "--out", tmp_path / "r"],
         "compressive memory"),
    ):
        code, out, err = run_cli(capsys, "finetune", *argv, "-q")
        assert code == 2 and expect in one_error_line(err), (argv, err)
        assert not (tmp_path / "r").exists()
