"""Config and command-line input checks: field types, finite numbers, early checks before torch, optional
dependencies, fine-tuned checkpoints, and the not-UTF-8 message."""

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import pkgutil
import re
import subprocess
import sys
import typing

import pytest
import torch

import txl
import txl_recipes
from conftest import one_error_line as _one_error_line
from conftest import run_cli
from txl.classification.model import TransformerXLForSequenceClassification
from txl.cli import all_parsers
from txl.config import CHECKSUMS_NAME, RUN_NAME, SECTIONS, check_fields, load_run_config, FinetuneConfig, RunConfig
from txl.data import ByteTokenizer, CharTokenizer
from txl.data.pairs import add_markers
from txl.errors import TxlError
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.fileio import sha256_file
from txl.training.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error_line(err: str) -> str:
    """:func:`conftest.one_error_line`, leaving out the start line some commands print (``txl: threads ...``)."""
    return _one_error_line("\n".join(line for line in err.splitlines() if not line.startswith("txl: threads ")))

SMALL = dict(n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16, tgt_len=8, mem_len=8, dropout=0.0, dropatt=0.0)


# --- the config classes, found rather than listed: a new one is covered as it appears ------------------------

OPTIONAL_PACKAGES = {"fastapi", "uvicorn", "pydantic", "starlette", "matplotlib", "onnx", "onnxruntime", "onnxscript"}


def _config_classes() -> list[type]:
    """Every dataclass of txl and its recipes that checks its own fields with check_fields, and every run-config section."""
    found = {cls for cls in SECTIONS.values()}
    packages = [(txl.__path__, "txl."), (txl_recipes.__path__, "txl_recipes.")]
    for info in (info for path, prefix in packages for info in pkgutil.walk_packages(path, prefix)):
        if info.name.endswith("__main__"):  # runs the CLI
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as err:  # a recipe module of an optional extra (FastAPI) that is not installed
            if err.name in OPTIONAL_PACKAGES:
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls) \
                    and re.search(r"check_fields\((cls\b|type\(self\))", inspect.getsource(cls)):
                found.add(cls)
    return sorted(found, key=lambda c: c.__qualname__)


CONFIGS = _config_classes()


def test_the_config_classes_are_found():
    names = {c.__name__ for c in CONFIGS}
    assert {"TransformerXLConfig", "DataConfig", "TrainConfig", "EvalConfig", "FinetuneConfig",
            "ClassifierConfig", "ServeConfig"} <= names


def _fields(predicate):
    """(class, field name, hint) of every field of every config class whose hint passes ``predicate``."""
    out = []
    for cls in CONFIGS:
        hints = typing.get_type_hints(cls)
        out += [(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls) if predicate(hints[f.name])]
    return out


def _optional(hint) -> bool:
    return type(None) in typing.get_args(hint)


def _base(hint):
    """``X`` of ``X | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if _optional(hint) else hint


WRONG = {int: ["256", 1.5, True, [1]], float: ["0.5", True, [1]], str: [5, True, [1]], bool: ["yes", 1, None]}


def _wrong_values(hint) -> list:
    base = _base(hint)
    if typing.get_origin(base) in (list, tuple):
        return ["x", 5]
    return [v for v in WRONG[base] if not (v is None and _optional(hint))]


OPTIONAL_FIELDS = _fields(_optional)


def test_there_are_optional_fields_to_check():
    names = {f"{c.__name__}.{n}" for c, n, _ in OPTIONAL_FIELDS}
    assert {"EvalConfig.mem_len", "EvalConfig.clamp_len", "TransformerXLConfig.d_embed", "DataConfig.cache_dir",
            "ClassifierConfig.max_tokens"} <= names


@pytest.mark.parametrize("cls, name, hint", OPTIONAL_FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in OPTIONAL_FIELDS])
def test_every_optional_field_refuses_a_wrong_type_and_takes_null(cls, name, hint):
    for value in _wrong_values(hint):
        with pytest.raises(TxlError) as err:
            check_fields(cls, {name: value}, "section")
        assert str(err.value).startswith(f"section.{name} must be "), (value, err.value)
        assert repr(value) in str(err.value)
    assert check_fields(cls, {name: None}, "section") == {name: None}


def test_the_reported_optional_fields_in_toml_are_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for table, expect in (('[eval]\nmem_len = "256"', "eval.mem_len must be an integer, got '256'"),
                          ("[eval]\nclamp_len = [1]", "eval.clamp_len must be an integer, got [1]"),
                          ('[model]\nd_embed = "64"', "model.d_embed must be an integer, got '64'"),
                          ("[data]\ncache_dir = 5", "data.cache_dir must be a string, got 5")):
        (tmp_path / "c.toml").write_text(table)
        code, out, err = run_cli(capsys, "train", "--config", tmp_path / "c.toml", "--out", tmp_path / "run")
        assert code == 2 and one_error_line(err) == f"txl: error: {expect}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no ./5/, no run folder


def _rewrite_run_json(folder, change):
    """Edit a checkpoint's run.json and its checksum (as a hand-edited or older checkpoint would be)."""
    values = json.loads((folder / RUN_NAME).read_text())
    change(values)
    (folder / RUN_NAME).write_text(json.dumps(values))
    sums = json.loads((folder / CHECKSUMS_NAME).read_text())
    sums[RUN_NAME] = sha256_file(folder / RUN_NAME)
    (folder / CHECKSUMS_NAME).write_text(json.dumps(sums))


def _lm(folder, tokenizer=None, run=None, seed=0):
    """A tiny language-model checkpoint folder (untrained)."""
    tokenizer = tokenizer or ByteTokenizer()
    torch.manual_seed(seed)
    config = TransformerXLConfig(vocab_size=tokenizer.vocab_size, **SMALL)
    run = run or RunConfig(model=config)
    save_checkpoint(folder, TransformerXLLM(config), tokenizer, dataclasses.replace(run, model=config), {"step": 0})
    return folder


@pytest.mark.parametrize("command", [["generate", "-n", "2"], ["eval"], ["score", "DOC"], ["summarize", "DOC"]])
def test_a_wrongly_typed_run_json_field_is_one_error_line_naming_the_file(tmp_path, capsys, command):
    # summarize refuses a model that was not fine-tuned before reading more than its run.json: give it one that was
    ckpt = _finetuned(tmp_path / "lm") if command[0] == "summarize" else _lm(tmp_path / "lm")
    _rewrite_run_json(ckpt, lambda v: v["eval"].update(mem_len="256"))
    (tmp_path / "doc.txt").write_text("some text to read")
    argv = [str(tmp_path / "doc.txt") if a == "DOC" else a for a in command]
    code, out, err = run_cli(capsys, argv[0], ckpt, *argv[1:])
    assert code == 2 and out == ""
    assert one_error_line(err) == f"txl: error: {ckpt / RUN_NAME}: eval.mem_len must be an integer, got '256'"


# --- one rule for floats: every float field and every float flag refuses NaN and infinities -------------------

FLOAT_FIELDS = _fields(lambda h: _base(h) is float or typing.get_args(_base(h)) == (float,))


def test_there_are_float_fields_to_check():
    names = {f"{c.__name__}.{n}" for c, n, _ in FLOAT_FIELDS}
    assert {"TransformerXLConfig.recon_loss_weight", "TrainConfig.min_lr", "DataConfig.split",
            "ClassifierConfig.classifier_dropout"} <= names


@pytest.mark.parametrize("cls, name, hint", FLOAT_FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in FLOAT_FIELDS])
def test_every_float_field_refuses_non_finite_numbers(cls, name, hint):
    listed = typing.get_origin(_base(hint)) in (list, tuple)
    for bad in (math.nan, math.inf, -math.inf, 10**400):
        value = [0.5, bad] if listed else bad
        with pytest.raises(TxlError) as err:
            check_fields(cls, {name: value}, "section")
        where = f"section.{name}[1]" if listed else f"section.{name}"
        assert str(err.value) == f"{where} must be a finite number, got {bad!r}"
    assert check_fields(cls, {name: [0.5, 2] if listed else 2}, "section") == {name: [0.5, 2.0] if listed else 2.0}


def test_recon_loss_weight_inf_is_refused_from_overrides_toml_and_python(tmp_path):
    with pytest.raises(TxlError, match=r"^model.recon_loss_weight must be a finite number, got inf$"):
        load_run_config(None, ["model.recon_loss_weight=inf"])
    (tmp_path / "c.toml").write_text("[model]\nrecon_loss_weight = inf\n[train]\nmin_lr = nan\n")
    with pytest.raises(TxlError, match="must be a finite number"):
        load_run_config(tmp_path / "c.toml")
    with pytest.raises(TxlError, match=r"^model.recon_loss_weight must be a finite number, got inf$"):
        TransformerXLConfig(recon_loss_weight=math.inf)
    with pytest.raises(TxlError, match=r"^train.min_lr must be a finite number, got nan$"):  # sibling: a section
        RunConfig(train=dataclasses.replace(RunConfig().train, min_lr=math.nan)).check()


def _float_flags():
    """(program, flag, good value, bad values) of every option whose type parses numbers with a fraction."""
    found = []
    for prog, parser in all_parsers().items():
        for action in parser._actions:
            if not action.option_strings or not callable(action.type):
                continue
            for good, bad in (("0.5", ["nan", "inf", "-inf", "1e999"]),
                              ("0.5,0.25,0.25", ["nan,0,0", "0.5,0.5,nan", "0.5,inf,0"])):
                try:
                    action.type(good)
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    continue
                found.append((prog, max(action.option_strings, key=len), good, bad))
                break
    return found


FLOAT_FLAGS = _float_flags()


def test_no_flag_takes_a_plain_float_or_parses_numbers_itself():
    flags = {f"{prog} {flag}" for prog, flag, _, _ in FLOAT_FLAGS}
    assert {"txl generate --length-penalty", "txl summarize --length-penalty", "txl data docstrings --split",
            "txl generate --temperature", "txl recl --ratios", "txl serve --idle-timeout"} <= flags
    for prog, parser in all_parsers().items():
        for action in parser._actions:
            assert action.type is not float, f"{prog} {action.option_strings}: use checks.finite_float"
            default = action.default
            if action.option_strings and action.type is None and isinstance(default, str) and default:
                # numbers with a fraction kept as a string would be parsed (and checked) somewhere else
                parts = default.split(",")
                try:
                    [float(part) for part in parts]
                except ValueError:
                    continue
                if all(part.strip().lstrip("-").isdigit() for part in parts):
                    continue  # integers (--lengths 128,256): no NaN to let through
                pytest.fail(f"{prog} {action.option_strings} parses numbers itself: give it an argparse type")


@pytest.mark.parametrize("prog, flag, good, bad", FLOAT_FLAGS, ids=[f"{p[4:]} {f}" for p, f, _, _ in FLOAT_FLAGS])
def test_every_float_flag_refuses_non_finite_numbers(prog, flag, good, bad, capsys):
    parser = all_parsers()[prog]
    for value in bad:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([f"{flag}={value}"])
        assert exit_.value.code == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"txl: error: argument {flag}") and "must be a finite number, got" in line, line


def test_the_reported_float_cases_end_to_end(tmp_path, capsys):
    for argv, expect in (
            (["data", "docstrings", "--out", tmp_path / "d", "--split", "nan,0,0"],
             "argument --split: must be a finite number, got 'nan' in 'nan,0,0'"),
            (["data", "docstrings", "--out", tmp_path / "d", "--split", "0.5,0.5,nan"],
             "argument --split: must be a finite number, got 'nan' in '0.5,0.5,nan'"),
            (["data", "docstrings", "--out", tmp_path / "d", "--split", "0,0.5,0.5"],
             "--split must be three finite fractions >= 0 summing to 1 (train, valid, test; train > 0), got 0,0.5,0.5"),
            (["generate", tmp_path, "--num-beams", "2", "--length-penalty", "nan"],
             "argument --length-penalty: must be a finite number, got 'nan'"),
            (["summarize", tmp_path, "x.txt", "--num-beams", "2", "--length-penalty", "inf"],
             "argument --length-penalty: must be a finite number, got 'inf'")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and expect in one_error_line(err), err
    assert not (tmp_path / "d").exists()


def test_the_library_refuses_non_finite_length_penalty_and_split(tmp_path):
    from txl_studies.summaries.data import prepare_docstrings
    from txl.generation import beam_search

    model = TransformerXLLM(TransformerXLConfig(vocab_size=5, **SMALL)).eval()
    for penalty in (math.nan, math.inf):
        with pytest.raises(TxlError, match="length_penalty must be a finite number"):
            beam_search(model, torch.tensor([[1, 2]]), num_beams=2, max_new_tokens=2, length_penalty=penalty)
    for fractions in ((math.nan, 0, 0), (0.5, 0.5, math.nan)):
        with pytest.raises(TxlError, match="the split fractions must be three finite fractions"):
            prepare_docstrings(tmp_path / "d", fractions=fractions)
    assert not (tmp_path / "d").exists()


# --- arguments and paths are checked before torch is imported ------------------------------------------------

EARLY = [  # (argv, the error line); CKPT is an existing empty folder
    (["train", "nope.txt"], "corpus path nope.txt does not exist"),
    (["train", "--config", "nope.toml"], "config file nope.toml does not exist"),
    (["train", "--resume", "nope"], "--resume nope does not exist"),
    (["train", "--nproc", "0"], "--nproc must be >= 1, got 0"),
    (["finetune", "--init", "nope", "--data", "p.jsonl", "--out", "o"], "--init nope does not exist"),
    (["finetune", "--init", "CKPT", "--data", "nope.jsonl", "--out", "o"], "--data nope.jsonl does not exist"),
    (["eval", "nope"], "checkpoint nope does not exist"),
    (["eval", "CKPT", "--data", "nope"], "--data nope does not exist"),
    (["eval", "CKPT", "--sweep-mem", "0,x"], "--sweep-mem needs comma-separated integers >= 0, got '0,x'"),
    (["generate", "nope"], "checkpoint nope does not exist"),
    (["generate", "CKPT", "--prompt-file", "nope"], "prompt file nope does not exist"),
    (["generate", "CKPT", "--top-p", "2"], "--top-p must be in (0, 1], got 2.0"),
    (["summarize", "nope", "doc.txt"], "checkpoint nope does not exist"),
    (["summarize", "CKPT", "nope.txt"], "nope.txt does not exist"),
    (["score", "nope", "a.txt"], "checkpoint nope does not exist"),
    (["score", "CKPT", "nope.txt"], "input nope.txt does not exist"),
    (["bench", "--eval-speedup", "--lengths", "x"], "--lengths needs comma-separated positive integers, got 'x'"),
    (["bench", "--compile", "--dtype", "bfloat16"], "--dtype does not apply to --compile (it would be ignored)"),
    (["bench", "--compile", "--quantize", "int8"], "--compile does not apply to --quantize (it would be ignored)"),
    (["bench", "--export", "--batch-size", "4"], "--batch-size does not apply to --export (it would be ignored)"),
    (["bench", "--export", "--compile"], "--export does not apply to --compile (it would be ignored)"),
    (["eval", "CKPT", "--compile", "--quantize", "bf16"], "--compile does not take --quantize bf16 yet; drop one of them"),
    (["eval", "CKPT", "--compile", "--sliding-window", "64"],
     "--compile applies to the plain evaluation with memory, not --sliding-window; drop one of them"),
    (["eval", "CKPT", "--sliding-window", "16", "--stride", "32"],
     "--stride 32 is more than --sliding-window 16: a window predicts at most its own tokens; use a --stride of at "
     "most the window"),
    # decoding flags that would change nothing
    (["generate", "CKPT", "--num-beams", "4", "--top-k", "5"],
     "--top-k has no effect with --num-beams 4: beam search ranks by log-probability and draws nothing; leave one out"),
    (["generate", "CKPT", "--num-beams", "2", "-t", "1"], "-t/--temperature has no effect with --num-beams 2: "),
    (["summarize", "CKPT", "doc.txt", "--num-beams", "2", "--top-p", "0.9"],
     "--top-p has no effect with --num-beams 2"),
    (["generate", "CKPT", "--stop", ""], "--stop must be a text of at least one character, got ''"),
    (["generate", "CKPT", "--num-beams", "2", "-t", "0.8"], "-t/--temperature has no effect with --num-beams 2"),
    (["summarize", "CKPT", "doc.txt", "--top-k", "40"],
     "--top-k applies to sampling, and this command decodes greedily by default: give -t/--temperature T (T > 0) "
     "too, or leave it out"),
    (["generate", "CKPT", "-t", "0", "--top-p", "0.9"],
     "--top-p has no effect with -t/--temperature 0: greedy decoding takes the most likely token; leave one out"),
    (["generate", "CKPT", "--length-penalty", "2"],
     "--length-penalty ranks the beams of beam search: give --num-beams N (N > 1) too, or leave it out"),
    (["summarize", "CKPT", "doc.txt", "--json", "r.json"],
     "--json writes the ROUGE scores: add --rouge (the summaries go to stdout or --out)"),
    (["plot", "CKPT", "--max-segments", "3"],
     "--max-segments goes with CHECKPOINT --attention, not with learning curves"),
    (["classify", "train", "CKPT", "--data", "doc.txt", "--resume", "nope"], "--resume nope does not exist"),
    (["classify", "train", "CKPT", "--data", "d", "--out", "o", "--nproc", "0"],
     "--nproc must be >= 1 and divide --batch-size 8, got 0"),
    (["convert", "hf", "nope", "dst"], "SRC nope does not exist"),
    (["convert", "to-hf", "nope", "dst"], "checkpoint nope does not exist"),
    (["convert", "int8", "nope", "dst"], "checkpoint nope does not exist"),
    (["data", "prepare", "enwik8", "--source", "nope"], "--source nope does not exist"),
    (["data", "docstrings", "--min-bytes", "0"], "--min-bytes must be >= 1, got 0"),
    (["data", "packages", "--doc-bytes", "100"], "--doc-bytes must be >= --min-bytes (1024), got 100"),
    (["classify", "train", "nope", "--data", "d", "--out", "o"], "checkpoint nope does not exist"),
    (["classify", "predict", "nope", "a.txt"], "classifier nope does not exist"),
    (["serve", "nope"], "checkpoint nope does not exist"),
    (["plot", "nope"], "run directory nope does not exist (give a run directory with metrics.csv)"),
    (["plot", "nope", "--attention", "--text", "x"], "checkpoint nope does not exist"),
    (["recl", "nope"], "checkpoint nope does not exist"),
    (["ablate", "--data", "nope"], "--data nope does not exist"),
    (["export", "nope", "out"], "checkpoint nope does not exist"),
    (["export", "CKPT", "doc.txt"], "OUT doc.txt is a file; choose a folder"),
    (["export", "CKPT", "doc.txt/out"], "OUT doc.txt/out would be inside doc.txt, which is a file; choose a folder"),
    (["export", "CKPT", "out", "--mem-len", "0"], "--mem-len must be >= 1, got 0"),
    (["export", "CKPT", "out", "--mem-len", "-1"], "--mem-len must be >= 1, got -1"),  # the command's minimum, first
    # the span flags of every command, by the one shared check (the flag as --help shows it)
    (["eval", "CKPT", "--clamp-len", "-5"], "--clamp-len must be >= 0, got -5"),
    (["score", "CKPT", "doc.txt", "--clamp-len", "-5"], "--clamp-len must be >= 0, got -5"),
    (["serve", "CKPT", "--cmem-len", "-1"], "--cmem-len must be >= 0, got -1"),
    (["serve", "CKPT", "--compile", "--quantize", "bf16"], "--compile does not take --quantize bf16 yet; drop one of them"),
    (["serve", "CKPT", "--compile", "--dtype", "bfloat16"], "--compile does not take a half-precision --dtype yet; drop one of them"),
    (["eval", "CKPT", "--tgt_len", "0"], "--tgt-len must be >= 1, got 0"),  # the hidden alias: named as --help does
    (["generate", "CKPT", "--mem-len", "-1"], "--mem-len must be >= 0, got -1"),
    (["summarize", "CKPT", "doc.txt", "--mem-len", "-1"], "--mem-len must be >= 0, got -1"),
    (["plot", "CKPT", "--attention", "--text", "x", "--cmem-len", "-2"], "--cmem-len must be >= 0, got -2"),
    (["finetune", "--resume", "CKPT", "--tgt-len", "0"], "--tgt-len must be >= 1, got 0"),
    (["classify", "train", "CKPT", "--data", "d", "--out", "o", "--tgt-len", "0"], "--tgt-len must be >= 1, got 0"),
    # --seed: one range for every command
    (["generate", "CKPT", "--seed", "99999999999"], "--seed must be in [0, 2**32), got 99999999999"),
    (["summarize", "CKPT", "doc.txt", "--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    # output files: their folder must exist and take files (nothing is created for them)
    (["eval", "CKPT", "--json", "/proc/x.json"], "--json /proc/x.json: txl cannot create files in /proc ("),
    (["eval", "CKPT", "--json", "nowhere/dir/x.json"],
     "--json nowhere/dir/x.json: the folder nowhere/dir does not exist; create it first, or choose another file"),
    (["score", "CKPT", "doc.txt", "--out", "doc.txt/x.jsonl"],
     "--out doc.txt/x.jsonl: doc.txt is a file, not a folder; choose another place for the output"),
    (["bench", "--json", "nowhere/b.json"], "--json nowhere/b.json: the folder nowhere does not exist"),
    (["summarize", "CKPT", "doc.txt", "--out", "doc.txt/s.jsonl"], "--out doc.txt/s.jsonl: doc.txt is a file"),
    (["plot", "CKPT", "--out", "doc.txt/plots"], "--out doc.txt/plots/curves_steps.png: doc.txt is a file"),
    # --min-new-tokens beyond -n/--max-new-tokens
    (["generate", "CKPT", "-n", "5", "--min-new-tokens", "10"],
     "--min-new-tokens 10 is more than -n/--max-new-tokens 5, the most tokens drawn; lower --min-new-tokens or "
     "raise -n/--max-new-tokens"),
    (["summarize", "CKPT", "doc.txt", "-n", "3", "--min-new-tokens", "4"],
     "--min-new-tokens 4 is more than -n/--max-new-tokens 3"),
]


def test_every_command_has_an_early_check_case():
    commands = {prog for prog, parser in all_parsers().items() if parser.get_default("_run") is not None}
    covered = {prog for prog in commands for argv, _ in EARLY if argv[:len(prog.split()) - 1] == prog.split()[1:]}
    assert covered == commands, commands - covered


def test_every_command_checks_arguments_and_paths_before_importing_torch(tmp_path):
    (tmp_path / "CKPT").mkdir()
    (tmp_path / "doc.txt").write_text("a document")
    cases = [[str(tmp_path / "CKPT") if a == "CKPT" else a for a in argv] for argv, _ in EARLY]
    script = ("import json, sys\nfrom txl.cli import main\nrows = []\n"
              f"for argv in {cases!r}:\n"
              "    rc = main(argv)\n"
              "    rows.append([rc, 'torch' in sys.modules])\n"
              "print(json.dumps(rows))\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == len(EARLY), res.stderr
    for (argv, expect), (rc, torch_loaded), line in zip(EARLY, rows, lines):
        assert (rc, torch_loaded) == (2, False), (argv, line)
        assert line.startswith("txl: error: ") and expect in line, (argv, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CKPT", "doc.txt"]  # no folder made, no probe left
    assert not any((tmp_path / "CKPT").iterdir())


# --- optional dependencies are checked before any work -------------------------------------------------------

def _finetuned(folder, tokenizer=None):
    """A checkpoint folder of a (pretend) fine-tuned model: its tokenizer has the pair markers and its run
    config a [finetune] section."""
    tokenizer, _, _ = add_markers(tokenizer or ByteTokenizer())
    return _lm(folder, tokenizer, RunConfig(finetune=FinetuneConfig(init="lm")))


def _missing(monkeypatch, *modules):
    for name in modules:  # `import name` now fails and importlib.util.find_spec finds nothing
        monkeypatch.setitem(sys.modules, name, None)


def _no_loading(monkeypatch, module):
    def refuse(*args, **kwargs):
        raise AssertionError("loaded the checkpoint although an optional package is missing")

    monkeypatch.setattr(module, "load_checkpoint", refuse)


def test_summarize_rouge_without_rouge_score_fails_before_any_work(tmp_path, capsys, monkeypatch):
    import txl_recipes.summarize.command as summarize

    ckpt = _finetuned(tmp_path / "ft")
    (tmp_path / "docs.jsonl").write_text('{"prompt": "def f(): pass", "completion": "Nothing."}\n')
    _missing(monkeypatch, "rouge_score")
    _no_loading(monkeypatch, summarize)
    code, out, err = run_cli(capsys, "summarize", ckpt, tmp_path / "docs.jsonl", "--out", tmp_path / "s.jsonl",
                             "--rouge")
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert line.startswith("txl: error: ROUGE needs the rouge-score library: ") and "pip install" in line
    assert not (tmp_path / "s.jsonl").exists()


def test_serve_and_bench_check_their_optional_packages_before_loading(tmp_path, capsys, monkeypatch):
    import txl_recipes.serve.command as serve

    ckpt = _lm(tmp_path / "lm")
    _missing(monkeypatch, "fastapi", "transformers")
    _no_loading(monkeypatch, serve)
    code, out, err = run_cli(capsys, "serve", ckpt)
    line = one_error_line(err)
    assert code == 2 and line.startswith("txl: error: txl serve needs FastAPI and uvicorn: ") and "pip install" in line
    code, out, err = run_cli(capsys, "bench", "--vs", "hf", "--repeats", "1")
    assert code == 2 and "--vs hf needs transformers: pip install transformers" in one_error_line(err)
    assert out == ""


# --- fine-tuned checkpoints: summarize needs one, eval scores its pairs ---------------------------------------

def test_summarize_refuses_a_language_model_that_was_not_fine_tuned(tmp_path, capsys, monkeypatch):
    import txl_recipes.summarize.command as summarize

    lm = _lm(tmp_path / "lm")  # byte level: the markers are ids it has, but it never learnt them
    (tmp_path / "doc.txt").write_text("def f():\n    return 1\n")
    with monkeypatch.context() as m:
        _no_loading(m, summarize)  # refused from its run.json, before the weights are read
        code, out, err = run_cli(capsys, "summarize", lm, tmp_path / "doc.txt", "--out", tmp_path / "s.jsonl",
                                 "-n", "3")
    assert code == 2 and out == ""
    assert one_error_line(err) == (
        f"txl: error: {lm} is a language model that was not fine-tuned on prompt/completion pairs (its run.json "
        "has no [finetune] section), so its summaries would be noise; fine-tune it first: txl finetune --init "
        f"{lm} --data PAIRS.jsonl --out RUN, then txl summarize RUN ...")
    assert not (tmp_path / "s.jsonl").exists()
    # the same for a run directory of such a model (its run.json at the top) and a checkpoint without a run.json
    run = tmp_path / "run"
    run.mkdir()
    _lm(run / "best")
    (run / RUN_NAME).write_bytes((run / "best" / RUN_NAME).read_bytes())
    bare = _lm(tmp_path / "bare")
    (bare / RUN_NAME).unlink()
    (bare / CHECKSUMS_NAME).unlink()
    for folder in (run, bare):
        with monkeypatch.context() as m:
            _no_loading(m, summarize)
            code, out, err = run_cli(capsys, "summarize", folder, tmp_path / "doc.txt", "-n", "3")
        assert code == 2 and one_error_line(err).startswith(f"txl: error: {folder} is a language model that was not "
                                                            "fine-tuned on prompt/completion pairs")
    code, out, err = run_cli(capsys, "summarize", _finetuned(tmp_path / "ft"), tmp_path / "doc.txt", "-n", "3")
    assert code == 0 and json.loads(out)["source"] == str(tmp_path / "doc.txt")


@pytest.fixture(scope="module")
def finetuned_run(tmp_path_factory):
    """A real two-step fine-tuning run of a tiny byte model, and what it reported."""
    from txl.training.loop import finetune

    tmp = tmp_path_factory.mktemp("ft")
    lm = _lm(tmp / "lm")
    with open(tmp / "pairs.jsonl", "w") as f:
        for i in range(12):
            f.write(json.dumps({"prompt": f"item {i}: " + "abc " * (i + 3), "completion": f"done {i % 3}"}) + "\n")
    result = finetune(lm, tmp / "pairs.jsonl", out_dir=tmp / "run", progress=False, log=lambda m: None,
                      overrides=["train.max_steps=2", "train.batch_size=2", "train.eval_interval=2",
                                 "train.sample_tokens=0", "data.split=[0.5, 0.5, 0.0]"])
    return tmp / "run", result


def test_eval_of_a_fine_tuned_run_scores_its_pairs_completions(finetuned_run, capsys):
    run, result = finetuned_run
    code, out, err = run_cli(capsys, "eval", run, "--json", "-")
    assert code == 0, err
    got = json.loads(out)
    assert (got["metric"], got["unit"], got["examples"]) == ("completion", "bpb", 6)
    assert got["n_tokens"] == result.final.n_tokens  # the completion and END targets, not the JSON text
    assert got["value"] == pytest.approx(result.final.value, rel=1e-6)
    code, out, err = run_cli(capsys, "eval", run, "--json", "-", "--mem-len", "2")  # a span flag: read with it
    assert code == 0, err
    other = json.loads(out)
    assert (other["mem_len"], got["mem_len"], other["n_tokens"]) == (2, result.final.settings["mem_len"], got["n_tokens"])
    code, out, err = run_cli(capsys, "eval", run, "--warmup")
    assert code == 2 and one_error_line(err) == (
        f"txl: error: {run / 'best'} is fine-tuned on prompt/completion pairs: txl eval scores the completions of "
        "its valid pairs, and --warmup does not apply to that; leave it out, or pass --data FILE to evaluate text")


def test_recl_refuses_a_fine_tuned_runs_pairs_as_its_corpus(finetuned_run, capsys):
    run, _ = finetuned_run
    code, out, err = run_cli(capsys, "recl", run, "--start", "2", "--delta", "2", "--max-context", "4")
    assert code == 2 and one_error_line(err) == (
        f"txl: error: {run / 'best'} is fine-tuned on prompt/completion pairs, whose JSON Lines are no text corpus; "
        "pass --data FILE (its completion loss: txl eval)")


# --- text files that are not UTF-8: the one message every command gives ---------------------------------------

def test_summarize_reports_a_non_utf8_file_as_score_does(tmp_path, capsys):
    chars = CharTokenizer(sorted(set("abcdef \n")))
    ckpt = _finetuned(tmp_path / "ft", chars)
    (tmp_path / "doc.txt").write_bytes(b"abc \xff def")
    code, out, err = run_cli(capsys, "score", ckpt, tmp_path / "doc.txt")
    assert code == 2
    expect = (f"txl: error: {tmp_path / 'doc.txt'} is not UTF-8 text (invalid byte 0xff at byte offset 4); the char "
              "tokenizer needs UTF-8 text: use tokenizer=byte for arbitrary bytes")
    assert one_error_line(err) == expect
    code, out, err = run_cli(capsys, "summarize", ckpt, tmp_path / "doc.txt", "-n", "2")
    assert code == 2 and out == "" and one_error_line(err) == expect


def test_classify_predict_reports_a_non_utf8_file_the_same_way(tmp_path, capsys):
    chars = CharTokenizer(sorted(set("abcdef \n")))
    lm = _lm(tmp_path / "lm", chars)
    model = TransformerXLForSequenceClassification.from_pretrained_lm(lm, 2, labels=["no", "yes"])
    model.save_pretrained(tmp_path / "clf")
    (tmp_path / "doc.txt").write_bytes(b"ab\xfe")
    code, out, err = run_cli(capsys, "classify", "predict", tmp_path / "clf", tmp_path / "doc.txt")
    assert code == 2 and out == ""
    assert one_error_line(err) == (f"txl: error: {tmp_path / 'doc.txt'} is not UTF-8 text (invalid byte 0xfe at byte "
                                   "offset 2); the char tokenizer needs UTF-8 text: use tokenizer=byte for arbitrary "
                                   "bytes")
    (tmp_path / "good.txt").write_text("abc")
    code, out, err = run_cli(capsys, "classify", "predict", tmp_path / "clf", tmp_path / "good.txt")
    assert code == 0 and json.loads(out)["label"] in ("no", "yes")


def test_a_byte_model_still_reads_any_bytes(tmp_path):
    from txl.data.tokenizers import decode_file_text

    raw = b"abc \xff\xfe def"
    assert ByteTokenizer().encode(decode_file_text(raw, "byte", "x")).tolist() == list(raw)


# --- --seed: one range for every command (issue 23, red team B5) ---------------------------------------------

def _argv_for(prog: str, parser) -> list[str]:
    """The words of ``prog`` after ``txl``, with its required positionals and options given (``X``)."""
    argv = prog.split()[1:]
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*") and action.dest != "help":
            argv.append("X")
        elif action.option_strings and action.required:
            argv += [action.option_strings[-1], "X"]
    return argv


SEEDED = {prog: parser for prog, parser in all_parsers().items()
          if any(a.dest == "seed" for a in parser._actions)}


def test_the_seed_check_covers_every_command_with_a_seed():
    assert set(SEEDED) == {"txl train", "txl finetune", "txl eval", "txl generate", "txl summarize",
                           "txl data docstrings", "txl data packages", "txl classify train"}


@pytest.mark.parametrize("prog", sorted(SEEDED))
def test_every_seed_has_the_one_range_checked_first(prog, capsys, tmp_path, monkeypatch):
    """The report: train refused 2**32, generate took 99999999999. Both ends, every command."""
    monkeypatch.chdir(tmp_path)
    for seed in (2**32, 99999999999, -1):
        code, out, err = run_cli(capsys, *_argv_for(prog, SEEDED[prog]), "--seed", str(seed))
        assert code == 2 and one_error_line(err) == f"txl: error: --seed must be in [0, 2**32), got {seed}"
    assert list(tmp_path.iterdir()) == []


def test_the_seed_bound_is_what_torch_numpy_and_the_config_accept():
    import numpy as np

    from txl.config import SEED_LIMIT, TrainConfig, check_seed

    check_seed(SEED_LIMIT - 1, "--seed")  # the largest seed passes, and every seeder takes it
    np.random.seed(SEED_LIMIT - 1)
    torch.manual_seed(SEED_LIMIT - 1)
    with pytest.raises(ValueError):
        np.random.seed(SEED_LIMIT)  # one more is what numpy refuses: the bound is not arbitrary
    with pytest.raises(TxlError, match=r"^train\.seed must be in \[0, 2\*\*32\), got 4294967296$"):
        TrainConfig(seed=SEED_LIMIT).check()


# --- output files: checked before any work; a failed write names the user's path (B4) -----------------------

def test_a_failed_write_names_the_users_path_never_the_temporary_file(tmp_path):
    import errno
    from pathlib import Path

    from txl.fileio import atomic_write

    target = tmp_path / "x.json"

    def disk_full(tmp):
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", tmp)

    with pytest.raises(OSError) as err:
        atomic_write(target, disk_full)
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(target))
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone, nothing at the target
    with pytest.raises(OSError) as err:  # a folder that vanished: not created again for a user's file
        atomic_write(tmp_path / "gone" / "x.json", lambda tmp: None, make_parents=False)
    assert err.value.filename == str(tmp_path / "gone" / "x.json") and not (tmp_path / "gone").exists()


def test_eval_json_and_score_out_fail_on_their_folder_before_loading(tmp_path, capsys, monkeypatch):
    import txl.cli.common as common

    ckpt = _lm(tmp_path / "lm")
    (tmp_path / "doc.txt").write_text("some text to read")
    (tmp_path / "afile").write_text("a file")
    monkeypatch.setattr(common, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the checkpoint first"))
    for argv, expect in (
            (["eval", ckpt, "--json", "/proc/x.json", "-q"], "txl: error: --json /proc/x.json: txl cannot create "
                                                             "files in /proc ("),
            (["eval", ckpt, "--json", tmp_path / "nonexistent" / "dir" / "x.json"],
             f"txl: error: --json {tmp_path / 'nonexistent' / 'dir' / 'x.json'}: the folder "
             f"{tmp_path / 'nonexistent' / 'dir'} does not exist; create it first, or choose another file (txl creates "
             "no folder for an output file)"),
            (["score", ckpt, tmp_path / "doc.txt", "--out", tmp_path / "afile" / "x.jsonl"],
             f"txl: error: --out {tmp_path / 'afile' / 'x.jsonl'}: {tmp_path / 'afile'} is a file, not a folder; "
             "choose another place for the output"),
            (["eval", ckpt, "--data", tmp_path / "doc.txt", "--sweep-mem", "0,4", "--plot", tmp_path / "no" / "m.png"],
             f"txl: error: --plot {tmp_path / 'no' / 'm.png'}: the folder {tmp_path / 'no'} does not exist")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and one_error_line(err).startswith(expect), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "doc.txt", "lm"]


def test_a_write_that_fails_at_the_end_names_the_users_file(tmp_path, capsys, monkeypatch):
    import errno
    import os

    ckpt = _lm(tmp_path / "lm")
    (tmp_path / "doc.txt").write_text("some text to read")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    code, out, err = run_cli(capsys, "score", ckpt, tmp_path / "doc.txt", "--out", tmp_path / "s.jsonl")
    assert code == 1 and err.strip().splitlines()[-1] == f"txl: error: No space left on device ({tmp_path / 's.jsonl'})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt", "lm"]


def test_plot_still_makes_its_out_folder(tmp_path):
    from txl.fileio import check_output_path

    check_output_path(tmp_path / "new" / "deeper" / "a.png", makes_folder=True)  # a folder the command makes
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TxlError, match="afile is a file, not a folder"):
        check_output_path(tmp_path / "afile" / "deeper" / "a.png", makes_folder=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# --- generate --input: unknown keys refused, every per-line error names FILE line N (B7) ----------------------

def test_generate_input_refuses_unknown_keys_naming_file_line_and_key(tmp_path, capsys, monkeypatch):
    import txl.cli.generate as generate

    ckpt = _lm(tmp_path / "lm")
    prompts = tmp_path / "p.jsonl"
    monkeypatch.setattr(generate, "load_checkpoint", lambda *a, **k: pytest.fail("loaded before the lines were read"))
    for lines, expect in (
            (['{"prompt": "ROMEO:", "bogus": 1}'], "line 1: unknown key(s) 'bogus'; known keys: prompt"),
            (['{"prompt": "ROMEO:"}', '{"prompt": "ROMEO:", "max_new_tokens": "x"}'],
             "line 2: unknown key(s) 'max_new_tokens'; known keys: prompt")):
        prompts.write_text("\n".join(lines) + "\n")
        code, out, err = run_cli(capsys, "generate", ckpt, "--input", prompts)
        assert code == 2 and out == ""
        assert one_error_line(err) == (f"txl: error: {prompts} {expect} (the decoding settings are flags, the same "
                                       "for every prompt: -n/--max-new-tokens, ...)")


def test_generate_input_and_summarize_name_the_line_of_a_prompt_they_cannot_encode(tmp_path, capsys):
    chars = CharTokenizer(sorted(set("abcdef \n")))
    lm = _lm(tmp_path / "lm", chars)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abc"}\n\n{"prompt": "abZ"}\n')
    code, out, err = run_cli(capsys, "generate", lm, "--input", prompts, "-n", "2")
    assert code == 2 and out == ""
    assert one_error_line(err) == (f"txl: error: {prompts} line 3: text contains 1 character not in the char "
                                   "vocabulary (1 distinct; first 'Z' at character 2); build the vocabulary from text "
                                   "that includes them, or use tokenizer=byte")
    # the sibling: summarize's JSON Lines documents say FILE line N too (their other keys are data: kept)
    ft = _finetuned(tmp_path / "ft", chars)
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"prompt": "abc", "module": "m"}\n{"prompt": "abYY", "kind": "function"}\n')
    code, out, err = run_cli(capsys, "summarize", ft, docs, "-n", "2")
    assert code == 2 and out == ""
    assert one_error_line(err).startswith(f"txl: error: {docs} line 2: the prompt: text contains 2 characters not in "
                                          "the char vocabulary (1 distinct; first 'Y' at character 2)")
    docs.write_text('{"prompt": "abc", "module": "m"}\n["abc"]\n')
    code, out, err = run_cli(capsys, "summarize", ft, docs, "-n", "2")
    assert code == 2 and one_error_line(err) == (f'txl: error: {docs} line 2 must be a JSON object with a "prompt" '
                                                 '(or "text") string, got an array')


# --- word models: what generate prints is decode(prompt + sample) (B8) ----------------------------------------

def _word_lm(folder):
    from txl.data import WordTokenizer

    return _lm(folder, WordTokenizer(["<unk>", "<eos>", "the", "king", "pursuit.", "caitiff"]))


def test_generate_of_a_word_model_prints_the_decoded_prompt_and_sample(tmp_path, capsys, monkeypatch):
    """The report: `--prompt "the king"` printed "the kingpursuit. caitiff": the prompt's <eos> was lost."""
    import txl.generation

    lm = _word_lm(tmp_path / "word")
    from txl.training.checkpoint import load_checkpoint

    tok = load_checkpoint(lm).tokenizer
    sample = [4, 5, 1, 2]  # pursuit. caitiff <eos> the

    def fake_steps(model, ids, n, **kw):
        for i in sample[:n]:
            yield txl.generation.GenerationStep(torch.tensor([i]), torch.zeros(1, tok.vocab_size))

    monkeypatch.setattr(txl.generation, "generate_steps", fake_steps)
    for prompt in ("the king", "the KING"):  # the sibling: an unknown word is printed as the model read it
        code, out, err = run_cli(capsys, "generate", lm, "--prompt", prompt, "-n", "4", "--seed", "1")
        assert code == 0, err
        assert out == tok.decode([*tok.encode(prompt).tolist(), *sample]) + "\n"
    assert out == "the <unk>\npursuit. caitiff\nthe\n"

    def fake_beams(model, tokenizer, ids, **kw):  # the beam path prints what the stream would
        return [tokenizer.decode(sample[:2])]

    monkeypatch.setattr(txl.generation, "continue_texts", fake_beams)
    code, out, err = run_cli(capsys, "generate", lm, "--prompt", "the king", "-n", "2", "--num-beams", "2")
    assert code == 0 and out == "the king\npursuit. caitiff\n"


# --- usage errors name the command's help (B9) -----------------------------------------------------------------

def test_unknown_arguments_point_to_the_commands_own_help(tmp_path, capsys):
    for argv, prog, extra in ((["eval", tmp_path, "extra"], "txl eval", "extra"),
                              (["serve", tmp_path, "--bogus"], "txl serve", "--bogus"),
                              (["classify", "train", tmp_path, "--data", "d", "--out", "o", "--bogus"],
                               "txl classify train", "--bogus")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and one_error_line(err) == f"txl: error: unrecognized arguments: {extra} (see: {prog} --help)"
    code, out, err = run_cli(capsys, "--bogus")  # before any command: the root's help
    assert code == 2 and one_error_line(err).endswith("(see: txl --help)")


# --- counts in messages take the noun's number (B11) ------------------------------------------------------------

def test_counts_in_messages_are_singular_for_one(tmp_path, capsys):
    from txl.errors import counted

    chars = CharTokenizer(["a", "b"])
    for text, expect in (("az", "text contains 1 character not in the char vocabulary (1 distinct; first 'z' at "
                                "character 1)"),
                         ("azy", "text contains 2 characters not in the char vocabulary (2 distinct;")):
        with pytest.raises(TxlError) as err:
            chars.encode(text)
        assert str(err.value).startswith(expect)
    assert (counted(1, "run"), counted(0, "run"), counted(13733, "token"), counted(2, "entry", "entries")) == \
        ("1 run", "0 runs", "13,733 tokens", "2 entries")
    code, out, err = run_cli(capsys, "plot", tmp_path / "a", tmp_path / "b", "--labels", "x")  # the sibling
    assert code == 2 and one_error_line(err) == "txl: error: --labels gives 1 label for 2 runs"


def test_summarize_writes_whether_each_summary_ended_at_the_end_marker(tmp_path, capsys, monkeypatch):
    import txl.generation as generation

    ckpt = _finetuned(tmp_path / "ft")
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"prompt": "def f():\\n    return 1\\n", "completion": "Return one."}\n'
                    '{"prompt": "def g():\\n    return 2\\n", "completion": "Return two."}\n')

    def fake_complete(model, tokenizer, prompts, *, ended, **settings):  # the first ends, the second runs out
        ended += [True, False]
        return ["Return one.", "Return two two two"]

    monkeypatch.setattr(generation, "complete", fake_complete)
    code, out, err = run_cli(capsys, "summarize", ckpt, docs, "--out", tmp_path / "s.jsonl", "-n", "4")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [(r["summary"], r["ended"], r["reference"]) for r in rows] == [
        ("Return one.", True, "Return one."), ("Return two two two", False, "Return two.")]
