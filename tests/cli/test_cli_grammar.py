"""The command-line grammar: one registry, one meaning per short flag, hyphenated flags with hidden
underscore aliases, and a description plus an example in every ``--help``."""

import argparse
import re
import subprocess
import sys

import pytest

from txl.cli import all_parsers, build_parser, main

PARSERS = all_parsers()
COMMANDS = sorted(prog[len("txl "):] for prog in PARSERS if prog != "txl")


def parse(*argv):
    """Parse ``argv`` as the command line does (train keeps unknown KEY=VALUE items)."""
    args, _ = build_parser().parse_known_args([str(a) for a in argv])
    return args


def test_every_command_is_registered():
    assert {"train", "eval", "generate", "score", "bench", "convert", "convert hf", "convert to-hf", "data",
            "data prepare", "classify", "classify train", "classify predict", "plot", "recl", "ablate"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_a_description_and_an_example(command, capsys):
    assert main([*command.split(), "--help"]) == 0
    out = capsys.readouterr().out
    parser = PARSERS[f"txl {command}"]
    assert parser.description and "Example:" in out
    example = out.split("Example:", 1)[1].strip().splitlines()[0]
    assert example.startswith(f"txl {command.split()[0]}")
    assert not re.search(r"--[a-z]+_[a-z_]+", out), "an underscore spelling leaked into --help"


def test_each_short_flag_has_one_meaning():
    meanings: dict[str, set[str]] = {}
    for prog, parser in PARSERS.items():
        for action in parser._actions:
            shorts = [s for s in action.option_strings if not s.startswith("--")]
            longs = [s for s in action.option_strings if s.startswith("--")]
            for short in shorts:
                meanings.setdefault(short, set()).add(longs[0] if longs else short)
    shared = {short: names for short, names in meanings.items() if short != "-h" and len(names) > 1}
    assert not shared, f"short flags with more than one meaning: {shared}"
    assert meanings["-c"] == {"--config"} and meanings["-o"] == {"--out"}


def test_long_flags_are_hyphenated():
    for prog, parser in PARSERS.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # the hidden older spellings
            for name in action.option_strings:
                assert "_" not in name, f"{prog}: {name}"


@pytest.mark.parametrize("old,new", [("--tgt_len", "--tgt-len"), ("--mem_len", "--mem-len"),
                                     ("--clamp_len", "--clamp-len"), ("--batch_size", "--batch-size"),
                                     ("--max_tokens", "--max-tokens")])
def test_underscore_spellings_are_hidden_aliases(old, new, capsys):
    dest = new[2:].replace("-", "_")
    assert getattr(parse("eval", "ckpt", old, "7"), dest) == getattr(parse("eval", "ckpt", new, "7"), dest) == 7
    assert parse("eval", "ckpt").__dict__[dest] is None  # the alias does not change the default
    main(["eval", "--help"])
    out = capsys.readouterr().out
    assert new in out and old not in out


def test_same_length_both_spellings():
    assert parse("score", "ckpt", "f", "--same_length").same_length is True
    assert parse("score", "ckpt", "f", "--no-same-length").same_length is False
    assert parse("score", "ckpt", "f").same_length is None


def test_shared_flags_are_offered_where_they_make_sense():
    def flags(command):
        return {s for a in PARSERS[f"txl {command}"]._actions for s in a.option_strings}

    for command in ("eval", "generate", "score", "recl", "bench", "plot", "classify train", "classify predict"):
        assert "--device" in flags(command), command
    for command in ("eval", "generate", "score", "recl", "bench", "train"):
        assert "--dtype" in flags(command), command
    for command in ("eval", "generate", "train", "classify train"):
        assert "--seed" in flags(command), command
    for command in ("eval", "bench", "recl"):
        assert "--json" in flags(command), command
    for command in ("train", "eval", "recl", "ablate", "classify train", "plot"):
        assert "--data" in flags(command), command
    for command in ("eval", "score"):
        assert {"--tgt-len", "--mem-len", "--clamp-len", "--same-length", "--no-same-length"} <= flags(command)


def test_checkpoint_is_positional_and_old_options_still_work():
    assert parse("score", "ckpt", "a.txt").checkpoint == "ckpt"
    from txl.cli.common import checkpoint_arg

    args = parse("score", "--checkpoint", "ckpt", "a.txt", "b.txt")
    assert checkpoint_arg(args, rest="files") == "ckpt" and args.files == ["a.txt", "b.txt"]
    args = parse("classify", "train", "--checkpoint", "lm", "--data", "d", "--out", "o")
    assert checkpoint_arg(args) == "lm"
    args = parse("classify", "train", "lm", "--data", "d", "--out", "o", "--warmup", "3")
    assert checkpoint_arg(args) == "lm" and args.warmup_steps == 3
    assert parse("bench", "--batch", "4").batch_size == 4
    args = parse("plot", "--attention", "ckpt", "--text-file", "t.txt")
    assert args.attention and args.runs == ["ckpt"] and args.data == "t.txt"
    assert parse("score", "ckpt", "a.txt", "--output", "x").out == "x"


def test_json_takes_a_file_or_dash():
    from txl.cli.eval import _checkpoint

    assert parse("eval", "ckpt", "--json").json == "-"  # the older switch
    assert parse("eval", "ckpt", "--json", "r.json").json == "r.json"
    args = parse("eval", "--json", "ckpt")  # the older `--json` before the checkpoint
    _checkpoint(args)
    assert (args.checkpoint, args.json) == ("ckpt", "-")
    assert parse("bench", "--json", "-").json == "-"


def test_usage_errors_are_one_line_without_torch():
    code = ("import sys; from txl.cli import main; rc = main(['eval', '--tgt-len', 'x']); "
            "sys.exit(10 + rc if 'torch' in sys.modules else rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("txl: error: ") and len(res.stderr.strip().splitlines()) == 1


def test_ablate_checks_matplotlib_before_training(monkeypatch, capsys, tmp_path):
    import txl_studies.ablation.table as ablation

    def no_training(*args, **kwargs):
        raise AssertionError("trained although matplotlib is missing")

    monkeypatch.setattr(ablation, "run_ablation", no_training)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    monkeypatch.delitem(sys.modules, "matplotlib.pyplot", raising=False)
    assert main(["ablate", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: ") and "pip install" in err and len(err.strip().splitlines()) == 1


def test_list_positionals_may_continue_after_an_option(capsys):
    # argparse hands back the files after an option; main() appends them to the command's list
    args, extra = build_parser().parse_known_args(["score", "ckpt", "a.txt", "--out", "o", "b.txt"])
    assert (args.checkpoint, args.files, args._more, extra) == ("ckpt", ["a.txt"], "files", ["b.txt"])
    assert main(["plot", "--out", "x", "--bogus"]) == 2  # options are never swallowed
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def _documented_commands(cell: str) -> set[str]:
    """The commands a docs/cli.md table cell names: ``train and finetune (train.seed), eval, classify
    train/predict`` -> {train, finetune, eval, classify train, classify predict}."""
    cell = re.sub(r"\([^)]*\)", "", cell.split(":")[-1])
    names = {name.strip() for part in cell.split(",") for name in part.split(" and ")}
    return {expanded for name in names if name for expanded in
            ([f"classify {sub}" for sub in ("train", "predict")] if name == "classify train/predict" else [name])}


def test_flag_tables_of_the_cli_page_name_every_command_that_takes_the_flag():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    tables = (page.split("**One meaning per short flag**")[1].split("**The checkpoint is always positional**")[0]
              + page.split("## Shared flags")[1].split("## Other spellings accepted")[0])
    checked = set()
    for line in tables.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not cells or not cells[0].startswith("`-"):
            continue  # not a row of a flag
        flag = re.match(r"`(-[-a-z]+)", cells[0]).group(1)
        offered = {prog[len("txl "):] for prog, parser in PARSERS.items() if prog != "txl"
                   for action in parser._actions if flag in action.option_strings and action.help != argparse.SUPPRESS}
        assert _documented_commands(cells[-1]) == offered, f"docs/cli.md's row of {flag}"
        checked.add(flag)
    assert {"-c", "-o", "-q", "-n", "--device", "--threads", "--mem-len", "--seed", "--json", "--force"} <= checked


def test_a_setting_is_given_once(capsys, tmp_path, monkeypatch):
    """An option that takes one value, given twice, and a setting given by a flag and by KEY=VALUE, are
    refused in one line before anything is read, instead of one silently winning."""
    monkeypatch.chdir(tmp_path)  # (relative outputs would land here)
    corpus = tmp_path / "small.txt"
    corpus.write_text("some text\n" * 50)
    cases = [
        (["train", corpus, "--config", "a.toml", "--config", "b.toml"],
         "--config is given twice ('a.toml' and 'b.toml'); give it once (see: txl train --help)"),
        (["eval", "ckpt", "--mem-len", "3", "--mem_len", "4"], "--mem_len is given twice (3 and 4); give it once"),
        (["train", corpus, f"data.path={tmp_path}"], f"give data.path once: DATA {corpus} or data.path={tmp_path}"),
        (["train", corpus, "--out", "x", "train.out_dir=y"], "give train.out_dir once: -o/--out x or train.out_dir=y"),
        (["train", corpus, "--tokenizer", "char", "data.tokenizer=byte"],
         "give data.tokenizer once: --tokenizer char or data.tokenizer=byte"),
        (["train", corpus, "--seed", "7", "seed=8"], "give train.seed once: --seed 7 or seed=8"),
        (["finetune", "--init", "lm", "--data", "p.jsonl", "--out", "o", "--mem-len", "3", "model.mem_len=4"],
         "give model.mem_len once: --mem-len 3 or model.mem_len=4"),
        (["train", corpus, "--out", ""], "-o/--out must name a folder, got an empty name"),
        (["train", corpus, "train.out_dir="], "train.out_dir must name a folder, got an empty name"),
    ]
    for argv, message in cases:
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, (argv, err)
    assert not (tmp_path / "runs").exists() and not any(p.is_dir() for p in tmp_path.iterdir())
