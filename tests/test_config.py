"""Run configuration: TOML files, overrides, validation."""

from pathlib import Path

import pytest

from conftest import ROOT

from txl.config import RunConfig, load_run_config, parse_override
from txl_recipes.classify.config import ClassifyTrainConfig
from txl.errors import TxlError

CONFIGS = ROOT / "configs"


def test_default_toml_is_the_built_in_default():
    assert load_run_config(CONFIGS / "default.toml") == RunConfig()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    import tomllib

    tables = tomllib.loads(path.read_text(encoding="utf-8"))
    if "classify" in tables:  # a txl classify train --config file: every key resolves, nothing left unset
        import argparse

        from txl_recipes.classify.command import TRAIN_SETTINGS, resolve_settings

        args = argparse.Namespace(config=str(path), **dict.fromkeys(TRAIN_SETTINGS))
        resolve_settings(args)
        assert all(getattr(args, key) == value for key, value in tables["classify"].items())
        ClassifyTrainConfig(**{key: getattr(args, key) for key in TRAIN_SETTINGS}).check()
        return
    finetuning = "finetune" in tables  # its language model comes from --init
    load_run_config(path, ["finetune.init=runs/some-lm"] if finetuning else []).check()


@pytest.mark.parametrize("change, message", [
    ({"steps": 0}, "steps must be >= 1, got 0"), ({"mem_len": -1}, "mem_len must be >= 0, got -1"),
    ({"lr": 0.0}, "lr must be a finite number > 0, got 0"), ({"lr": float("inf")}, "lr must be a finite number > 0"),
    ({"seed": 2**32}, "seed must be in [0, 2**32), got 4294967296"), ({"dropout": 1.0}, "dropout must be in [0, 1), got 1"),
    ({"valid_fraction": 1.0}, "valid_fraction must be in (0, 1), got 1"),
    ({"pooling": "max"}, "pooling must be one of document, attention, last, mean, got 'max'"),
    ({"mode": "middle"}, "mode must be one of memory, first, last, got 'middle'"),
])
def test_classify_settings_are_checked_by_one_rule_named_as_the_caller_says(change, message):
    assert ClassifyTrainConfig().check() == ClassifyTrainConfig()  # the defaults pass; None: decided later
    with pytest.raises(TxlError) as caught:
        ClassifyTrainConfig(**change).check()
    assert str(caught.value) == message or str(caught.value).startswith(message)
    with pytest.raises(TxlError, match=r"^--X must be"):  # a command names the flag (or the file's key)
        ClassifyTrainConfig(**change).check(lambda field: "--X")


def test_overrides_parse_toml_literals_and_bare_keys():
    run = load_run_config(None, ["n_layer=2", "train.lr=3e-4", "tgt_len_schedule=[[0, 16], [10, 32, 64]]",
                                 "model.same_length=true", "data.path=2024", "eval.mem_len=1600"])
    assert run.model.n_layer == 2 and run.train.lr == 3e-4 and run.model.same_length is True
    assert run.train.tgt_len_schedule == [[0, 16], [10, 32, 64]]
    assert run.data.path == "2024"  # string fields keep the text
    assert run.eval.mem_len == 1600


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nn_layer = 3\n[train]\nmax_steps = 5\n')
    run = load_run_config(path, ["max_steps=7"])
    assert run.model.n_layer == 3 and run.train.max_steps == 7


@pytest.mark.parametrize("override,match", [
    ("mem_len=5", "sections model, eval"), ("nope=1", "unknown config key"), ("model.nope=1", "unknown key"),
    ("foo.n_layer=1", "unknown config section"), ("n_layer", "key=value"), ("n_layer=two", "integer"),
    ("tgt_len_schedule=[[5, 8], [2, 16]]", "increase"), ("tokenizer=unigram", "data.tokenizer"), ("normalize=moses", "data.normalize"),
    ("data.split=[0.5, 0.5, 0.5]", "summing to 1"), ("dtype=float8", "train.dtype"), ("eval.split=train", "eval.split"),
    ("min_lr=1.0", "min_lr")])
def test_bad_overrides(override, match):
    with pytest.raises(TxlError, match=match):
        load_run_config(None, [override])


def test_unknown_section_and_key_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nlr = 1\n")
    with pytest.raises(TxlError, match="unknown config section"):
        load_run_config(path)
    path.write_text("[train]\nlearning_rate = 1\n")
    with pytest.raises(TxlError, match="unknown key.*learning_rate"):
        load_run_config(path)


def test_parse_override_reports_section():
    assert parse_override("d_model=128") == ("model", "d_model", 128)


# parameter counts of the paper's models, built on the meta device (no memory is allocated)
PAPER_PARAMS = {  # config: (txl's count, the paper's, tolerance)
    "enwik8-base.toml": (41.08e6, 41e6, 0.01),     # 256 byte symbols; the authors count 204 -> 41.06M
    "enwik8-large.toml": (277.29e6, 277e6, 0.01),
    "text8-large.toml": (277.05e6, 277e6, 0.01),
    "wt103-base.toml": (151.11e6, 151e6, 0.01),
    "wt103-large.toml": (285.17e6, 257e6, 0.12),   # the paper's table says 257M (docs/model.md)
    "lm1b-large.toml": (840.76e6, 0.8e9, 0.06),    # "0.8B" in the paper
}
VOCAB = {"enwik8": 256, "text8": 27, "wt103": 267735, "lm1b": 793470}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS))
def test_paper_configs_have_the_papers_parameter_count(name):
    import dataclasses

    import torch

    from txl.model import TransformerXLLM

    run = load_run_config(CONFIGS / name)
    config = dataclasses.replace(run.model, vocab_size=VOCAB[name.split("-")[0]])
    with torch.device("meta"):
        model = TransformerXLLM(config)
    count = sum(p.numel() for p in model.parameters())
    ours, paper, tol = PAPER_PARAMS[name]
    assert count == pytest.approx(ours, rel=1e-4)
    assert count == pytest.approx(paper, rel=tol)
    assert run.eval.mem_len is not None and run.eval.mem_len >= run.model.mem_len  # evaluation settings given


def test_one_ignore_index():
    """IGNORE_INDEX is defined once (txl.config.fields) and no other module writes -100 in code."""
    import io
    import tokenize

    import txl
    import txl.config
    import txl.data
    import txl.evaluation.stream
    import txl.model.adaptive

    assert txl.config.IGNORE_INDEX == -100
    assert txl.data.IGNORE_INDEX is txl.model.adaptive.IGNORE_INDEX is txl.evaluation.stream.IGNORE_INDEX
    found = []
    for path in Path(txl.__file__).parent.rglob("*.py"):
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
        for a, b in zip(tokens, tokens[1:]):
            if a.type == tokenize.OP and a.string == "-" and b.type == tokenize.NUMBER and b.string == "100":
                found.append(f"{path.relative_to(Path(txl.__file__).parent)}:{a.start[0]}")
    assert len(found) == 1 and found[0].startswith("config/fields.py:"), found


def test_the_config_knows_every_position_scheme_the_model_computes():
    """config.ATTN_TYPES (what a config accepts) and model.positions.SCHEMES (what the model computes) name
    the same schemes; the config's parameter count bounds each scheme's real one; only "abs" keeps no memory."""
    from txl.config import ATTN_TYPES, WITHOUT_MEMORY, TransformerXLConfig, position_parameters
    from txl.model import TransformerXLLM
    from txl.model.positions import SCHEMES

    assert tuple(SCHEMES) == ATTN_TYPES and WITHOUT_MEMORY == ("abs",)
    for attn_type in ATTN_TYPES:
        config = TransformerXLConfig(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=4,
                                     mem_len=4, attn_type=attn_type, shaw_max_dist=7, untie_r=True)
        model = TransformerXLLM(config)
        own = {id(p): p.numel() for layer in model.layers for p in layer.attn.pos.parameters()}  # (tied u/v once)
        assert sum(own.values()) <= config.n_layer * position_parameters(config), attn_type
        assert (attn_type in ("rel", "shaw")) == (position_parameters(config) > 0)
        assert sum(p.numel() for p in model.parameters()) <= config.parameter_count(), attn_type
        assert config.has_memory == (attn_type != "abs")


@pytest.mark.parametrize("first", ["txl.runtime", "txl.fileio", "txl.config.fields", "txl.config.run", "txl.errors",
                                   "txl.distributed"])
def test_the_bottom_floor_imports_in_any_order(first):
    """runtime and fileio read constants from txl.config, whose run and model configs use runtime and fileio
    inside functions: whichever is imported first in a fresh interpreter, the others import after it."""
    import subprocess
    import sys

    code = f"import {first}; import txl.config, txl.runtime, txl.fileio, txl.model"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_data_workers_is_a_count_of_processes():
    from txl.config import DataConfig

    DataConfig(workers=2).check()
    for bad in (0, 257):
        with pytest.raises(TxlError, match=rf"data.workers must be from 1 to 256, got {bad}"):
            DataConfig(workers=bad).check()
