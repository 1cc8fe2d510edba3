"""The standard-library package-classification benchmark: the data set, the "last" reading mode, the held-out
file of `txl classify train`, the metrics and their bootstrap intervals, and the TF-IDF baseline (issue 24, part 3)."""

import ast
import contextlib
import io
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import one_error_line, run_cli, tiny_config, tiny_model
from txl.classification import TransformerXLForSequenceClassification
from txl_studies.classification.baselines import tfidf_baseline
from txl.classification.data import pad_batch
from txl.cli import main
from txl.data import ByteTokenizer
from txl.data.files import default_corpus_files
from txl_studies.classification.data import chunk_source, prepare_packages, strip_module_header
from txl.evaluation.intervals import accuracy, bootstrap_interval, macro_f1
from txl.errors import TxlError

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SPLITS = ("train", "valid", "test")


# --- the data set (the real standard library, built once: about 2 s) ------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``txl data packages`` with its defaults: (folder, split.json, rows per split, stdout)."""
    out = tmp_path_factory.mktemp("packages") / "set"
    buffer = io.StringIO()  # a module fixture has no capsys
    with contextlib.redirect_stdout(buffer):
        assert main(["data", "packages", "--out", str(out)]) == 0
    info = json.loads((out / "split.json").read_text())
    rows = {s: [json.loads(line) for line in (out / f"{s}.jsonl").read_text().splitlines()] for s in SPLITS}
    return out, info, rows, buffer.getvalue()


def test_default_build_has_2000_documents_in_classes_found_by_size(built):
    _, info, rows, stdout = built
    assert {s: len(rows[s]) for s in SPLITS} == info["totals"]
    assert sum(info["totals"].values()) >= 2000
    assert stdout.startswith(f"documents train/valid/test {info['totals']['train']}/{info['totals']['valid']}/"
                             f"{info['totals']['test']} in {len(info['classes'])} classes:")
    # the classes are computed: every package with >= 150,000 bytes of non-test source and a file per split
    assert {"asyncio", "email", "encodings", "tkinter", "xml", "idlelib", "logging"} <= set(info["classes"])
    for name in info["classes"]:
        assert info["class_bytes"][name] >= 150_000
    assert info["left_out"]["pydoc_data"].startswith("1 file(s) with documents")  # one big file cannot be split
    assert info["left_out"]["json"].endswith("bytes of source < 150000")
    assert "test" not in info["classes"] and "site-packages" not in info["classes"]
    for split in SPLITS:
        assert {r["label"] for r in rows[split]} == set(info["classes"])
        for name in info["classes"]:
            assert sum(r["label"] == name for r in rows[split]) == info["documents"][split][name]


def test_every_file_is_in_one_split_and_no_test_folder_is_read(built):
    _, info, rows, _ = built
    where = {}
    for split in SPLITS:
        for r in rows[split]:
            where.setdefault(r["file"], set()).add(split)
            assert r["file"].split("/")[0] == r["label"]
            assert not {"test", "tests", "idle_test"} & set(r["file"].split("/")[:-1])
    assert all(len(splits) == 1 for splits in where.values())
    listed = [f for split in SPLITS for name in info["classes"] for f in info["files"][split][name]]
    assert len(listed) == len(set(listed))  # the file lists of split.json are disjoint too
    # none of them is in the default LM corpus (top-level modules only)
    corpus = {f.relative_to(STDLIB).as_posix() for f in default_corpus_files()}
    assert not corpus & set(where)


def test_split_is_stratified_and_capped_per_class(built):
    _, info, _, _ = built
    for name in info["classes"]:
        before = [info["before_cap"][s][name] for s in SPLITS]
        after = [info["documents"][s][name] for s in SPLITS]
        assert after == [min(b, cap) for b, cap in zip(before, (175, 25, 50))]  # round(250 * 0.7/0.1/0.2)
        assert all(len(info["files"][s][name]) >= 1 for s in SPLITS)
        if min(len(info["files"][s][name]) for s in SPLITS) >= 3:  # enough files to come close to 0.7/0.1/0.2
            shares = np.array(before) / sum(before)
            assert np.abs(shares - [0.7, 0.1, 0.2]).max() < 0.05, (name, shares)
    assert info["documents"]["train"]["encodings"] == 175 and info["before_cap"]["train"]["encodings"] > 175


def test_documents_are_whole_lines_of_1_to_2_kb(built):
    _, _, rows, _ = built
    sizes = np.array([len(r["text"].encode("utf-8")) for s in SPLITS for r in rows[s]])
    assert sizes.min() >= 1024 and sizes.max() <= 2048
    for s in SPLITS:
        for r in rows[s]:
            source = (STDLIB / r["file"]).read_text(encoding="utf-8")
            assert r["text"] in source
            start = source.index(r["text"])
            assert start == 0 or source[start - 1] == "\n"  # cut at a line start


def _docstring_end(source: str) -> int | None:
    """Character offset of the end of the module docstring's last line (ast, the independent oracle)."""
    tree = ast.parse(source)
    if ast.get_docstring(tree) is None:
        return None
    lines = source.splitlines(keepends=True)
    return sum(len(line) for line in lines[:tree.body[0].end_lineno])


def test_no_document_holds_its_module_docstring(built):
    _, _, rows, _ = built
    docs = [r for s in SPLITS for r in rows[s] if r["label"] in ("asyncio", "email", "logging", "http", "urllib")]
    sources = {f: (STDLIB / f).read_text(encoding="utf-8") for f in {r["file"] for r in docs}}
    ends = {f: _docstring_end(text) for f, text in sources.items()}
    assert sum(v is not None for v in ends.values()) >= 20
    checked = 0
    for r in docs:
        if ends[r["file"]] is not None:  # the document starts after the docstring's lines
            assert sources[r["file"]].index(r["text"]) >= ends[r["file"]], r["file"]
            checked += 1
    assert checked >= 100
    # the reported case: the first piece of asyncio/base_events.py starts at its imports
    text = (STDLIB / "asyncio" / "base_events.py").read_text(encoding="utf-8")
    assert "Base implementation of event loop." in text
    first = chunk_source(strip_module_header(text), 2048, 1024)[0]
    assert first.startswith("import collections\n") and "Base implementation of event loop" not in first


def test_strip_module_header_cases():
    code = "import os\n\nx = 1\n"
    # licence comments, a docstring over several lines, a comment after it
    assert strip_module_header("#!/usr/bin/env python\n# Copyright\n\n'''Doc\n\nmore.'''\n\n# note\n" + code) == code
    assert strip_module_header('r"""Raw doc."""  # trailing\n' + code) == code
    assert strip_module_header('"Doc " "joined."\n' + code) == code  # implicit concatenation
    assert strip_module_header("# only comments\n" + code) == code  # no docstring: the comment block goes
    # a string that is not a whole statement, or an f-string, is code: kept
    assert strip_module_header('"-".join(["a"])\n' + code) == '"-".join(["a"])\n' + code
    assert strip_module_header('f"no {1}"\n' + code) == 'f"no {1}"\n' + code
    assert strip_module_header('"""unterminated\n') == '"""unterminated\n'  # does not tokenize: kept


def test_chunk_source_cuts_at_line_starts_and_drops_short_tails():
    lines = ["a" * 9 + "\n"] * 7  # 10 bytes a line
    assert chunk_source("".join(lines), 25, 15) == ["".join(lines[:2])] * 3  # the 10-byte tail is dropped
    assert chunk_source("".join(lines), 25, 5) == ["".join(lines[:2])] * 3 + [lines[0]]
    assert chunk_source("é" * 20 + "\nab\n", 30, 1) == ["é" * 20 + "\n", "ab\n"]  # bytes, not characters
    assert chunk_source("x" * 50 + "\ny\n", 20, 1) == ["x" * 50 + "\n", "y\n"]  # an over-long line alone


def _fake_stdlib(root: Path, files: dict[str, int]) -> Path:
    """A standard-library folder with packages of ``{relative path: number of 100-byte lines}``."""
    for rel, n in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(f'"""The {rel} module."""\n' + "".join(f"v{i:03d} = {'0' * 92}\n" for i in range(n)))
    return root


def test_split_by_file_is_seeded_and_fills_every_split(tmp_path):
    files = {f"p{k}/m{i}.py": 10 + i for k in range(2) for i in range(10)}
    files["p2/test/t.py"] = 30  # test folders and small packages are left out
    files["p3/only.py"] = 30
    root = _fake_stdlib(tmp_path / "lib", files)
    (root / "p2" / "__init__.py").touch()
    kwargs = dict(doc_bytes=1000, min_bytes=500, max_per_class=0, min_class_bytes=2000, stdlib=root)
    a = prepare_packages(tmp_path / "a", seed=1, **kwargs)
    b = prepare_packages(tmp_path / "b", seed=1, **kwargs)
    c = prepare_packages(tmp_path / "c", seed=2, **kwargs)
    assert a["classes"] == ["p0", "p1"] and a["left_out"]["p3"] == "1 file(s) with documents; a class needs one per split (3)"
    assert a["left_out"]["p2"] == "0 bytes of source < 2000"  # its only source is below test/: not counted
    assert a["files"] == b["files"] and a["files"] != c["files"]
    for info in (a, c):
        for name in ("p0", "p1"):
            assert sorted(f for s in SPLITS for f in info["files"][s][name]) == sorted(f for f in files if f.startswith(name))
            counts = np.array([info["documents"][s][name] for s in SPLITS])
            assert np.abs(counts / counts.sum() - [0.7, 0.1, 0.2]).max() < 0.05
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()
    # the docstring naming the module is never in a document
    assert "module" not in (tmp_path / "a" / "train.jsonl").read_text()


def test_cap_is_shared_out_by_the_fractions(tmp_path):
    root = _fake_stdlib(tmp_path / "lib", {f"p{k}/m{i}.py": 40 for k in range(2) for i in range(10)})
    info = prepare_packages(tmp_path / "a", doc_bytes=500, min_bytes=500, max_per_class=20, min_class_bytes=1,
                            stdlib=root, fractions=(0.5, 0.2, 0.3))
    for name in ("p0", "p1"):
        assert [info["documents"][s][name] for s in SPLITS] == [10, 4, 6]
        assert sum(info["before_cap"][s][name] for s in SPLITS) == 80  # 10 files of 8 pieces


@pytest.mark.parametrize("argv,message", [
    (["--doc-bytes", "100", "--min-bytes", "200"], "--doc-bytes must be >= --min-bytes (200), got 100"),
    (["--split", "0.5,0.5,0.5"], "--split must be three finite fractions"),
    (["--max-per-class", "-1"], "--max-per-class must be >= 0, got -1"),
    (["--min-class-bytes", "0"], "--min-class-bytes must be >= 1, got 0"),
])
def test_cli_bad_settings_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    code, _, err = run_cli(capsys, "data", "packages", "--out", tmp_path / "out", *argv)
    assert code == 2 and message in one_error_line(err)
    assert not (tmp_path / "out").exists()


# --- reading mode "last" ------------------------------------------------------------------------------------

def _classifier(mode, pooling="last", **overrides):
    torch.manual_seed(0)
    model = TransformerXLForSequenceClassification(tiny_config(**overrides), 3, mode=mode, pooling=pooling,
                                                   classifier_dropout=0.0)
    torch.nn.init.normal_(model.head.weight, 0.0, 1.0)
    return model.to(torch.float64).eval()


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("attn_type", ["rel", "abs"])
def test_last_mode_reads_exactly_the_last_tgt_len_tokens(pooling, attn_type):
    extra = {"attn_type": "abs", "mem_len": 0} if attn_type == "abs" else {}
    model = _classifier("last", pooling, **extra)  # tgt_len 5
    g = np.random.default_rng(3)
    docs = [g.integers(1, 37, n) for n in (3, 12, 23, 5)]
    with torch.no_grad():
        ids, lengths = pad_batch(docs)
        got = model(ids, lengths).logits
        for row, doc in enumerate(docs):  # by hand: the window alone through the body, pooled, the head
            window = torch.as_tensor(doc[-5:])[None]
            h, _ = model.body.hidden_states(window, None)
            pooled = h[0, -1] if pooling == "last" else h[0].mean(0)
            torch.testing.assert_close(got[row], model.head(pooled), rtol=0, atol=1e-12)
        # everything before the window is invisible; the first token of the window is not
        changed = docs[2].copy()
        changed[:-5] = changed[:-5] % 36 + 1
        assert not np.array_equal(changed, docs[2])
        torch.testing.assert_close(model(*pad_batch([changed])).logits, got[2:3], rtol=0, atol=1e-12)
        changed[-5] = changed[-5] % 36 + 1
        assert (model(*pad_batch([changed])).logits - got[2:3]).abs().max() > 1e-6


def test_last_and_first_differ_and_memory_mode_still_refused_without_memory():
    g = np.random.default_rng(4)
    doc = [g.integers(1, 37, 12)]
    with torch.no_grad():
        assert (_classifier("last")(*pad_batch(doc)).logits - _classifier("first")(*pad_batch(doc)).logits).abs().max() > 1e-6
    with pytest.raises(TxlError, match="use mode='first' or 'last'"):
        _classifier("memory", attn_type="abs", mem_len=0)


# --- txl classify train --valid, --mode last, intervals ---------------------------------------------------------

def _lm(tmp_path):
    lm = tiny_model(dtype=torch.float32, vocab_size=256, tgt_len=8, mem_len=8)
    lm.save_pretrained(tmp_path / "lm", ByteTokenizer())
    return tmp_path / "lm"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return path


def test_cli_trains_on_data_and_reports_on_the_valid_file(tmp_path, capsys):
    lm = _lm(tmp_path)
    train = _jsonl(tmp_path / "train.jsonl", [(f"{w} {i} " * 4, w) for w in ("aa", "bb", "cc") for i in range(4)])
    test = _jsonl(tmp_path / "test.jsonl", [("bb 9 " * 5, "bb"), ("aa 8 " * 3, "aa")])
    code, out, err = run_cli(capsys, "classify", "train", lm, "--data", train, "--valid", test, "--out", tmp_path / "r",
                             "--mode", "last", "--steps", "2", "--batch-size", "4", "-q", "--device", "cpu")
    assert code == 0, err
    assert "train 12, held-out 2 from " + str(test) in out
    lines = (out + err).splitlines()  # (-q: the training loop's start lines go to stderr)
    starts = sorted(line.split(":")[0] for line in lines if line.startswith(("documents:", "data:", "model:")))
    assert starts == ["data", "documents", "model"], out + err  # one start line of each kind
    saved = json.loads((tmp_path / "r" / "best" / "classifier.json").read_text())
    assert saved["mode"] == "last" and saved["labels"] == ["aa", "bb", "cc"]
    extra = json.loads((tmp_path / "r" / "heldout.json").read_text())
    assert extra["heldout_sources"] == [f"{test}:1", f"{test}:2"]
    assert extra["settings"]["valid"] == str(test) and extra["settings"]["valid_fraction"] is None
    held = extra["heldout"]
    assert held["n"] == 2 and sum(map(sum, held["confusion"])) == 2
    pred = extra["heldout_predictions"]
    assert held["accuracy"] == accuracy([1, 0], [saved["labels"].index(p) for p in pred])
    low, high = held["accuracy_interval"]
    assert 0 <= low <= held["accuracy"] <= high <= 1
    assert f"held-out: accuracy {held['accuracy']:.4f} [{low:.4f}, {high:.4f}], macro-F1" in out
    assert extra["train"]["tokens"] == 2 * 4 * 8  # 2 steps of 4 documents, each read for its last tgt_len 8 tokens


@pytest.mark.parametrize("case", ["unknown_label", "both_flags", "missing_valid"])
def test_cli_valid_file_errors_are_one_line(tmp_path, capsys, case):
    lm = _lm(tmp_path)
    train = _jsonl(tmp_path / "train.jsonl", [("aa " * 9, "aa"), ("bb " * 9, "bb")])
    test = _jsonl(tmp_path / "test.jsonl", [("cc " * 9, "cc" if case == "unknown_label" else "aa")])
    argv = ["classify", "train", lm, "--data", train, "--valid", test, "--out", tmp_path / "r", "--steps", "1",
            "--device", "cpu"]
    if case == "both_flags":
        argv += ["--valid-fraction", "0.3"]
    elif case == "missing_valid":
        argv[argv.index(test)] = tmp_path / "nope.jsonl"
    code, _, err = run_cli(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and not (tmp_path / "r").exists()
    assert {"unknown_label": f"--valid {test} has label(s) that --data {train} lacks: cc",
            "both_flags": "give --valid (held-out documents) or --valid-fraction",
            "missing_valid": "does not exist"}[case] in line


# --- metrics, bootstrap intervals ----------------------------------------------------------------------------

# --- labels keep their identity: 1 and "1" are not merged; true labels are reported as given -------------------

def test_labels_whose_texts_collide_are_refused_not_merged(tmp_path, capsys):
    lm = _lm(tmp_path)
    data = _jsonl(tmp_path / "d.jsonl", [("aa " * 9, 1), ("bb " * 9, "b"), ("cc " * 9, "1"), ("dd " * 9, "b")])
    code, out, err = run_cli(capsys, "classify", "train", lm, "--data", data, "--out", tmp_path / "r", "--steps", "1",
                             "--device", "cpu")
    assert code == 2 and out == "" and not (tmp_path / "r").exists()
    assert one_error_line(err) == (f'txl: error: labels a number 1 ({data}:1) and a string "1" ({data}:3) have '
                                   "the same text '1' but are not the same label; write every label of a class the "
                                   "same way (all strings or all numbers)")
    # the sibling: the two spellings in --data and --valid
    data = _jsonl(tmp_path / "d.jsonl", [("aa " * 9, 1), ("bb " * 9, 2), ("aa " * 8, 1), ("bb " * 8, 2)])
    held = _jsonl(tmp_path / "h.jsonl", [("aa " * 7, "1")])
    code, _, err = run_cli(capsys, "classify", "train", lm, "--data", data, "--valid", held, "--out", tmp_path / "r",
                           "--steps", "1", "--device", "cpu")
    assert code == 2 and "have the same text '1' but are not the same label" in one_error_line(err)


def test_labels_are_kept_and_reported_as_given(tmp_path, capsys):
    lm = _lm(tmp_path)
    rows = [(f"{w} {i} " * 4, label) for w, label in (("aa", 1), ("bb", "b")) for i in range(4)]
    code, out, err = run_cli(capsys, "classify", "train", lm, "--data", _jsonl(tmp_path / "d.jsonl", rows), "--out",
                             tmp_path / "r", "--mode", "last", "--steps", "2", "--batch-size", "4", "-q",
                             "--device", "cpu")
    assert code == 0 and "2 labels (1, b)" in out, err
    assert json.loads((tmp_path / "r" / "best" / "classifier.json").read_text())["labels"] == [1, "b"]
    docs = _jsonl(tmp_path / "p.jsonl", [("aa 9 " * 4, 1), ("bb 9 " * 4, "b"), ("aa 7 " * 4, 3), ("bb 7 " * 4, "3")])
    code, out, err = run_cli(capsys, "classify", "predict", tmp_path / "r" / "best", docs, "--device", "cpu")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["true_label"] for r in records] == [1, "b", 3, "3"]  # as this input gives them, types included
    assert all(r["label"] in (1, "b") and set(r["probs"]) == {"1", "b"} for r in records)


def test_accuracy_and_macro_f1_by_hand():
    y_true, y_pred = [0, 0, 1, 1, 2], [0, 1, 1, 1, 0]
    # class 0: tp 1, support 2, predicted 2 -> F1 2/4; class 1: tp 2, support 2, predicted 3 -> 4/5;
    # class 2: tp 0, support 1, predicted 0 -> 0; class 3 (num_labels 4) neither occurs nor is predicted: left out
    assert accuracy(y_true, y_pred) == pytest.approx(3 / 5)
    assert macro_f1(y_true, y_pred) == pytest.approx((0.5 + 0.8 + 0.0) / 3, abs=1e-15)
    assert macro_f1(y_true, y_pred, num_labels=4) == pytest.approx((0.5 + 0.8 + 0.0) / 3, abs=1e-15)
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    assert macro_f1(y_true, y_pred) == pytest.approx(sklearn_metrics.f1_score(y_true, y_pred, average="macro"))
    assert macro_f1([2, 2], [2, 2]) == 1.0  # only the class present counts
    with pytest.raises(TxlError, match="class indices in \\[0, 2\\)"):
        macro_f1([0, 2], [0, 1], num_labels=2)
    with pytest.raises(TxlError, match="same, non-zero number"):
        accuracy([0, 1], [0])


def test_bootstrap_interval_matches_a_hand_computation():
    values = np.arange(10, dtype=float)
    got = bootstrap_interval(values, np.mean, n=200, seed=7, level=0.9)
    idx = np.random.default_rng(7).integers(0, 10, size=(200, 10))
    means = values[idx].mean(axis=1)
    assert (got.low, got.high) == tuple(np.percentile(means, [5.0, 95.0]))
    assert got.estimate == 4.5 and got.level == 0.9 and got.n == 200
    assert got.low < 4.5 < got.high
    assert bootstrap_interval(values, np.mean, n=200, seed=7, level=0.9) == got  # seeded
    # a constant statistic has a zero-width interval
    flat = bootstrap_interval(values, lambda v: 3.0, n=50, seed=1)
    assert (flat.estimate, flat.low, flat.high) == (3.0, 3.0, 3.0)
    # paired arrays are resampled together: a perfect predictor stays perfect in every resample
    y = np.array([0, 1, 2, 1, 0, 2])
    paired = bootstrap_interval((y, y.copy()), macro_f1, n=100, seed=0)
    assert (paired.estimate, paired.low, paired.high) == (1.0, 1.0, 1.0)
    with pytest.raises(TxlError, match="same number in every array"):
        bootstrap_interval((y, y[:3]), macro_f1)
    with pytest.raises(TxlError, match="n >= 1"):
        bootstrap_interval(values, n=0)


# --- TF-IDF + logistic regression ------------------------------------------------------------------------------

@pytest.mark.parametrize("analyzer", ["word", "char_wb"])
def test_tfidf_baseline_separates_a_separable_set(analyzer):
    pytest.importorskip("sklearn")
    words = {"net": "socket connect send recv", "gui": "widget button canvas pack", "mail": "header mime body"}
    g = np.random.default_rng(0)
    shared = ["x", "self", "return"]  # in every class
    train, test = ([(" ".join(g.choice(words[k].split() + shared, size=12)), k) for k in words for _ in range(n)]
                   for n in (6, 4))
    pred = tfidf_baseline([t for t, _ in train], [y for _, y in train], [t for t, _ in test], seed=0,
                          analyzer=analyzer)
    assert pred.tolist() == [y for _, y in test]
    with pytest.raises(TxlError, match="analyzer must be one of word, char_wb"):
        tfidf_baseline(["a"], ["x"], ["a"], analyzer="bytes")
    with pytest.raises(TxlError, match="at least 2 labels"):
        tfidf_baseline(["a b", "c d"], ["x", "x"], ["a"])


def test_tfidf_baseline_without_scikit_learn_says_how_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "sklearn.feature_extraction.text", None)  # import fails
    with pytest.raises(TxlError, match=r"needs scikit-learn: .*pip install -e '\.\[bench\]'"):
        tfidf_baseline(["a b", "c d"], ["x", "y"], ["a"])
