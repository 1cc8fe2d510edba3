"""Parity with the transformers 4.35.2 TransfoXL implementation (an independent oracle) and conversion."""

import collections
import pickle
import re

import pytest
import torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel

from tests.convert.hf_helpers import hf_model_to_txl
from txl.generation import generate
from txl.convert.hf_transfo_xl import (config_from_hf, hf_initial_mems, model_from_hf_state, read_hf_checkpoint,
                                        write_hf_checkpoint)
from txl.convert.safe_pickle import load_restricted_pickle, transfo_xl_words
from txl.errors import TxlError
from txl.fileio.model_files import unique_state

V = 60
CASES = {
    "plain": dict(cutoffs=[], div_val=1, d_embed=16, untie_r=False),
    "plain-untie-samelen-clamp": dict(cutoffs=[], div_val=1, d_embed=16, untie_r=True, same_length=True, clamp_len=3),
    "adaptive-div1": dict(cutoffs=[10, 20, 40], div_val=1, d_embed=16, untie_r=True),
    "adaptive-div1-proj": dict(cutoffs=[10, 20, 40], div_val=1, d_embed=12, untie_r=False, same_length=True),
    "adaptive-div4": dict(cutoffs=[10, 30], div_val=4, d_embed=32, untie_r=False, same_length=True, clamp_len=4),
    "adaptive-div4-preln-noshare": dict(cutoffs=[15], div_val=4, d_embed=16, untie_r=True, pre_lnorm=True,
                                        proj_share_all_but_first=False),
}


def make_hf(case, seed=0, mem_len=6):
    cfg = TransfoXLConfig(vocab_size=V, d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=mem_len,
                          dropout=0.0, dropatt=0.0, eos_token_id=None, **{"clamp_len": 0, "same_length": False, **case})
    torch.manual_seed(seed)
    model = TransfoXLLMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # random values everywhere (biases and gains too), ties stay tied
            p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("name", CASES)
def test_log_probs_and_memories_equal_hf_over_three_segments(name):
    hf = make_hf(CASES[name])
    txl = hf_model_to_txl(hf).eval()
    ids = torch.randint(0, V, (3, 15))
    hf_mems = None  # HF starts from mem_len zero states; give txl the same explicit memory
    txl_mems = hf_initial_mems(txl.config, 3)
    for s in range(3):
        seg = ids[:, 5 * s:5 * s + 5]
        with torch.no_grad():
            ref = hf(input_ids=seg, mems=hf_mems)
            out = txl(seg, mems=txl_mems)
        hf_mems, txl_mems = ref.mems, out.mems
        logp = torch.log_softmax(out.logits, dim=-1)
        assert torch.allclose(logp, ref.prediction_scores, atol=1e-5), (logp - ref.prediction_scores).abs().max()
        assert len(txl_mems) == len(hf_mems)
        for ours, theirs in zip(txl_mems, hf_mems):
            assert torch.allclose(ours, theirs.transpose(0, 1), atol=1e-5)
    # txl's own start (no memory) equals HF given an empty memory; the loss path (no [B, T, V]
    # tensor with an adaptive softmax) agrees with the log-probs
    empty = [torch.zeros(0, 3, 16) for _ in range(2)]
    with torch.no_grad():
        out = txl(ids[:, :5], labels=ids[:, 1:6])
        ref = hf(input_ids=ids[:, :5], mems=empty).prediction_scores
    manual = -ref.gather(-1, ids[:, 1:6, None]).squeeze(-1)
    assert torch.allclose(out.token_loss, manual, atol=1e-5)


def _hf_gradients_as_txl(hf):
    """HF's gradients in txl's layout: HF's state with every parameter replaced by its gradient, converted
    (the conversion moves tensors without changing a value; tied copies share one gradient)."""
    by_storage = {p.data_ptr(): torch.zeros_like(p) if p.grad is None else p.grad for p in hf.parameters()}
    state = {k: by_storage.get(t.data_ptr(), t) for k, t in hf.state_dict(keep_vars=True).items()}
    return dict(model_from_hf_state(config_from_hf(hf.config.to_dict()), state).named_parameters())


@pytest.mark.parametrize("name", CASES)
def test_training_gradients_and_an_sgd_step_equal_hf(name):
    """Training parity: two segments with labels and the detached memory between them, back-propagated
    in train mode (dropout 0), give HF's gradient for every parameter; after one SGD step on both
    models a third segment gives HF's log-probabilities."""
    hf = make_hf(CASES[name]).train()
    txl = hf_model_to_txl(hf).train()
    ids = torch.randint(0, V, (3, 18), generator=torch.Generator().manual_seed(1))
    hf_mems, txl_mems = None, hf_initial_mems(txl.config, 3)
    for s in range(2):
        seg = ids[:, 6 * s:6 * s + 6]
        ref = hf(input_ids=seg, labels=seg, mems=hf_mems)  # HF shifts the labels inside: T - 1 targets
        out = txl(seg, labels=torch.cat([seg[:, 1:], torch.full((3, 1), -100)], 1), mems=txl_mems)
        # (with an adaptive softmax HF returns the per-token losses grouped by cluster: compare them as a set)
        assert torch.allclose(out.token_loss[:, :-1].flatten().sort().values, ref.losses.flatten().sort().values,
                              atol=1e-5)
        ref.losses.sum().backward()
        out.token_loss.sum().backward()
        hf_mems, txl_mems = ref.mems, out.mems
    theirs = _hf_gradients_as_txl(hf)
    for key, p in txl.named_parameters():
        assert p.grad is not None, key
        scale = theirs[key].abs().max().item()
        assert scale > 0, key  # every parameter is trained (a zero gradient would hide a missing path)
        assert torch.allclose(p.grad, theirs[key], rtol=0, atol=1e-5 * max(1.0, scale)), key
    with torch.no_grad():
        for model in (hf, txl):
            for p in model.parameters():
                p -= 0.5 * p.grad
        seg = ids[:, 12:]
        ref = hf.eval()(input_ids=seg, mems=hf_mems).prediction_scores
        ours = torch.log_softmax(txl.eval()(seg, mems=txl_mems).logits, -1)
    assert not torch.allclose(ref, make_hf(CASES[name]).eval()(input_ids=seg, mems=hf_mems).prediction_scores,
                              atol=1e-3)  # the step moved the model
    assert torch.allclose(ours, ref, atol=1e-4), (ours - ref).abs().max()


@pytest.mark.parametrize("name", ["plain-untie-samelen-clamp", "adaptive-div4", "adaptive-div1-proj"])
def test_round_trip_txl_hf_txl_is_lossless(tmp_path, name):
    txl = hf_model_to_txl(make_hf(CASES[name], seed=1)).eval()
    write_hf_checkpoint(txl, tmp_path / "hf")
    hf = TransfoXLLMHeadModel.from_pretrained(tmp_path / "hf").eval()  # read by transformers itself
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        ours = torch.log_softmax(txl(ids, mems=hf_initial_mems(txl.config, 2)).logits, -1)
        assert torch.allclose(ours, hf(input_ids=ids).prediction_scores, atol=1e-5)
    config, state = read_hf_checkpoint(tmp_path / "hf")
    back = model_from_hf_state(config, state)
    assert back.config == txl.config
    ours, theirs = unique_state(txl), unique_state(back)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    hf.save_pretrained(tmp_path / "hf2")  # HF's own writer (drops tied copies)
    config2, state2 = read_hf_checkpoint(tmp_path / "hf2")
    again = model_from_hf_state(config2, state2)
    assert all(torch.equal(ours[k], unique_state(again)[k]) for k in ours)


def test_greedy_generation_equals_hf_generate():
    hf = make_hf(CASES["adaptive-div4"], seed=2, mem_len=40)
    txl = hf_model_to_txl(hf).eval()
    prompt = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    ours = generate(txl, prompt, 12, temperature=0, mems=hf_initial_mems(txl.config, 2))
    assert torch.equal(ours, theirs)


def test_unknown_and_missing_keys_are_errors():
    hf = make_hf(CASES["adaptive-div4"])
    txl = hf_model_to_txl(hf)
    state = dict(hf.state_dict())
    with pytest.raises(TxlError, match="unknown key"):
        model_from_hf_state(txl.config, {**state, "transformer.extra.weight": torch.zeros(1)})
    del state["transformer.layers.1.pos_ff.CoreNet.0.bias"]
    with pytest.raises(TxlError, match="no tensor for transformer.layers.1.pos_ff.CoreNet.0.bias"):
        model_from_hf_state(txl.config, state)
    # untie_r false: HF's per-layer copies of the shared u/v must equal it
    shared = dict(hf.state_dict())
    assert "transformer.layers.1.dec_attn.r_w_bias" in shared and not txl.config.untie_r
    shared["transformer.layers.1.dec_attn.r_w_bias"] = shared["transformer.r_w_bias"] + 1.0
    with pytest.raises(TxlError, match="r_w_bias differs from the shared bias although untie_r is false"):
        model_from_hf_state(txl.config, shared)


def test_pickled_vocabulary_reader_is_restricted(tmp_path):
    state = {"idx2sym": ["<eos>", "the", ",", "<unk>"], "sym2idx": collections.OrderedDict(a=0),
             "counter": collections.Counter(the=3), "special": ["<eos>"], "min_freq": 0, "max_size": None,
             "lower_case": False, "pattern": re.compile(r"[^\s][^\s]")}
    assert transfo_xl_words(load_restricted_pickle(pickle.dumps(state))) == ["<eos>", "the", ",", "<unk>"]

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))

    with pytest.raises(TxlError, match="refusing to load (posix|os).system"):
        load_restricted_pickle(pickle.dumps({"idx2sym": ["a"], "x": Evil()}))
    assert not marker.exists()  # refused before anything ran
    with pytest.raises(TxlError, match="cannot read"):
        load_restricted_pickle(b"not a pickle")


def test_cli_convert_hf_folder_and_back(tmp_path, capsys):
    from transformers import TransfoXLTokenizer

    from txl.cli import main
    from txl.training.checkpoint import load_checkpoint

    hf = make_hf(CASES["adaptive-div4"], seed=3)
    hf.save_pretrained(tmp_path / "hf")
    words = ["<eos>"] + [f"w{i}" for i in range(V - 2)] + ["<unk>"]  # HF order: <eos> first
    (tmp_path / "hf" / "vocab.pkl").write_bytes(pickle.dumps(
        {"idx2sym": words, "sym2idx": collections.OrderedDict((w, i) for i, w in enumerate(words)),
         "special": ["<eos>"], "lower_case": False, "counter": collections.Counter()}))
    assert main(["convert", "hf", str(tmp_path / "hf"), str(tmp_path / "txl")]) == 0
    ckpt = load_checkpoint(tmp_path / "txl")
    assert ckpt.tokenizer.encode("w3 w7 zzz\n").tolist() == [4, 8, V - 1, 0]
    assert ckpt.run.eval.mem_len == 6 and ckpt.run.data.tokenizer == "word"

    ids = torch.randint(0, V, (2, 5))
    with torch.no_grad():
        ours = torch.log_softmax(ckpt.model.eval()(ids, mems=hf_initial_mems(ckpt.model.config, 2)).logits, -1)
        assert torch.allclose(ours, hf(input_ids=ids).prediction_scores, atol=1e-5)

    # evaluation of the converted model with the paper-style settings, on a text file
    (tmp_path / "test.txt").write_text("".join(f" w{i} w{(3 * i) % 50} w{(7 * i) % 50} .\n" for i in range(40)))
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "txl"), "--data", str(tmp_path / "test.txt"), "--tgt_len", "4",
                 "--mem_len", "16", "--clamp_len", "10", "--same_length"]) == 0
    shown = capsys.readouterr().out
    assert "ppl" in shown and "mem_len=16" in shown and "same_length=True" in shown
    assert main(["eval", str(tmp_path / "txl")]) == 2  # a converted model has no corpus of its own

    assert main(["convert", "to-hf", str(tmp_path / "txl"), str(tmp_path / "hf-again")]) == 0
    back = TransfoXLLMHeadModel.from_pretrained(tmp_path / "hf-again").eval()
    with torch.no_grad():
        assert torch.allclose(back(input_ids=ids).prediction_scores, hf(input_ids=ids).prediction_scores, atol=1e-6)
    hf_tok = TransfoXLTokenizer(pretrained_vocab_file=str(tmp_path / "hf-again" / "vocab.pkl"))
    assert hf_tok.convert_tokens_to_ids(["w3", "w7", "<eos>"]) == [4, 8, 0]
    # and back again without --vocab: the txl_vocab.json that to-hf wrote gives the same tokenizer
    assert main(["convert", "hf", str(tmp_path / "hf-again"), str(tmp_path / "txl-again")]) == 0
    assert load_checkpoint(tmp_path / "txl-again").tokenizer.to_dict() == ckpt.tokenizer.to_dict()

    capsys.readouterr()
    assert main(["convert", "hf", str(tmp_path / "hf"), str(tmp_path / "txl")]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err


def test_hf_config_with_an_impossible_size_is_refused(tmp_path):
    import json

    hf = make_hf(CASES["plain"])
    hf.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["n_layer"] = 100_000_000
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TxlError, match="more than this machine's memory"):
        read_hf_checkpoint(tmp_path / "hf")


@pytest.mark.parametrize("field, value, message", [
    ("dropout", "abc", "dropout must be a number, got 'abc'"),
    ("tgt_len", "x", "tgt_len must be an integer, got 'x'"),
    ("tgt_len", [1], "tgt_len must be an integer"),
    ("tgt_len", 1.9, "tgt_len must be an integer, got 1.9"),
    ("tgt_len", True, "tgt_len must be an integer, got True"),
    ("cutoffs", 5, "cutoffs must be a list of integers, got 5"),
    ("cutoffs", None, "cutoffs must be a list of integers, got None"),
    ("sample_softmax", "x", "sample_softmax must be an integer, got 'x'"),
    ("clamp_len", "x", "clamp_len must be an integer, got 'x'"),
    ("tie_projs", 5, "tie_projs must be a list"),
    ("init_std", {}, "init_std must be a number"),
    ("pre_lnorm", "false", "pre_lnorm must be true or false, got 'false'"),
    ("same_length", "false", "same_length must be true or false, got 'false'"),
    ("proj_share_all_but_first", "false", "proj_share_all_but_first must be true or false, got 'false'"),
    ("attn_type", "0", "attn_type must be an integer, got '0'"),
])
def test_an_hf_config_field_of_the_wrong_type_is_one_line_naming_the_file(tmp_path, capsys, field, value, message):
    """Values are checked as they are, never coerced: "false" is not read as true, 1.9 not rounded to 1."""
    import json

    from conftest import one_error_line, run_cli

    make_hf(CASES["adaptive-div1"]).save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli(capsys, "convert", "hf", tmp_path / "hf", tmp_path / "out")
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"txl: error: {tmp_path / 'hf' / 'config.json'}: ") and message in line, line
    assert not (tmp_path / "out").exists()


def test_vocabulary_saved_by_transformers_4_converts_and_encodes_like_hf(tmp_path):
    from transformers import TransfoXLTokenizer

    from txl.convert.commands import read_hf_vocab
    from txl.data import WordTokenizer

    words = ["<eos>", "the", "cat", "sat", ",", "@-@", "@,@", "@.@", "well", "known", "1", "000", "3", "5", ".",
             "cats", "<unk>"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    hf_tok = TransfoXLTokenizer(vocab_file=str(tmp_path / "vocab.txt"), unk_token="<unk>")
    hf_tok.build_vocab()
    assert hf_tok.idx2sym == words
    hf_tok.save_pretrained(tmp_path / "saved")  # pickles sacremoses objects, a Trie and AddedTokens too
    ours = read_hf_vocab(tmp_path / "saved" / "vocab.pkl")
    # TransfoXLTokenizer adds "<formula>" after idx2sym by default (len(hf_tok) == 18): read as HF gives it
    assert len(hf_tok) == len(words) + 1 and ours.words == words + ["<formula>"] and ours.lower is False
    assert read_hf_vocab(tmp_path / "saved" / "vocab.pkl", size=len(words)).words == words  # a model without it
    raw = WordTokenizer(ours.words, normalize="wikitext")  # raw text through txl's WikiText tokenisation
    for line in ["The well-known cat sat, 1,000 cats.", "the cat sat 3.5 well known .", "the dog"]:
        theirs = hf_tok.convert_tokens_to_ids(hf_tok.tokenize(line))  # HF: Moses + number splitting
        assert raw.encode(line).tolist() == theirs + [0]  # txl ends every line with <eos> (id 0 here)


def test_vocabulary_reader_still_refuses_other_globals():
    from txl.convert.safe_pickle import load_restricted_pickle

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    for payload in (pickle.dumps(Evil()), pickle.dumps({"x": collections.defaultdict(int)})):
        with pytest.raises(TxlError, match="refusing to load"):
            load_restricted_pickle(payload)


def test_an_hf_folder_given_where_a_txl_checkpoint_belongs_says_to_convert_it(tmp_path, capsys):
    from conftest import one_error_line, run_cli

    make_hf(CASES["plain"]).save_pretrained(tmp_path / "hf")
    for argv in (["convert", "int8", tmp_path / "hf", tmp_path / "o"], ["eval", tmp_path / "hf"],
                 ["generate", tmp_path / "hf", "-n", "2"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and one_error_line(err) == (f"txl: error: {tmp_path / 'hf'} is a Hugging Face TransfoXL "
                                                      f"folder; convert it first: txl convert hf {tmp_path / 'hf'} DST")
