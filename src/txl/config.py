"""Run configuration: model, data, training and evaluation sections, loaded from TOML plus overrides.

A run config file looks like::

    [model]
    n_layer = 4
    [data]
    path = "corpus.txt"
    tokenizer = "char"
    [train]
    max_steps = 2000
    [eval]
    mem_len = 512

Command-line overrides are ``section.key=value`` (or a bare ``key=value`` when only one section has
that key); values are parsed as TOML literals (``3``, ``1e-3``, ``true``, ``[[0, 64], [500, 128]]``),
anything else is taken as a string. Unknown keys and wrong types are errors.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txl.errors import TxlError
from txl.model.config import TransformerXLConfig, check_fields

TOKENIZERS = ("byte", "char", "word", "bpe")
NORMALIZE = ("none", "wikitext")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class DataConfig:
    """Where the text comes from and how it is tokenised.

    Attributes:
        path: a text file or a directory of files (all files matching ``pattern``, sorted); None means
            the built-in default corpus (this Python's standard-library ``*.py`` modules).
        tokenizer: "byte" (vocab 256), "char" (vocab from the corpus), "word" (WikiText style) or
            "bpe" (byte-level BPE trained on the train split, ``max_size`` tokens); None means the
            tokenizer a prepared dataset folder recommends (its ``dataset.json``), else "byte".
        train, valid, test: separate split files; when given, ``path`` and ``split`` are not used.
        split: train/valid/test fractions of one corpus (contiguous, in order).
        pattern: glob for files inside a directory ``path``.
        min_freq, max_size, lower: word vocabulary options (``max_size`` is the BPE vocabulary size).
        normalize: "none", or "wikitext" to tokenise raw text the WikiText way (``1 @,@ 000``) first.
        cache_dir: where encoded corpora are cached (None: ``~/.cache/txl``).
    """

    path: str | None = None
    tokenizer: str | None = None
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    split: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])
    pattern: str = "*"
    min_freq: int = 1
    max_size: int | None = None
    lower: bool = False
    normalize: str = "none"
    cache_dir: str | None = None

    def validate(self) -> None:
        if self.normalize not in NORMALIZE:
            raise TxlError(f"data.normalize must be one of {', '.join(NORMALIZE)}, got {self.normalize!r}")
        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise TxlError(f"data.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if len(self.split) != 3 or any(f < 0 for f in self.split) or abs(sum(self.split) - 1) > 1e-6:
            raise TxlError(f"data.split must be three non-negative fractions summing to 1, got {self.split}")
        if self.min_freq < 1:
            raise TxlError(f"data.min_freq must be >= 1, got {self.min_freq}")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a training run.

    Attributes:
        out_dir: run directory (config, metrics.csv, ``best/`` and ``last/`` checkpoints).
        batch_size: parallel streams per step (the global batch: split over torchrun ranks).
        grad_accum_steps: each rank's streams are run in this many pieces per step, gradients
            accumulated (the reference's ``batch_chunk``): same update, less activation memory.
        max_steps: optimizer steps.
        lr, min_lr: peak and final learning rate (AdamW; linear warm-up then cosine decay).
        warmup_steps: steps of linear warm-up from 0 to ``lr``.
        weight_decay: AdamW decoupled weight decay on matrices (not on biases, gains, u/v).
        clip: max global gradient norm (0 disables).
        tgt_len_schedule: progressive segment length, ``[[step, tgt_len], ...]`` or
            ``[[step, tgt_len, mem_len], ...]``; from each step on that length is used; with pairs,
            mem_len follows tgt_len. Empty: ``model.tgt_len``/``model.mem_len`` throughout.
        varlen: variable-length segments around tgt_len (reference's varlen iterator).
        eval_interval: steps between validations (with memory, at the training span).
        eval_max_tokens: tokens of the valid split used by periodic validation (0: all).
        log_interval: steps between metric rows.
        seed: seeds python, numpy and torch.
        device: "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
        dtype: "float32", or "bfloat16"/"float16" autocast.
        max_bad_steps: a step whose loss is NaN or inf is skipped (no update, fresh memory) and
            counted; this many in a row stop the run with a message.
        sample_tokens: tokens sampled at the end of training (0: none).
        sample_prompt: prompt for that sample ("": the first tokens of the valid split).
        save_interval: steps between ``last/`` checkpoints (0: at each validation only; every
            validation also writes one).
        keep_last: ``last`` checkpoints kept (``last/``, then ``last.<step>/``): a corrupt newest one
            falls back to the one before.
        deterministic: ``torch.use_deterministic_algorithms(True)`` (bit-identical reruns on GPU too,
            at some speed cost; CPU runs are deterministic anyway).
    """

    out_dir: str = "runs/default"
    batch_size: int = 16
    max_steps: int = 700
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 50
    weight_decay: float = 0.0
    clip: float = 0.25
    tgt_len_schedule: list[list[int]] = field(default_factory=list)
    varlen: bool = False
    eval_interval: int = 100
    eval_max_tokens: int = 32768
    log_interval: int = 10
    seed: int = 1234
    device: str = "auto"
    dtype: str = "float32"
    max_bad_steps: int = 10
    sample_tokens: int = 300
    sample_prompt: str = ""
    grad_accum_steps: int = 1
    save_interval: int = 0
    keep_last: int = 2
    deterministic: bool = False

    def validate(self) -> None:
        for name in ("batch_size", "max_steps", "eval_interval", "log_interval", "max_bad_steps", "grad_accum_steps",
                     "keep_last"):
            if getattr(self, name) < 1:
                raise TxlError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise TxlError(f"train.seed must be in [0, 2**32), got {self.seed}")
        if not math.isfinite(self.lr) or not math.isfinite(self.clip) or not math.isfinite(self.weight_decay):
            raise TxlError("train.lr, train.clip and train.weight_decay must be finite numbers")
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise TxlError(f"train.lr must be > 0 and 0 <= train.min_lr <= train.lr, got lr={self.lr}, min_lr={self.min_lr}")
        for name in ("warmup_steps", "eval_max_tokens", "sample_tokens", "save_interval"):
            if getattr(self, name) < 0:
                raise TxlError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.clip < 0 or self.weight_decay < 0:
            raise TxlError("train.clip and train.weight_decay must be >= 0")
        if self.dtype not in DTYPES:
            raise TxlError(f"train.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        last = -1
        for entry in self.tgt_len_schedule:
            if len(entry) not in (2, 3) or entry[0] < 0 or any(v < 1 for v in entry[1:2]) or \
                    (len(entry) == 3 and entry[2] < 0):
                raise TxlError(f"train.tgt_len_schedule entries must be [step, tgt_len] or [step, tgt_len, mem_len] "
                               f"with step >= 0, tgt_len >= 1, mem_len >= 0; got {entry}")
            if entry[0] <= last:
                raise TxlError(f"train.tgt_len_schedule steps must increase, got {self.tgt_len_schedule}")
            last = entry[0]


@dataclass
class EvalConfig:
    """Evaluation settings, independent of training (the paper evaluates with a far longer memory).

    Attributes:
        split: "valid" or "test".
        batch_size: parallel streams.
        tgt_len, mem_len, clamp_len, same_length: attention span for evaluation (None: the model's).
        warmup: feed ``mem_len`` tokens before the first scored one so every scored token sees a full
            memory (those context tokens are not scored).
        max_tokens: score at most this many tokens (0: the whole split).
    """

    split: str = "valid"
    batch_size: int = 8
    tgt_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    warmup: bool = False
    max_tokens: int = 0

    def validate(self) -> None:
        if self.split not in ("valid", "test"):
            raise TxlError(f"eval.split must be 'valid' or 'test', got {self.split!r}")
        if self.batch_size < 1:
            raise TxlError(f"eval.batch_size must be >= 1, got {self.batch_size}")
        if self.tgt_len is not None and self.tgt_len < 1:
            raise TxlError(f"eval.tgt_len must be >= 1, got {self.tgt_len}")
        if self.mem_len is not None and self.mem_len < 0:
            raise TxlError(f"eval.mem_len must be >= 0, got {self.mem_len}")
        if self.max_tokens < 0:
            raise TxlError(f"eval.max_tokens must be >= 0, got {self.max_tokens}")


SECTIONS: dict[str, type] = {"model": TransformerXLConfig, "data": DataConfig, "train": TrainConfig, "eval": EvalConfig}


@dataclass
class RunConfig:
    """Everything a run needs; saved resolved (``run.json``) in the run directory and every checkpoint.

    The defaults are txl's built-in main job: a 3.5M-parameter byte-level model (4 layers, d_model 256,
    segments of 64 with a memory of 64, no dropout) trained for 700 steps on the default corpus in a
    few minutes on 2 CPU cores, then evaluated with a memory of 256.
    """

    model: TransformerXLConfig = field(default_factory=lambda: TransformerXLConfig(
        n_layer=4, d_model=256, n_head=8, d_head=32, d_inner=1024, dropout=0.0, tgt_len=64, mem_len=64))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(mem_len=256))

    def validate(self) -> None:
        """Raise :class:`TxlError` for the first impossible value in any section."""
        self.model.validate()
        self.data.validate()
        self.train.validate()
        self.eval.validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-able nested dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: "RunConfig | None" = None) -> "RunConfig":
        """Merge ``values`` (``{section: {key: value}}``) over ``base`` (default: the built-in defaults).

        Raises:
            TxlError: unknown sections or keys, wrong types, impossible values.
        """
        base = base or cls()
        unknown = sorted(set(values) - set(SECTIONS))
        if unknown:
            raise TxlError(f"unknown config section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
        merged: dict[str, Any] = {}
        for name, section_cls in SECTIONS.items():
            current = dataclasses.asdict(getattr(base, name))
            given = values.get(name, {})
            if not isinstance(given, dict):
                raise TxlError(f"config section [{name}] must be a table")
            current.update(check_fields(section_cls, given, name))
            merged[name] = section_cls(**current)
        config = cls(**merged)
        config.validate()
        return config


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` (or ``key=value``) into (section, key, value).

    A bare key is looked up in every section; it must belong to exactly one.

    Raises:
        TxlError: no ``=``, unknown section or key, or an ambiguous bare key.
    """
    if "=" not in text:
        raise TxlError(f"override {text!r} must look like key=value or section.key=value")
    name, raw = text.split("=", 1)
    name = name.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    if "." in name:
        section, key = name.split(".", 1)
        if section not in SECTIONS:
            raise TxlError(f"unknown config section {section!r} in {text!r}; known: {', '.join(SECTIONS)}")
        if key not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            raise TxlError(f"unknown key {key!r} in section [{section}] (override {text!r})")
        return section, key, _keep_strings(section, key, value, raw)
    owners = [s for s, c in SECTIONS.items() if name in {f.name for f in dataclasses.fields(c)}]
    if not owners:
        raise TxlError(f"unknown config key {name!r} (override {text!r})")
    if len(owners) > 1:
        raise TxlError(f"config key {name!r} is in sections {', '.join(owners)}: write e.g. {owners[0]}.{name}={raw}")
    return owners[0], name, _keep_strings(owners[0], name, value, raw)


def _keep_strings(section: str, key: str, value: Any, raw: str) -> Any:
    """A string field keeps the raw text (``data.path=2024`` is the path "2024", not a number)."""
    hint = typing.get_type_hints(SECTIONS[section])[key]
    if hint in (str, str | None) and not isinstance(value, str):
        return raw.strip()
    return value


def load_run_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Built-in defaults, then the TOML file at ``path`` (if any), then ``overrides``.

    Raises:
        TxlError: missing file, invalid TOML, unknown keys, wrong types or impossible values.
    """
    values: dict[str, dict[str, Any]] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise TxlError(f"config file {path} " + ("is not a file" if path.exists() else "does not exist"))
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise TxlError(f"config file {path} is not valid TOML: {err}") from None
    for text in overrides:
        section, key, value = parse_override(text)
        values.setdefault(section, {})[key] = value
    return RunConfig.from_dict(values)
