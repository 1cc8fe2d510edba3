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
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txl.errors import TxlError, listed
from txl.config.fields import check_fields, did_you_mean
from txl.config.model import TransformerXLConfig, check_clamp
from txl.config.sections import DataConfig, EvalConfig, FinetuneConfig, TrainConfig



SECTIONS: dict[str, type] = {"model": TransformerXLConfig, "data": DataConfig, "train": TrainConfig, "eval": EvalConfig,
                             "finetune": FinetuneConfig}
OPTIONAL_SECTIONS = ("finetune",)  # absent (None) unless given: a plain language-model run has none


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
    finetune: FinetuneConfig | None = None

    def check(self) -> None:
        """Raise :class:`TxlError` for the first impossible value in any section."""
        self.model.check()
        self.data.check()
        self.train.check()
        self.eval.check()
        if self.eval.clamp_len:  # refused before training, not at its final evaluation
            check_clamp(self.model.attn_type, self.eval.clamp_len, "eval.clamp_len")
        if self.finetune is not None:
            self.finetune.check()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-able nested dict (no ``finetune`` key for a language-model run)."""
        values = dataclasses.asdict(self)
        if self.finetune is None:
            del values["finetune"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: "RunConfig | None" = None) -> "RunConfig":
        """Merge ``values`` (``{section: {key: value}}``) over ``base`` (default: the built-in defaults).

        Raises:
            TxlError: unknown sections or keys, wrong types, impossible values.
        """
        base = base or cls()
        unknown = sorted(set(values) - set(SECTIONS))
        if unknown:
            raise TxlError(f"unknown config section(s) {listed(unknown)}{did_you_mean(unknown[0], SECTIONS)}; "
                           f"known: {', '.join(SECTIONS)}")
        merged: dict[str, Any] = {}
        for name, section_cls in SECTIONS.items():
            if name in OPTIONAL_SECTIONS and getattr(base, name) is None and values.get(name) is None:
                merged[name] = None
                continue
            current = dataclasses.asdict(getattr(base, name) or section_cls())
            given = values.get(name, {})
            if not isinstance(given, dict):
                raise TxlError(f"config section [{name}] must be a table")
            current.update(check_fields(section_cls, given, name))
            merged[name] = section_cls(**current)
        config = cls(**merged)
        config.check()
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
            raise TxlError(f"unknown config section {section!r} in {text!r}{did_you_mean(section, SECTIONS)}; "
                           f"known: {', '.join(SECTIONS)}")
        keys = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if key not in keys:
            elsewhere = [f"{other}.{key}" for other, c in SECTIONS.items() if key in {f.name for f in dataclasses.fields(c)}]
            hint = (f" (did you mean {' or '.join(elsewhere)}?)" if elsewhere else
                    did_you_mean(name, [f"{section}.{k}" for k in keys]) or did_you_mean(name, _qualified_keys()))
            raise TxlError(f"unknown key {key!r} in section [{section}]{hint} (override {text!r})")
        return section, key, _keep_strings(section, key, value, raw)
    owners = [s for s, c in SECTIONS.items() if name in {f.name for f in dataclasses.fields(c)}]
    if not owners:
        hint = did_you_mean(name, sorted({k.split(".", 1)[1] for k in _qualified_keys()}))
        raise TxlError(f"unknown config key {name!r}{hint} (override {text!r})")
    if len(owners) > 1:
        raise TxlError(f"config key {name!r} is in sections {', '.join(owners)}: write e.g. {owners[0]}.{name}={raw}")
    return owners[0], name, _keep_strings(owners[0], name, value, raw)


def _qualified_keys() -> list[str]:
    """Every config key as ``section.key``."""
    return [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


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
    from txl.fileio import read_toml  # (fileio reads the config's file names: imported when used)

    values: dict[str, dict[str, Any]] = {}
    if path is not None:
        values = read_toml(path)
    for text in overrides:
        section, key, value = parse_override(text)
        values.setdefault(section, {})[key] = value
    return RunConfig.from_dict(values)
