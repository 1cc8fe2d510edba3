"""Document classification with recurrence: invariants of padding, memory, truncated BPTT and loading."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_model
from txl.classification import TransformerXLForSequenceClassification
from txl.classification.data import pad_batch
from txl.cli import main
from txl.data import ByteTokenizer
from txl.errors import TxlError

def classifier(mode="memory", pooling="last", grad_segments=1, seed=0, num_labels=3, **overrides):
    torch.manual_seed(seed)
    model = TransformerXLForSequenceClassification(tiny_config(**overrides), num_labels, mode=mode, pooling=pooling,
                                                   grad_segments=grad_segments, classifier_dropout=0.0)
    torch.nn.init.normal_(model.head.weight, 0.0, 1.0)  # large enough that small state changes show in logits
    return model.to(torch.float64).eval()


def docs_of(lengths, seed=1, low=1, high=37):
    g = np.random.default_rng(seed)
    return [g.integers(low, high, n) for n in lengths]


def logits(model, docs):
    ids, lengths = pad_batch(docs)
    with torch.no_grad():
        return model(ids, lengths).logits


@pytest.mark.parametrize("mode,pooling", [("memory", "last"), ("memory", "mean"), ("first", "mean"), ("abs", "last")])
def test_logits_do_not_depend_on_padding_or_batch_neighbours(mode, pooling):
    # tgt_len 5: lengths 3 (inside one segment), 12 (three segments), 23 (five), 10 (segment boundary)
    model = classifier("first", pooling, attn_type="abs", mem_len=0) if mode == "abs" else classifier(mode, pooling)
    docs = docs_of([3, 12, 23, 10])
    alone = torch.cat([logits(model, [d]) for d in docs])
    together = logits(model, docs)
    reversed_ = logits(model, docs[::-1]).flip(0)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-10)
    torch.testing.assert_close(reversed_, alone, rtol=0, atol=1e-10)
    # padding ids never matter: pad with other ids than 0
    ids, lengths = pad_batch(docs)
    noisy = ids.clone()
    noisy[torch.arange(ids.size(1))[None, :] >= lengths[:, None]] = 36
    with torch.no_grad():
        torch.testing.assert_close(model(noisy, lengths).logits, together, rtol=0, atol=0)
    assert not torch.allclose(alone[0], alone[1])  # different documents do get different scores


def test_memory_carries_the_first_segment_to_the_last():
    # 16 tokens = 4 segments of 5 (the last has 1 token); the last segment's own attention window
    # (memory 7) reaches back to token 8 only, so tokens 0..4 can act only through deeper memories
    model = classifier("memory")
    doc = docs_of([16])[0]
    changed = doc.copy()
    changed[:5] = (doc[:5] % 36) + 1
    assert not np.array_equal(changed[:5], doc[:5])
    base, other = logits(model, [doc]), logits(model, [changed])
    assert (base - other).abs().max() > 1e-6
    # without memory (mem_len 0) the same change in the first segment is invisible at the end
    no_mem = classifier("memory", mem_len=0)
    torch.testing.assert_close(logits(no_mem, [doc]), logits(no_mem, [changed]), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["first", "abs"])
def test_first_mode_ignores_everything_after_the_first_segment(mode):
    model = classifier("first", attn_type="abs", mem_len=0) if mode == "abs" else classifier("first")
    doc = docs_of([16])[0]
    changed = doc.copy()
    changed[5:] = (doc[5:] % 36) + 1
    torch.testing.assert_close(logits(model, [doc]), logits(model, [changed]), rtol=0, atol=0)
    changed[4] = doc[4] % 36 + 1  # the last token read does matter
    assert (logits(model, [doc]) - logits(model, [changed])).abs().max() > 1e-6


def _embedding_grad(model, docs):
    ids, lengths = pad_batch(docs)
    model.zero_grad(set_to_none=True)
    out = model(ids, lengths)
    out.logits.pow(2).sum().backward()
    return out.logits.detach(), model.body.word_emb.emb_layers[0].weight.grad.abs().sum(1)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_gradient_reaches_only_the_last_k_segments_of_each_document(pooling):
    # every (document, segment) uses its own 5 token ids, so the embedding gradient of an id says
    # whether the loss back-propagated into that segment; id 0 is padding and must get no gradient
    seg_ids = np.arange(1, 36).reshape(7, 5)
    long_doc = seg_ids[:4].reshape(-1)          # 4 segments: ids 1..20
    short_doc = seg_ids[4:7].reshape(-1)[:12]   # 3 segments (the last partial): ids 21..32
    values = {}
    for k in (1, 2, 3, None):
        model = classifier("memory", pooling, grad_segments=k, mem_len=10)
        values[k], grad = _embedding_grad(model, [long_doc, short_doc])
        reached = grad > 0
        for doc, n_seg in ((long_doc, 4), (short_doc, 3)):
            first = 0 if k is None else max(0, n_seg - k)
            for s in range(n_seg):
                ids = doc[s * 5:(s + 1) * 5]
                assert bool(reached[ids].all()) == (s >= first), (k, n_seg, s)
                assert bool(reached[ids].any()) == (s >= first), (k, n_seg, s)
        assert not reached[0] and not reached[36]  # padding and unused ids
    for k in (2, 3, None):  # the forward value does not depend on where gradients stop
        torch.testing.assert_close(values[k], values[1], rtol=0, atol=1e-12)


def test_no_graph_is_built_for_segments_outside_the_window():
    model = classifier("memory", grad_segments=1)
    ids, lengths = pad_batch(docs_of([23]))
    seen = []
    hook = model.body.layers[0].register_forward_hook(lambda m, i, o: seen.append(o.requires_grad))
    model(ids, lengths)
    hook.remove()
    assert seen == [False, False, False, False, True]


def _save_lm(tmp_path, **overrides):
    lm = tiny_model(dtype=torch.float32, vocab_size=256, **overrides)
    lm.save_pretrained(tmp_path / "lm", ByteTokenizer())
    return lm, tmp_path / "lm"


def test_from_pretrained_lm_loads_exactly_the_lm_weights(tmp_path):
    lm, path = _save_lm(tmp_path)
    model = TransformerXLForSequenceClassification.from_pretrained_lm(path, 4, tgt_len=8, mem_len=16)
    lm_state, body_state = lm.state_dict(), model.body.state_dict()
    assert lm_state.keys() == body_state.keys()
    for key, value in lm_state.items():
        assert torch.equal(body_state[key], value), key
    assert model.config.tgt_len == 8 and model.config.mem_len == 16
    assert model.training and isinstance(model.tokenizer, ByteTokenizer)
    # the body computes what the LM computes
    ids = torch.randint(0, 256, (2, 8))
    model.eval()
    with torch.no_grad():
        h, _ = model.body.hidden_states(ids)
        lm_logits = lm(ids).logits
    torch.testing.assert_close(lm.crit.logits(h.reshape(16, -1)).view(2, 8, -1), lm_logits)
    # a saved classifier loads back with the same outputs
    model.save_pretrained(tmp_path / "clf")
    again = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "clf")
    texts = ["def f(x):\n    return x\n" * 3, "import os\n"]
    torch.testing.assert_close(again.predict_proba(texts), model.predict_proba(texts), rtol=0, atol=0)


def _write_dataset(tmp_path, labels=("alpha", "beta"), n=8):
    g = np.random.default_rng(0)
    lines = []
    for label in labels:
        for i in range(n):
            filler = "".join(g.choice(list("xyz \n"), size=int(g.integers(5, 25))))
            lines.append(json.dumps({"text": f"{filler}{label * 3}{filler}", "label": label}))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_train_then_predict_round_trip(tmp_path, capsys):
    _, lm = _save_lm(tmp_path, tgt_len=16, mem_len=16)
    data = _write_dataset(tmp_path)
    out = tmp_path / "run"
    assert main(["classify", "train", "--data", str(data), "--checkpoint", str(lm), "--out", str(out),
                 "--steps", "3", "--batch-size", "4", "--quiet", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "held-out: accuracy" in text
    # a run of the shared training loop: checkpoints best/ (the final model) and last/ (with the trainer state)
    for name in ("model.safetensors", "config.json", "classifier.json", "vocab.json", "state.json"):
        assert (out / "best" / name).is_file() and (out / "last" / name).is_file(), name
    assert (out / "last" / "trainer.json").is_file() and (out / "metrics.csv").is_file()
    saved = json.loads((out / "best" / "classifier.json").read_text())
    assert saved["labels"] == ["alpha", "beta"] and saved["mode"] == "memory"
    held = json.loads((out / "heldout.json").read_text())["heldout"]
    assert 0.0 <= held["accuracy"] <= 1.0 and 0.0 <= held["macro_f1"] <= 1.0 and held["n"] == 4
    doc = tmp_path / "one.txt"
    doc.write_text("zz betabetabeta zz")
    assert main(["classify", "predict", str(out), str(doc), str(data), "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 17 and rows[0]["source"] == str(doc) and "true_label" not in rows[0]
    assert rows[1]["true_label"] == "alpha"
    for row in rows:
        assert row["label"] in ("alpha", "beta")
        assert abs(sum(row["probs"].values()) - 1) < 1e-4
        assert row["label"] == max(row["probs"], key=row["probs"].get)


def test_cli_abs_model_defaults_to_first_mode(tmp_path, capsys):
    _, lm = _save_lm(tmp_path, attn_type="abs", mem_len=0)
    data = _write_dataset(tmp_path)
    assert main(["classify", "train", "--data", str(data), "--checkpoint", str(lm), "--out", str(tmp_path / "r"),
                 "--steps", "1", "--quiet", "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "r" / "best" / "classifier.json").read_text())["mode"] == "first"
    assert main(["classify", "train", "--data", str(data), "--checkpoint", str(lm), "--out", str(tmp_path / "r2"),
                 "--mode", "memory", "--steps", "1", "--device", "cpu"]) == 2
    assert "no memory" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["one_label", "empty_doc", "bad_line", "unknown_checkpoint", "lm_as_classifier",
                                  "missing_data", "out_is_the_lm"])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    _, lm = _save_lm(tmp_path)
    data = tmp_path / "d.jsonl"
    lines = [json.dumps({"text": "abc", "label": "a"}), json.dumps({"text": "abd", "label": "b"})]
    if case == "one_label":
        lines = [json.dumps({"text": "abc", "label": "a"})] * 3
    elif case == "empty_doc":
        lines.append(json.dumps({"text": "", "label": "a"}))
    elif case == "bad_line":
        lines.append('{"text": "abc", "label": ')
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    argv = ["classify", "train", "--data", str(data), "--checkpoint", str(lm), "--out", str(out), "--steps", "1"]
    if case == "unknown_checkpoint":
        argv[argv.index(str(lm))] = str(tmp_path / "nope")
    elif case == "missing_data":
        argv[argv.index(str(data))] = str(tmp_path / "nope.jsonl")
    elif case == "lm_as_classifier":
        argv = ["classify", "predict", str(lm), str(data)]
    elif case == "out_is_the_lm":  # an existing folder (here the LM itself) is never replaced
        argv[argv.index(str(out))], out = str(lm), lm
    before = sorted((p.name, p.read_bytes()) for p in lm.rglob("*") if p.is_file())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: ") and err.count("\n") == 1, err
    assert sorted((p.name, p.read_bytes()) for p in lm.rglob("*") if p.is_file()) == before
    assert case == "out_is_the_lm" or not out.exists()
    expected = {"one_label": "1 label", "empty_doc": "is empty", "bad_line": "line 3 is not valid JSON",
                "unknown_checkpoint": "does not exist", "lm_as_classifier": "not a txl classifier",
                "missing_data": "does not exist", "out_is_the_lm": "is the input folder"}[case]
    assert expected in err


def test_a_text_the_vocabulary_cannot_encode_is_named_by_its_document():
    from txl.classification.data import encode_texts
    from txl.data import CharTokenizer

    assert [ids.tolist() for ids in encode_texts(CharTokenizer(list("ab")), ["ab", "ba"])] == [[0, 1], [1, 0]]
    with pytest.raises(TxlError, match=r"^document d.jsonl:2: text contains 1 character not in the char vocabulary"):
        encode_texts(CharTokenizer(list("ab")), ["ab", "abc"], sources=["d.jsonl:1", "d.jsonl:2"])
    with pytest.raises(TxlError, match=r"^document 1 is empty \(no tokens\)"):
        encode_texts(CharTokenizer(list("ab")), ["ab", ""])
