"""The JSON / JSON Lines readers (txl.fileio): any bad input is one TxlError naming the file (and line)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_model
from txl.cli import main
from txl.data import CharTokenizer
from txl.errors import TxlError
from txl.fileio import read_json, read_json_object, read_jsonl
from txl.model import TransformerXLLM
from txl.training.checkpoint import load_checkpoint, save_checkpoint
from txl.config import RunConfig

DEEP = "[" * 100_000 + "]" * 100_000
PIECES = [b"[", b"]", b"{", b"}", b'"', b'"a"', b":", b",", b"1", b"-", b"e999", b"1" * 5000, b"\n", b"\r",
          b" ", b"\xff", b"\xc3", b"\xa9", b"\\u", b"\\ud800", b"null", b"tru", b"NaN", b"[" * 3000]
JSONISH = st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=200), JSONISH))
def test_any_bytes_parse_or_raise_txl_error(tmp_path, data):
    path = tmp_path / "x.json"
    path.write_bytes(data)
    for read in (read_json, read_json_object, lambda p: list(read_jsonl(p))):
        try:
            read(path)
        except TxlError as err:
            assert str(path) in str(err)


def test_deep_nesting_and_huge_numbers(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(TxlError, match="nested too deeply"):
        read_json(path)
    path.write_text("1" * 10_000)
    with pytest.raises(TxlError, match="deep.json is not valid JSON"):
        read_json(path, "config")
    lines = tmp_path / "deep.jsonl"
    lines.write_text('{"text": "a"}\n\n' + DEEP + "\n")
    with pytest.raises(TxlError, match=r"deep\.jsonl line 3 is not valid JSON"):
        list(read_jsonl(lines))
    lazy = read_jsonl(tmp_path / "missing.jsonl", "documents")  # nothing is read before iteration
    with pytest.raises(TxlError, match="cannot read documents .*missing.jsonl"):
        next(lazy)
    with pytest.raises(TxlError, match="cannot read"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(TxlError, match="must hold a JSON object"):
        (tmp_path / "list.json").write_text("[1]")
        read_json_object(tmp_path / "list.json")


def test_jsonl_lines_and_values(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n  \n[2, "\xe2\x80\xa8"]\n')  # U+2028 inside a string is not a line break
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (4, [2, "\u2028"])]


@pytest.mark.parametrize("name", ["config.json", "vocab.json"])
def test_checkpoint_with_a_deeply_nested_file_is_a_txl_error(tmp_path, name):
    tokenizer = CharTokenizer.build("to be or not to be")
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size)
    run = RunConfig.from_dict({})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, run, {"step": 0})
    (tmp_path / "ckpt" / name).write_text(DEEP)
    (tmp_path / "ckpt" / "checksums.json").unlink(missing_ok=True)  # reach the parser, not the checksum
    with pytest.raises(TxlError, match=name.replace(".", r"\.")):
        load_checkpoint(tmp_path / "ckpt")
    if name == "config.json":
        with pytest.raises(TxlError, match="nested too deeply"):
            TransformerXLLM.from_pretrained(tmp_path / "ckpt")


def _one_error_line(capsys, path, line):
    err = capsys.readouterr().err
    assert err.startswith("txl: error: ") and err.count("\n") == 1, err
    assert f"{path} line {line}" in err, err


def test_score_cli_deep_jsonl(tmp_path, capsys):
    tokenizer = CharTokenizer.build("to be or not to be")
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size)
    run = RunConfig.from_dict({})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, run, {"step": 0})
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "to be"}) + "\n" + DEEP + "\n")
    assert main(["score", str(tmp_path / "ckpt"), str(docs), "--device", "cpu"]) != 0
    _one_error_line(capsys, docs, 2)


def test_classify_predict_cli_deep_jsonl(tmp_path, capsys):
    from txl.classification.model import TransformerXLForSequenceClassification

    tokenizer = CharTokenizer.build("to be or not to be")
    lm = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size)
    model = TransformerXLForSequenceClassification(lm.config, num_labels=2)
    model.tokenizer = tokenizer
    model.save_pretrained(tmp_path / "cls")
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "to be", "label": "0"}) + "\n" + DEEP + "\n")
    assert main(["classify", "predict", str(tmp_path / "cls"), str(docs), "--device", "cpu"]) != 0
    _one_error_line(capsys, docs, 2)


def test_read_toml_says_one_line_for_every_bad_file(tmp_path):
    from txl.fileio import read_toml

    good = tmp_path / "good.toml"
    good.write_text("[classify]\nsteps = 3\n")
    assert read_toml(good) == {"classify": {"steps": 3}}
    good.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())  # a byte-order mark, as some editors save it
    assert read_toml(good) == {"classify": {"steps": 3}}
    cases = {"deep.toml": ("a = " + "[" * 100000 + "]" * 100000, "is not valid TOML for txl: nested too deeply"),
             "bad.toml": ("[x\n", "is not valid TOML: "), "latin.toml": (b"a = '\xff'", "is not valid TOML: ")}
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(TxlError, match=f"^config file {path} {message}"):
            read_toml(path)
    with pytest.raises(TxlError, match=f"^config file {tmp_path} is not a file$"):
        read_toml(tmp_path)
    with pytest.raises(TxlError, match="does not exist$"):
        read_toml(tmp_path / "none.toml")


def test_json_files_written_with_a_byte_order_mark_are_read(tmp_path):
    from txl.fileio import read_jsonl

    lines = tmp_path / "prompts.jsonl"
    lines.write_bytes(b'\xef\xbb\xbf{"prompt": "ab"}\n{"prompt": "\xef\xbb\xbfcd"}\n')
    assert list(read_jsonl(lines)) == [(1, {"prompt": "ab"}), (2, {"prompt": "\ufeffcd"})]  # the file's first only


def test_an_output_folder_that_is_not_a_folder_is_named_for_what_it_is(tmp_path):
    import os

    from txl.fileio import check_output_folder

    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    for name, kind in (("file", "a file"), ("fifo", "a FIFO"), ("dangling", "a dangling symbolic link")):
        with pytest.raises(TxlError, match=f"^--out {tmp_path / name} is {kind}; choose a folder$"):
            check_output_folder(tmp_path / name)
    assert not (tmp_path / "nothing").exists()


def test_each_kind_of_run_is_named_with_the_command_that_continues_it(tmp_path):
    from txl.fileio import continue_command, run_kind

    (tmp_path / "clf" / "best").mkdir(parents=True)
    (tmp_path / "clf" / "best" / "classifier.json").write_text("{}")
    for name, saved in (("ft", {"finetune": {"init": "lm"}}), ("lm", {"finetune": None}), ("bad", "not json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps(saved) if name != "bad" else saved)
    expect = {"clf": ("classifier", "txl classify train LM --data DATA --resume {} (the settings it started with)"),
              "ft": ("fine-tuning", "txl finetune --resume {}"), "lm": ("language-model", "txl train --resume {}"),
              "bad": ("language-model", "txl train --resume {}")}
    for name, (kind, command) in expect.items():
        assert (run_kind(tmp_path / name), continue_command(tmp_path / name)) == (kind, command.format(tmp_path / name))
