"""Decoding rules at the sampling level: stop sequences, minimum length, repetition penalty, no repeated n-grams."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import one_error_line, run_cli, tiny_model
from txl.data import ByteTokenizer
from txl.data.pairs import find_markers
from txl.errors import TxlError
from txl.generation import DecodingRules, StopText, adjust_logits, banned_ngram_tokens, complete, generate, sample_next
from txl.training.checkpoint import save_checkpoint
from txl.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_repetition_penalty_known_values():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    out = adjust_logits(logits, [[0, 1, 1], []], repetition_penalty=2.0)
    assert out.dtype == torch.float32  # the logits' dtype: no [B, V] float64 work per step
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]]
    half = adjust_logits(logits.bfloat16(), [[0, 1, 1], []], repetition_penalty=2.0)
    assert half.dtype == torch.float32 and half.tolist() == out.tolist()  # bf16 widened, not kept
    assert adjust_logits(logits, [[0], [1]]) is logits  # no rule: untouched (greedy stays bit-exact)


def test_an_extreme_repetition_penalty_keeps_the_scores_finite():
    """θ near 0 would send a positive score to +inf (and the softmax to NaN), θ near inf a negative one to
    -inf: the penalized scores stop at the dtype's largest finite value."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    top = torch.finfo(torch.float32).max
    tiny = adjust_logits(logits, [[0, 1]], repetition_penalty=5e-324)
    assert tiny.tolist() == [[top, 0.0, 0.5, 3.0]]  # (-1 x 5e-324 underflows to -0.0)
    assert torch.softmax(tiny, -1).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    huge = adjust_logits(logits, [[0, 1]], repetition_penalty=1e308)
    assert huge.tolist() == [[0.0, -top, 0.5, 3.0]]  # (2 / 1e308 underflows to 0)


@given(st.lists(st.integers(0, 3), max_size=12), st.integers(1, 4))
def test_banned_ngram_tokens_is_the_brute_force_set(seq, n):
    grams = {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}
    tail = seq[len(seq) - n + 1:] if n > 1 else []
    want = {t for t in range(4) if len(seq) >= n - 1 and tuple(tail + [t]) in grams}
    assert banned_ngram_tokens(seq, n) == want


@pytest.mark.parametrize("n", [1, 2, 3])
def test_generated_text_never_repeats_an_ngram(n):
    model = tiny_model(vocab_size=37, mem_len=16)
    prompt = torch.randint(0, 37, (3, 5), generator=torch.Generator().manual_seed(n))
    plain = generate(model, prompt, 30, temperature=0)[:, 5:]
    assert any(len({tuple(r[i:i + n]) for i in range(len(r) - n + 1)}) < len(r) - n + 1 for r in plain.tolist())
    out = generate(model, prompt, 30, temperature=0, no_repeat_ngram_size=n)[:, 5:]
    for row in out.tolist():
        grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
        assert len(set(grams)) == len(grams)


def test_min_new_tokens_holds_back_the_end_token():
    model = tiny_model(vocab_size=37, mem_len=16)
    with torch.no_grad():
        model.crit.out_layers[0].bias[5] = 100.0  # token 5 is by far the most likely everywhere
    prompt = torch.randint(0, 37, (2, 4))
    assert (generate(model, prompt, 6, temperature=0)[:, 4:] == 5).all()
    out = generate(model, prompt, 6, temperature=0, min_new_tokens=4, end_ids=[5])[:, 4:]
    assert (out[:, :4] != 5).all() and (out[:, 4:] == 5).all()


@pytest.mark.parametrize("end_ids", [[0], [0, 5], [5, 0]])
def test_min_new_tokens_holds_back_end_id_zero_and_several_end_ids(end_ids):
    """End id 0 alone (a tensor of one 0 is falsy) and two end ids (a tensor of two is ambiguous)."""
    model = tiny_model(vocab_size=37, mem_len=16)
    with torch.no_grad():
        model.crit.out_layers[0].bias[end_ids] = 100.0  # the end ids are by far the most likely everywhere
    prompt = torch.randint(0, 37, (2, 4))
    out = generate(model, prompt, 6, temperature=0, min_new_tokens=4, end_ids=end_ids)[:, 4:]
    assert not torch.isin(out[:, :4], torch.tensor(end_ids)).any()
    assert torch.isin(out[:, 4:], torch.tensor(end_ids)).all()


@pytest.mark.parametrize("end_ids, message", [([37], r"in \[0, 37\), got 37"), ([-1], "got -1"),
                                              ([1.5], "integer token ids")])
def test_end_ids_outside_the_vocabulary_are_refused(end_ids, message):
    from txl.generation import beam_search

    model = tiny_model(vocab_size=37, mem_len=16)
    prompt = torch.randint(0, 37, (1, 4))
    with pytest.raises(TxlError, match=message):
        generate(model, prompt, 3, min_new_tokens=2, end_ids=end_ids)
    with pytest.raises(TxlError, match=message):
        beam_search(model, prompt, max_new_tokens=3, num_beams=2, end_ids=end_ids)


def test_per_row_generators_draw_as_each_row_alone():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    rows = sample_next(logits, 1.0, generator=[torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    alone = [sample_next(logits[b:b + 1], 1.0, generator=torch.Generator().manual_seed(s)) for b, s in enumerate((1, 2, 3))]
    assert rows.tolist() == torch.cat(alone).tolist()
    with pytest.raises(TxlError, match="one generator per row"):
        sample_next(logits, 1.0, generator=[torch.Generator()])
    banned = logits.clone()
    banned[0, :] = float("-inf")
    with pytest.raises(TxlError, match="non-finite"):
        sample_next(banned, 1.0)


@given(st.text("ab\n", max_size=30), st.lists(st.text("ab\n", min_size=1, max_size=3), max_size=3), st.randoms())
def test_stop_text_cuts_before_the_first_stop_however_the_text_arrives(text, stops, rnd):
    cut = StopText(stops)
    pieces, i = [], 0
    while i < len(text):
        j = i + rnd.randint(0, 4)
        pieces.append(text[i:j])
        i = j
    shown = "".join(cut.push(p) for p in pieces) + cut.finish()
    hits = [(k + len(s), k) for s in stops if (k := text.find(s)) >= 0]  # the stop complete first
    assert shown == (text[:min(hits)[1]] if hits else text)
    assert cut.stopped == bool(hits)


@pytest.fixture
def byte_checkpoint(tmp_path):
    model = tiny_model(vocab_size=256, mem_len=16, tgt_len=4, dtype=torch.float32)
    save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), RunConfig(model=model.config), {"step": 1})
    return tmp_path / "ckpt", model


def test_cli_stop_prints_the_sample_up_to_the_stop(byte_checkpoint, capsys):
    ckpt, _ = byte_checkpoint
    code, full, err = run_cli(capsys, "generate", ckpt, "--prompt", "ab", "-n", "60", "--seed", "3", "-t", "1")
    assert code == 0
    sample = full[2:-1]  # prompt "ab", then the sample, then a newline
    stop = next(sample[i:i + 2] for i in range(5, len(sample) - 2) if "\ufffd" not in sample[i:i + 2])
    code, out, err = run_cli(capsys, "generate", ckpt, "--prompt", "ab", "-n", "60", "--seed", "3", "-t", "1",
                             "--stop", stop, "--stop", "\x00never")
    assert code == 0 and out == "ab" + sample[:sample.index(stop)] + "\n"
    code, out, err = run_cli(capsys, "generate", ckpt, "--prompt", "ab", "--repetition-penalty", "0")
    assert code == 2 and "--repetition-penalty must be" in one_error_line(err)


@pytest.mark.parametrize("extra", [[], ["--num-beams", "2"]])
def test_cli_generate_of_a_fine_tuned_model_ends_at_its_end_marker(tmp_path, capsys, extra):
    from txl.config import FinetuneConfig

    model = tiny_model(dtype=torch.float32, vocab_size=256, n_layer=1, tgt_len=4, mem_len=4)
    end = find_markers(ByteTokenizer()).end_id
    with torch.no_grad():
        model.crit.out_layers[0].bias[end] = 50.0  # the end marker first, then "x"
        model.crit.out_layers[0].bias[ord("x")] = 40.0
    ckpt = tmp_path / "ft"
    save_checkpoint(ckpt, model, ByteTokenizer(), RunConfig(model=model.config, finetune=FinetuneConfig(init="lm")),
                    {"step": 1})
    args = ["generate", ckpt, "--prompt", "ab", "-n", "6", "-t", "0", *extra]
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and out == "ab\n", err  # the marker ends the text and is not printed
    code, out, err = run_cli(capsys, *args, "--min-new-tokens", "3")
    assert code == 0 and out == "abxxx\n", err  # held back for 3 tokens, then drawn: the end
    code, out, err = run_cli(capsys, "generate", ckpt, "--input", _prompts(tmp_path), "-n", "6", "-t", "0", *extra)
    assert code == 0 and [json.loads(line)["text"] for line in out.splitlines()] == ["", ""], err


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ab"}\n{"prompt": "cde"}\n', encoding="utf-8")
    return path


def test_complete_stops_at_the_end_marker(byte_checkpoint):
    _, model = byte_checkpoint
    tok = ByteTokenizer()
    end = find_markers(tok).end_id
    with torch.no_grad():
        model.crit.out_layers[0].bias[end] = 50.0
    assert complete(model, tok, ["some prompt", "x"], max_new_tokens=10) == ["", ""]
    with torch.no_grad():
        model.crit.out_layers[0].bias[ord("x")] = 40.0
    assert complete(model, tok, ["some prompt"], max_new_tokens=10,
                    rules=DecodingRules(temperature=0.0, min_new_tokens=3)) == ["xxx"]
    assert complete(model, tok, ["some prompt"], max_new_tokens=10, min_new_tokens=3) == ["xxx"]  # greedy kept
    with pytest.raises(TxlError, match="reserved marker"):
        complete(model, tok, ["a\x1db"])


def test_decoding_rules_are_one_object_checked_when_made():
    for bad, word in ((dict(temperature=-1), "temperature"), (dict(top_k=0), "top_k"), (dict(top_p=1.5), "top_p"),
                      (dict(repetition_penalty=0), "repetition_penalty"),
                      (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"), (dict(min_new_tokens=-1), "min_new")):
        with pytest.raises(TxlError, match=word):
            DecodingRules(**bad)
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    # the penalty acts before the draw: token 0, already generated, drops below token 1 (2.0 / 2 < 1.9)
    assert DecodingRules(temperature=0.0).choose(logits, [[0]]).tolist() == [0]
    assert DecodingRules(temperature=0.0, repetition_penalty=2.0).choose(logits, [[0]]).tolist() == [1]
    # min_new_tokens bans the call's end ids until that many tokens are out
    rules = DecodingRules(temperature=0.0, min_new_tokens=2)
    assert rules.choose(logits, [[5]], end_ids=[0]).tolist() == [1]
    assert rules.choose(logits, [[5, 6]], end_ids=[0]).tolist() == [0]
    with pytest.raises(TxlError, match="leave no token to choose in row 0 after 3 tokens"):
        DecodingRules(temperature=0.0, no_repeat_ngram_size=1).choose(logits, [[0, 1, 2]])


def test_rules_object_and_keywords_decode_alike_and_not_both(byte_checkpoint):
    _, model = byte_checkpoint
    prompt = torch.tensor([[104, 101, 108, 108, 111]])
    rules = DecodingRules(temperature=0.9, top_k=7, repetition_penalty=1.4, no_repeat_ngram_size=3)
    a = generate(model, prompt, 12, rules=rules, generator=torch.Generator().manual_seed(3))
    b = generate(model, prompt, 12, temperature=0.9, top_k=7, repetition_penalty=1.4, no_repeat_ngram_size=3,
                 generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    with pytest.raises(TxlError, match="not both"):
        generate(model, prompt, 2, temperature=0.5, rules=rules)
    with pytest.raises(TxlError, match="unknown decoding rule"):
        generate(model, prompt, 2, top_q=0.5)
    with pytest.raises(TxlError, match="unknown decoding rule"):
        generate(model, prompt, 2, top_q=None)


def test_the_penalty_leaves_a_models_own_non_finite_scores_to_the_sampler():
    """Only what the penalty itself pushes out of range is clamped: a model's inf stays inf, and the sampler
    refuses it as before."""
    out = adjust_logits(torch.tensor([[float("inf"), 1.0, 0.0]]), [[0]], repetition_penalty=1.2)
    assert out[0, 0] == float("inf")
    with pytest.raises(TxlError, match="non-finite"):
        sample_next(out, temperature=0.0)
