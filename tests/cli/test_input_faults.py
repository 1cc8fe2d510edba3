"""Faults of a second red team on the command line: the bf16-weights/float16-autocast pair, summarize's
fields and empty documents, long inputs echoed in error lines, and data splits that would write empty
files. Each case is tested where it was reported and where the same kind is reached another way
(the server's and the export runner's cases: tests/serving/test_serve_faults.py, tests/export)."""

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import one_error_line as _one_error_line
from conftest import run_cli, tiny_model
from txl.data import ByteTokenizer
from txl.data.pairs import add_markers
from txl.errors import CLIP_CHARS, TxlError, clip_message, quoted
from txl.training.checkpoint import save_checkpoint
from txl.config import FinetuneConfig, RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error_line(err: str) -> str:
    """The one ``txl: error:`` line, leaving out a start line (``txl: threads ...``, ``txl: using ...``)."""
    return _one_error_line("\n".join(line for line in err.splitlines() if not line.startswith(("txl: threads ",
                                                                                               "txl: using "))))


def _checkpoint(folder: Path, finetuned: bool = False) -> Path:
    tokenizer = ByteTokenizer()
    run = RunConfig()
    if finetuned:
        tokenizer, _, _ = add_markers(tokenizer)
        run = RunConfig(finetune=FinetuneConfig(init="lm"))
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=1, tgt_len=4, mem_len=4)
    save_checkpoint(folder, model, tokenizer, run, {"step": 1})
    return folder


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("lm") / "ckpt")


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("ft") / "ckpt", finetuned=True)


# --- 1. --quantize bf16 with --dtype float16 ----------------------------------------------------------------

@pytest.mark.parametrize("command", [["eval"], ["generate", "-n", "2"], ["score", "DOC"], ["summarize", "DOC"],
                                     ["serve"]])
def test_bf16_weights_with_float16_autocast_is_one_line_before_loading(command, lm, finetuned, tmp_path, capsys,
                                                                        monkeypatch):
    import txl_recipes.serve.server as server
    import txl.training.checkpoint as checkpoint

    def no_loading(*args, **kwargs):
        raise AssertionError("loaded the checkpoint although the options cannot run together")

    monkeypatch.setattr(checkpoint, "load_checkpoint", no_loading)  # what every command's loading calls
    monkeypatch.setattr(server, "serve", no_loading)  # a server that started would never return
    doc = tmp_path / "doc.txt"
    doc.write_text("some text to read\n")
    ckpt = finetuned if command[0] == "summarize" else lm
    argv = [command[0], ckpt, *[doc if a == "DOC" else a for a in command[1:]], "--quantize", "bf16",
            "--dtype", "float16"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert one_error_line(err) == ("txl: error: --quantize bf16 cannot run with --dtype float16: bfloat16 weights "
                                   "compute in bfloat16; use --dtype bfloat16 or float32 (the default)")


def test_bf16_weights_still_run_with_their_own_dtype(lm, capsys):
    code, out, err = run_cli(capsys, "generate", lm, "--prompt", "ab", "-n", "3", "--quantize", "bf16", "--dtype",
                             "bfloat16", "--temperature", "0")
    assert code == 0 and out.startswith("ab") and "bf16 weights" in err


# --- 5. txl summarize checks every field, refuses empty documents ----------------------------------------------

@pytest.mark.parametrize("line,message", [
    ({"prompt": "ROMEO:", "completion": 5}, 'line 1: "completion" must be a string, got a number'),
    ({"prompt": "ROMEO:", "completion": ""}, 'line 1 has an empty "completion" (the reference summary); remove the '
                                             'key or give the summary'),
    ({"prompt": "ROMEO:", "name": ["f"]}, 'line 1: "name" must be a string, got an array'),
    ({"prompt": ""}, 'line 1: the document ("prompt") is empty; remove the line or give it text'),
    ({"text": 7}, 'line 1: "text" must be a string, got a number'),
    ({"prompt": "a", "text": "b"}, 'line 1 has both "prompt" and "text": give the document once'),
    ({"completion": "x"}, 'line 1 has no "prompt" (or "text"): each line needs the document as a string'),
])
def test_summarize_checks_every_field_of_a_document(finetuned, tmp_path, capsys, line, message):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps(line) + "\n")
    code, out, err = run_cli(capsys, "summarize", finetuned, docs, "-n", "2", "--out", tmp_path / "s.jsonl")
    assert code == 2 and out == "" and not (tmp_path / "s.jsonl").exists()
    assert one_error_line(err) == f"txl: error: {docs} {message}"


def test_summarize_refuses_a_document_that_encodes_to_no_tokens(tmp_path, capsys):
    from txl.data.tokenizers.simple import WordTokenizer

    tokenizer, _, _ = add_markers(WordTokenizer.build(["a b c d\n"]))
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=1, tgt_len=4, mem_len=4)
    save_checkpoint(tmp_path / "ft", model, tokenizer, RunConfig(finetune=FinetuneConfig(init="lm")), {"step": 1})
    bom = tmp_path / "bom.txt"  # a byte order mark alone: a file with bytes, a text with no word
    bom.write_bytes(b"\xef\xbb\xbf")
    code, out, err = run_cli(capsys, "summarize", tmp_path / "ft", bom, "-n", "2")
    assert code == 2 and out == ""
    assert one_error_line(err) == f"txl: error: {bom}: the document encodes to no tokens; remove it or give it text"


def test_summarize_refuses_an_empty_text_file_and_keeps_the_reference_it_reads(finetuned, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, out, err = run_cli(capsys, "summarize", finetuned, empty, "-n", "2")
    assert code == 2 and out == ""
    assert one_error_line(err) == f"txl: error: document {empty} is empty; remove it or give it text"
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"prompt": "ROMEO:", "completion": "a play", "name": "r", "module": "kept"}) + "\n")
    code, out, err = run_cli(capsys, "summarize", finetuned, docs, "-n", "2")
    row = json.loads(out)
    assert code == 0 and row["reference"] == "a play" and row["name"] == "r"


# --- 7. no error line echoes more than about 100 characters of an input ---------------------------------------

LONG = "a" * 100_000


def _short(line: str, longest: int = CLIP_CHARS + 40) -> str:
    """``line``, after checking that no stretch of it is a long run of the input's character."""
    assert len(line) < 600 and "a" * longest not in line, line[:300]
    return line


@pytest.mark.parametrize("argv,said", [
    (["generate", "LM", "--device", "c" * 100_000], "unknown device 'ccc"),
    (["generate", "LM", "--threads", "9" * 1_000], "--threads must be from 0"),
    (["generate", "LM", "--threads", "x" * 5_000], "argument --threads: invalid int value"),
    (["eval", "LM", "--mem-len", "x" * 100_000], "argument --mem-len: invalid int value"),
    (["train", "DATA", "train." + "q" * 5_000 + "=3"], "unknown key 'qqq"),
    (["train", "DATA", "train.max_steps=" + "q" * 5_000], "train.max_steps must be an integer"),
    (["eval", "/nowhere/" + "a" * 3_000], "checkpoint /nowhere/aaa"),
])
def test_error_lines_quote_at_most_about_100_characters_of_an_input(lm, tmp_path, capsys, argv, said):
    data = tmp_path / "data.txt"
    data.write_text("some text\n" * 20)
    argv = [{"LM": lm, "DATA": data}.get(a, a) for a in argv]
    code, _, err = run_cli(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and said in line
    long_run = max((len(run) for run in line.replace("…", " ").split()), default=0)
    assert long_run <= CLIP_CHARS and "characters)" in line, line[:300]
    assert len(line) < 600


def test_a_long_jsonl_key_and_label_are_cut_in_the_message(lm, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "ab", LONG: 1}) + "\n")
    code, _, err = run_cli(capsys, "generate", lm, "--input", prompts, "-n", "2")
    assert code == 2 and "unknown key(s)" in _short(one_error_line(err))
    data = tmp_path / "d.jsonl"
    long_number = int("1" * 150)  # labels whose texts collide, each 150 characters long
    data.write_text(json.dumps({"text": "ab", "label": long_number}) + "\n" + json.dumps({"text": "cd", "label": "1" * 150})
                    + "\n")
    code, _, err = run_cli(capsys, "classify", "train", lm, "--data", data, "--out", tmp_path / "r", "--steps", "1")
    line = one_error_line(err)
    assert code == 2 and "have the same text" in line and "1" * 120 not in line and len(line) < 800  # 3 quotes


def test_inputs_with_spaces_and_many_inputs_are_cut_too(lm, tmp_path, capsys):
    spaced = "/nowhere/" + "ab " * 2_000  # a path with spaces: no quote and no unbroken stretch gives it away
    code, _, err = run_cli(capsys, "eval", spaced)
    line = one_error_line(err)
    assert code == 2 and line.startswith("txl: error: checkpoint /nowhere/ab ab") and "(6,009 characters)" in line
    assert len(line) < 300
    prompts = tmp_path / "p.jsonl"  # 40 unknown keys of 93 characters: three are named, with the count of the rest
    prompts.write_text(json.dumps({"prompt": "ab", **{f"{k:02d}" + "k" * 91: 1 for k in range(40)}}) + "\n")
    code, _, err = run_cli(capsys, "generate", lm, "--input", prompts, "-n", "2")
    line = one_error_line(err)
    assert code == 2 and "and 37 more" in line and len(line) < 700
    code, _, err = run_cli(capsys, "eval", lm, *[f"--bogus-{k}-" + "x" * 90 for k in range(30)])
    line = one_error_line(err)
    assert code == 2 and "unrecognized arguments" in line and "and 27 more" in line and len(line) < 600


def test_clip_message_cuts_quoted_and_unbroken_stretches_only():
    message = f"no session {LONG!r}: it was never created; the model's memory and the run's settings stay"
    clipped = clip_message(message)
    assert clipped.startswith("no session 'aaa") and "…" in clipped and "(100,000 characters)" in clipped
    assert clipped.endswith(": it was never created; the model's memory and the run's settings stay")
    assert len(clipped) < 250
    spaced = "the checkpoint's eval config, then " + "word " * 60 + "and the run's own"  # apostrophes are no quotes
    assert clip_message(spaced) == spaced
    path = "/data/" + "d" * 300 + "/train.txt"
    assert clip_message(f"corpus {path} does not exist").endswith("/train.txt (316 characters) does not exist")
    assert quoted("x" * 5) == "'xxxxx'" and quoted(LONG).endswith("' (100,000 characters)")
    assert len(quoted(LONG)) < CLIP_CHARS + 30


@pytest.mark.parametrize("command", [["generate", "-n", "2"], ["eval", "--data", "DOC"], ["score", "DOC"],
                                     ["summarize", "DOC"]])
def test_a_classifier_given_to_a_language_model_command_is_named_as_one(lm, tmp_path, capsys, command):
    import shutil

    run = tmp_path / "clf"
    shutil.copytree(lm, run / "best")
    shutil.copy(lm / "run.json", run / "run.json")
    (run / "best" / "classifier.json").write_text("{}")  # what txl classify writes beside the LM's files
    doc = tmp_path / "doc.txt"
    doc.write_text("some text to read\n")
    code, out, err = run_cli(capsys, command[0], run, *[doc if a == "DOC" else a for a in command[1:]])
    assert code == 2 and not out
    assert one_error_line(err).startswith(f"txl: error: {run / 'best'} is a document classifier (txl classify), "
                                          "not a language model; use txl classify predict")


@pytest.mark.parametrize("device", ["mps", "xpu", "meta", "cpu:0", "cuda:x"])
def test_devices_txl_does_not_run_on_are_refused_in_one_line(lm, capsys, device):
    code, out, err = run_cli(capsys, "generate", lm, "--device", device, "-n", "2", "-p", "a")
    assert code == 2 and not out
    assert one_error_line(err) == f"txl: error: unknown device '{device}'; use auto, cpu, cuda or cuda:N"


def test_clip_message_cuts_a_quoted_input_once_and_keeps_its_quotes():
    for message in (f"unknown device {LONG!r}; use cpu", f'no file "{LONG}" here'):
        clipped = clip_message(message, inputs=[LONG])
        assert clipped.count("characters)") == 1 and "(100,000 characters)" in clipped, clipped
        quote = "'" if "device" in message else '"'
        assert re.search(f"{quote}a+…a+{quote} \\(100,000 characters\\)", clipped), clipped
        assert clip_message(clipped, inputs=[LONG]) == clipped


def test_an_unknown_long_device_is_named_once(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--device", LONG, "--out", tmp_path / "run")
    line = one_error_line(err)
    assert code == 2 and line.count("characters)") == 1 and "(100,000 characters); use auto, cpu" in line, line


# --- 8. a data split that would write an empty file --------------------------------------------------------------

@pytest.mark.parametrize("command,split,empty", [
    ("packages", "1,0,0", "valid.jsonl and test.jsonl"),
    ("packages", "0.8,0.2,0", "test.jsonl"),
    ("docstrings", "0.9,0.1,0", "test.jsonl"),
    ("docstrings", "0.5,0,0.5", "valid.jsonl"),
])
def test_a_split_that_leaves_a_file_empty_is_refused_and_nothing_is_written(tmp_path, capsys, command, split, empty):
    code, out, err = run_cli(capsys, "data", command, "--out", tmp_path / "out", "--split", split)
    assert code == 2 and out == "" and not (tmp_path / "out").exists()
    assert one_error_line(err) == (f"txl: error: --split {split} leaves {empty} empty: give each of train, valid and "
                                   "test a share > 0 (e.g. the default)")


def test_the_data_builders_refuse_a_split_without_documents_when_called_directly(tmp_path):
    from txl_studies.summaries.data import prepare_docstrings
    from txl_studies.classification.data import prepare_packages

    lib = tmp_path / "lib"
    for k in range(2):
        for i in range(4):
            path = lib / f"p{k}" / f"m{i}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text("".join(f"v{j:03d} = {'0' * 92}\n" for j in range(40)))
    # a share > 0 that the cap rounds to no document (1 x 0.1): said, nothing written
    with pytest.raises(TxlError, match=r"leave valid.jsonl and test.jsonl without documents"):
        prepare_packages(tmp_path / "a", stdlib=lib, doc_bytes=500, min_bytes=500, max_per_class=1, min_class_bytes=1)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    with pytest.raises(TxlError, match=r"leave test.jsonl without documents"):
        prepare_packages(tmp_path / "b", stdlib=lib, doc_bytes=500, min_bytes=500, min_class_bytes=1,
                         fractions=(0.8, 0.2, 0.0))
    modules = []
    (tmp_path / "lib2").mkdir()
    for i in range(3):
        modules.append(tmp_path / "lib2" / f"mod{i}.py")
        modules[-1].write_text(f'def f{i}(x):\n    """Return x."""\n    return x\n' * 3)
    with pytest.raises(TxlError, match=r"of 3 modules leave valid.jsonl without pairs"):
        prepare_docstrings(tmp_path / "c", files=modules, fractions=(0.8, 0.1, 0.1), min_bytes=1)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_score_out_dash_is_stdout(lm, tmp_path, capsys, monkeypatch):
    doc = tmp_path / "doc.txt"
    doc.write_text("some text to read\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "score", lm, doc, "--out", "-", "--no-per-token")
    assert code == 0 and out.startswith('{"document": ') and not (tmp_path / "-").exists(), err


@pytest.mark.parametrize("flags, said", [(["--sliding-window", "0"], "--sliding-window must be >= 1, got 0"),
                                         (["--sliding-window", "4", "--stride", "0"], "--stride must be >= 1, got 0")])
def test_sliding_window_flags_are_checked_before_loading(lm, capsys, flags, said):
    code, out, err = run_cli(capsys, "eval", lm, *flags)
    assert code == 2 and one_error_line(err) == f"txl: error: {said}" and "txl: using" not in err


def test_classify_names_an_empty_data_file_and_a_null_label(lm, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    for text, expect in (("", f'{data} holds no documents; give one JSON object per line with "text" and "label"'),
                         ('{"text": "ab", "label": null}\n', f'{data} line 1 has no "label" (it is null)')):
        data.write_text(text)
        code, _, err = run_cli(capsys, "classify", "train", lm, "--data", data, "--out", tmp_path / "r", "--steps", "1")
        assert code == 2 and one_error_line(err) == f"txl: error: {expect}", err
        assert not (tmp_path / "r").exists()
