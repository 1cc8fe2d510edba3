"""Fine-tuning a language model on prompt/completion pairs (``txl finetune``): the pairs task of the training loop.

Each example is one row ``prompt + SEP + completion + END`` (:mod:`txl.data.pairs`). A step reads
``batch_size`` examples segment by segment with the memory carried (paper §3.2), however long the
prompt, and back-propagates the summed negative log-likelihood of the completion and END targets
only, through the last ``finetune.grad_segments`` segments of each example (and every segment that
holds completion tokens); the memory entering that window is detached. The loss of a step is the
mean over the completion targets of the whole batch, as :func:`txl.training.step.train_step`
computes for any task.

Everything else is :func:`txl.training.loop.train`: the run folder and its claim, ``best/`` and
``last/`` checkpoints, exact resume, the progress bar, ``metrics.csv``, several processes and the
one-line errors. :class:`PairsTask` plugs into it (the task interface is described in
:mod:`txl.training.lm_task`); :func:`txl.training.loop.finetune` is the Python form of the command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from txl.data.iterators import EpochBatches
from txl.data.pairs import Pair, add_markers, encode_pair, pair_batch, pair_splits
from txl.errors import TxlError
from txl.evaluation.completions import completion_losses, evaluate_completions
from txl.evaluation.stream import EvalResult, metric_unit
from txl.model import TransformerXLLM
from txl.config import resolve_span, RunConfig, TransformerXLConfig
from txl.fileio.model_files import check_trainable
from txl.model.transformer import LMOutput
from txl.training.checkpoint import load_checkpoint, resolve_checkpoint_dir
from txl.training.fingerprint import file_digest

# settings a fine-tuned model may change from its language model (the reading span and dropout)
FREE_FIELDS = ("vocab_size", "tgt_len", "mem_len", "clamp_len", "same_length", "dropout", "dropatt")

# the run config of `txl finetune` before the language model's model section, the user's file and overrides
FINETUNE_DEFAULTS: dict[str, dict[str, Any]] = {
    "train": {"max_steps": 300, "lr": 5e-4, "min_lr": 5e-5, "warmup_steps": 20, "batch_size": 8,
              "eval_interval": 100, "sample_tokens": 64},
    "data": {"split": [0.9, 0.1, 0.0]},
}


def load_grown(model: nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Copy ``state`` (a language model's weights) into ``model``, whose vocabulary may be larger.

    A tensor whose shape differs from the model's only in its first dimension, and is shorter there
    (embedding rows, output rows and biases of the added vocabulary entries, which are always the
    last ids), fills the leading rows; the model's own (freshly initialised) values stay in the rest.

    Returns:
        The number of tensors that were grown.

    Raises:
        TxlError: a missing or unexpected tensor, or any other difference of shape (the model
            config does not fit the language model's).
    """
    own = model.state_dict()
    if set(own) != set(state):
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise TxlError(f"the language model's weights do not fit this model (missing {missing[:3]}, "
                       f"unexpected {extra[:3]}); model settings other than {', '.join(FREE_FIELDS)} cannot change")
    grown = 0
    with torch.no_grad():
        for name, value in state.items():
            target = own[name]
            if target.shape == value.shape:
                target.copy_(value)
            elif target.shape[1:] == value.shape[1:] and target.shape[0] > value.shape[0]:
                target[:value.shape[0]].copy_(value)
                grown += 1
            else:
                raise TxlError(f"{name} is {tuple(value.shape)} in the language model but {tuple(target.shape)} here; "
                               f"model settings other than {', '.join(FREE_FIELDS)} cannot change")
    return grown


class PairsObjective(nn.Module):
    """The training objective of a pairs step as a module (so that DistributedDataParallel can wrap it).

    ``forward(x, mems=None, labels=y, span=...)`` reads the right-padded rows ``x`` (int64 [b, L])
    segment by segment and returns an :class:`~txl.model.LMOutput` whose ``token_loss`` is float [b],
    each row's summed NLL (nats) over its scored targets, with autograd through the window of
    :func:`txl.evaluation.completions.grad_window` (when grad is enabled), ``mems`` None (an
    example never carries memory into the next step) and ``recon_loss`` the mean attention-reconstruction
    loss of the segments read with autograd (a compressed memory), else None.
    """

    def __init__(self, model: TransformerXLLM, grad_segments: int | None, dtype: str) -> None:
        super().__init__()
        self.model = model
        self.grad_segments = grad_segments
        self.dtype = dtype

    @property
    def config(self) -> TransformerXLConfig:
        """The language model's config (the optimizer step reads it as it reads a bare model's)."""
        return self.model.config

    def forward(self, x: torch.Tensor, mems=None, labels: torch.Tensor | None = None, span=None) -> LMOutput:
        span = resolve_span(self.model.config, span)
        recon: list = []
        sums = completion_losses(self.model, x, labels, span=span, grad=torch.is_grad_enabled(),
                                 grad_segments=self.grad_segments, dtype=self.dtype, recon=recon)
        return LMOutput(logits=None, loss=None, mems=None, token_loss=sums,
                        recon_loss=torch.stack(recon).mean() if recon else None)


class CompletionRowsTask:
    """What every task of scored completions shares: rows ``(ids, start)`` read with the memory, the loss on
    the tokens from ``start`` on. A subclass sets ``rows`` (``"train"``, ``"valid"``: lists of rows),
    ``grad_segments``, ``dtype`` and ``unit`` (the metric's unit)."""

    rows: dict
    grad_segments: int | None
    dtype: str
    unit: str

    def batches(self, run: RunConfig, device: torch.device) -> EpochBatches:
        rows = self.rows["train"]
        return EpochBatches(len(rows), run.train.batch_size, run.train.seed,
                            lambda chosen: pair_batch([rows[i] for i in chosen], device))

    def objective(self, model: TransformerXLLM) -> PairsObjective:
        return PairsObjective(model, self.grad_segments, self.dtype)

    def validate(self, model: TransformerXLLM, run: RunConfig, span, dist) -> EvalResult:
        """Mean NLL per scored token of the valid rows, read at the training span."""
        return evaluate_completions(model, self.rows["valid"], span=span, unit=self.unit,
                                    batch_size=run.eval.batch_size, dtype=run.train.dtype, dist=dist)


class PairsTask(CompletionRowsTask):
    """Fine-tuning on the prompt/completion pairs of ``run.data`` from ``run.finetune.init`` (see the module).

    Data: ``data.train`` and ``data.valid`` (and optionally ``data.test``) JSON Lines files of pairs,
    or one file ``data.path`` cut into train/valid/test by the fractions ``data.split``, in file order.

    Raises:
        TxlError: an unusable language-model checkpoint, a missing or malformed pairs file, a pair the
            tokenizer cannot encode or that contains a marker, an empty split that is needed.
    """

    def __init__(self, run: RunConfig) -> None:
        init = load_checkpoint(resolve_checkpoint_dir(run.finetune.init))
        self.init_config: TransformerXLConfig = init.model.config
        self.init_state = init.model.state_dict()
        check_trainable(self.init_state, str(init.path))
        self.tokenizer, self.markers, self.added = add_markers(init.tokenizer)
        self.vocab_size = self.tokenizer.vocab_size
        self.unit = metric_unit(self.tokenizer.kind)
        self.source = str(init.path)
        self.grad_segments = run.finetune.grad_segments or None
        self.dtype = run.train.dtype
        splits = pair_splits(run.data)
        names = ("path",) if run.data.path is not None else ("train", "valid", "test")
        self.files = {k: getattr(run.data, k) for k in names if getattr(run.data, k) is not None}  # pairs files read
        self.pairs: dict[str, list[Pair]] = splits
        cut = run.finetune.max_prompt_tokens
        self.rows = {name: [encode_pair(self.tokenizer, self.markers, pair, cut) for pair in ps]
                     for name, ps in splits.items()}

    def describe(self) -> str:
        n = {k: len(v) for k, v in self.rows.items()}
        completion = sum(len(ids) - start for ids, start in self.rows["train"])
        added = f" (+{self.added} marker entries)" if self.added else ""
        return (f"data: prompt/completion pairs, train/valid/test {n['train']}/{n['valid']}/{n['test']} "
                f"({completion} completion tokens in train); {self.tokenizer.kind} vocabulary of "
                f"{self.vocab_size}{added}; starting from {self.source}")

    def check(self, run: RunConfig, spans) -> None:
        """The model config must be the language model's (up to :data:`FREE_FIELDS`); the needed splits
        must hold pairs."""
        for f in dataclasses.fields(TransformerXLConfig):
            if f.name not in FREE_FIELDS and getattr(run.model, f.name) != getattr(self.init_config, f.name):
                raise TxlError(f"model.{f.name} is {getattr(run.model, f.name)!r} but the language model "
                               f"{self.source} has {getattr(self.init_config, f.name)!r}; only "
                               f"{', '.join(FREE_FIELDS[1:])} can change when fine-tuning")
        if getattr(run.model, "cmem_len", 0):
            raise TxlError(f"{self.source} has a compressive memory (model.cmem_len={run.model.cmem_len}); fine-tuning "
                           "on pairs reads with the plain memory only: not supported for it yet")
        if not self.rows["train"]:
            raise TxlError("the train split holds no pairs; give more pairs or a larger data.split train fraction")
        if not self.rows["valid"]:
            raise TxlError("the valid split holds no pairs: validation needs some; give data.split a valid fraction "
                           "> 0 (with enough pairs) or a data.valid file")
        if run.eval.split == "test" and not self.rows["test"]:
            raise TxlError("eval.split is test but the test split holds no pairs; give data.test or a test fraction")

    def init_weights(self, model: TransformerXLLM) -> None:
        """The language model's weights; rows of added marker entries keep their fresh initialisation."""
        load_grown(model, self.init_state)

    def fingerprint(self) -> dict:
        """Size and sha256 of each pairs file read (``data.path``, or ``data.train``/``valid``/``test``)."""
        return {f"data.{key}": file_digest(path) for key, path in self.files.items()}

    def final(self, model: TransformerXLLM, run: RunConfig, dist, progress: bool = False) -> EvalResult:
        """The same on ``eval.split`` with the ``[eval]`` span settings (``progress``: a bar on stderr)."""
        e = run.eval
        span = resolve_span(model.config, tgt_len=e.tgt_len, mem_len=e.mem_len, clamp_len=e.clamp_len,
                            same_length=e.same_length)
        return evaluate_completions(model, self.rows[e.split], span=span, unit=self.unit, batch_size=e.batch_size,
                                    dtype=run.train.dtype, dist=dist,
                                    progress=progress and f"final evaluation ({e.split})")

    def sample(self, model: TransformerXLLM, run: RunConfig) -> tuple[str, str]:
        """The greedy completion of the first valid prompt (its last 300 characters shown as the prompt)."""
        from txl.generation import complete

        pair = self.pairs["valid"][0]
        text = complete(model, self.tokenizer, [pair.prompt], max_new_tokens=run.train.sample_tokens,
                        max_prompt_tokens=run.finetune.max_prompt_tokens)[0]  # greedy
        shown = pair.prompt if len(pair.prompt) <= 300 else "…" + pair.prompt[-300:]
        return shown, text


def finetune_config(init: str | Path, data: str | Path | None = None, *, out_dir: str | Path,
                    config: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """The run config of fine-tuning ``init`` on the pairs file ``data``, written to ``out_dir``.

    Built from txl's defaults, then :data:`FINETUNE_DEFAULTS`, the language model's model config
    (its ``tgt_len``/``mem_len`` too; ``eval.mem_len`` defaults to the model's ``mem_len``), the TOML
    file ``config`` and ``overrides`` (``section.key=value``; e.g. ``finetune.grad_segments=2``,
    ``model.tgt_len=128``, ``data.train=...`` ``data.valid=...`` instead of ``data``).

    Raises:
        TxlError: an unusable checkpoint, a bad config file or override.
    """
    from txl.fileio import read_toml
    from txl.fileio.model_files import read_model_config
    from txl.config import parse_override

    model = read_model_config(resolve_checkpoint_dir(init))
    values: dict[str, dict[str, Any]] = {k: dict(v) for k, v in FINETUNE_DEFAULTS.items()}
    values["model"] = model.to_dict()
    values["finetune"] = {"init": str(init)}
    values["train"]["out_dir"] = str(out_dir)
    values["eval"] = {"mem_len": model.mem_len}
    if data is not None:
        values["data"]["path"] = str(data)
    if config is not None:
        given = read_toml(config)
        for section, table in given.items():
            if isinstance(table, dict) and isinstance(values.get(section), dict):
                values[section].update(table)
            else:
                values[section] = table
    for text in overrides:
        section, key, value = parse_override(text)
        values.setdefault(section, {})[key] = value
    return RunConfig.from_dict(values)
