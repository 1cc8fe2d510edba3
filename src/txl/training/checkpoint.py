"""Run directories and checkpoints.

A run directory holds ``run.json`` (the resolved config), ``metrics.csv`` and the checkpoints
``best/`` (lowest validation loss), ``last/`` (the newest) and up to ``train.keep_last - 1`` older
ones named by their step, ``last.<step>/``. A checkpoint directory holds
``model.safetensors``, ``config.json`` (model), ``vocab.json``, ``run.json``, ``state.json`` (step,
metrics) and ``checksums.json`` (sha256 of every other file, written last).

Writing is crash-safe: a checkpoint is written into a temporary sibling directory (each file
fsynced), its checksums are written, and only then is it renamed into place (the previous one
renamed to ``last.<step>/`` first; the oldest deleted last), so a crash at any moment leaves every
previously completed checkpoint intact. Loading
verifies the checksums; a run directory whose newest checkpoint is torn or corrupt falls back to the
previous good one with a warning.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError

from txl.config import RunConfig, check_choice
from txl.data import Tokenizer, load_tokenizer
from txl.errors import TxlError
from txl.fileio import read_json_object as _read_json
from txl.fileio import write_json
from txl.model import TransformerXLLM
from txl.config import AttentionSpan
from txl.config import CHECKPOINT_NAMES, CHECKSUMS_NAME, CLASSIFIER_NAME, CONFIG_NAME, RUN_NAME, STATE_NAME, VOCAB_NAME
from txl.fileio.model_files import check_weights_header, load_weights, save_model
from txl.training.checkpoint_files import (check_replaceable, checkpoint_candidates,
                                           checksums, first_good_checkpoint, fsync_dir, numbered, verify_checkpoint)

class NonFiniteWeights(TxlError):
    """:func:`save_checkpoint` refused weights that hold NaN or inf (nothing was written).

    Attributes:
        names: the floating-point parameters and buffers that do, in the model's order.
    """

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(message)
        self.names = names


def save_checkpoint(directory: str | Path, model: TransformerXLLM, tokenizer: Tokenizer, run: RunConfig,
                    state: dict[str, Any], extra: Callable[[Path], None] | None = None, keep: int = 1,
                    span: AttentionSpan | None = None) -> None:
    """Write a complete checkpoint into ``directory``, replacing the previous one only once complete.

    ``config.json`` and the model section of ``run.json`` both hold ``model.config``, with the
    ``tgt_len``/``mem_len`` of ``span`` when given (training records the span of its schedule phase).

    Args:
        extra: ``extra(folder)`` may write more files (e.g. the trainer state) before the swap.
        keep: checkpoints kept under this name: with ``keep=3`` the previous ``last/`` becomes
            ``last.<its step>/`` and only the two newest of those are kept (deleted only once the
            new checkpoint is in place).

    Nothing is written when a weight of ``model`` is NaN or infinite (:func:`nonfinite_weights`), or
    when a folder the write would replace or delete holds anything txl did not write
    (:func:`check_replaceable`).

    Raises:
        NonFiniteWeights: (a :class:`TxlError`) non-finite weights, naming the first of them.
        TxlError: a folder txl did not write in the way; the write failed (e.g.
            disk full): the partial folder is removed and every previously written checkpoint is
            left as it was.
    """
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    bad = nonfinite_weights(model)
    if bad:
        raise NonFiniteWeights(f"checkpoint {directory} was not written: the weight {bad[0]} holds NaN or inf values"
                               + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                               + "; txl never saves non-finite weights", bad)
    step = checkpoint_step(directory) or 0
    replaced = directory.with_name(f"{directory.name}.{step}" if keep > 1 else directory.name + ".old")
    check_replaceable(directory, complete=True)  # nothing is renamed or deleted that txl did not write
    for folder in [replaced, tmp, *(numbered(directory.parent, directory.name) if keep > 1 else [])]:
        check_replaceable(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        config = model.config if span is None else dataclasses.replace(model.config, tgt_len=span.tgt_len,
                                                                         mem_len=span.mem_len)
        save_model(model, tmp, tokenizer, config=config)  # config.json and run.json agree on the span
        write_json(tmp / RUN_NAME, dataclasses.replace(run, model=config).to_dict())
        write_json(tmp / STATE_NAME, state)
        if extra is not None:
            extra(tmp)
        write_json(tmp / CHECKSUMS_NAME, checksums(tmp))
    except (OSError, SafetensorError) as err:  # safetensors reports I/O failures (disk full) as its own error
        shutil.rmtree(tmp, ignore_errors=True)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        after = ("the previous checkpoints are intact (free some space, then continue with --resume)"
                 if any(p.is_dir() for p in directory.parent.glob("last*")) else
                 "no checkpoint was written yet (free some space and start again)")
        raise TxlError(f"could not write checkpoint {directory}: {reason}; {after}") from None
    fsync_dir(tmp)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        old = replaced  # with keep > 1 the current one stays as NAME.<its step>; nothing is deleted before tmp is in place
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    if keep > 1:
        for stale in numbered(directory.parent, directory.name)[keep - 1:]:
            shutil.rmtree(stale, ignore_errors=True)
    else:
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(directory.parent)


def nonfinite_weights(model: torch.nn.Module) -> list[str]:
    """Names of the floating-point parameters and buffers of ``model`` that hold a NaN or an infinity
    (one host synchronisation for the whole model); empty when every value is finite."""
    tensors = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()]
    if not tensors:
        return []
    with torch.no_grad():
        finite = torch.stack([t.isfinite().all() for _, t in tensors]).cpu().tolist()
    return [name for (name, _), ok in zip(tensors, finite) if not ok]


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model, its tokenizer, the run config and the saved state."""

    model: TransformerXLLM
    tokenizer: Tokenizer
    run: RunConfig
    state: dict[str, Any]
    path: Path
    has_run_config: bool = True




def resolve_checkpoint_dir(path: str | Path, name: str | None = None) -> Path:
    """Accept a checkpoint directory or a run directory (then its ``best/``, else ``last/``).

    ``name`` ("best" or "last") picks that checkpoint of a run directory (the newest intact one of
    that name); it cannot be combined with a checkpoint directory.

    Raises:
        TxlError: nothing that looks like a checkpoint there, an unknown ``name``, ``name`` with a
            checkpoint directory, or no checkpoint of that name in the run.
    """
    path = Path(path)
    check_choice(name, (*CHECKPOINT_NAMES, None), "the checkpoint name")
    if not path.exists():
        raise TxlError(f"checkpoint {path} does not exist")
    if (path / CONFIG_NAME).is_file():
        if name is not None:
            raise TxlError(f"{path} is a checkpoint, not a run directory: --checkpoint-name {name} chooses among "
                           f"the checkpoints of a run; give the run directory, or {path} alone")
        return path
    if name is not None:
        candidates = checkpoint_candidates(path, name)
        if not candidates:
            raise TxlError(f"{path} has no {name}/ checkpoint; choose another with --checkpoint-name "
                           f"({'/'.join(CHECKPOINT_NAMES)})")
        return first_good_checkpoint(candidates)
    candidates = checkpoint_candidates(path, "best") + checkpoint_candidates(path, "last")
    if candidates:
        return first_good_checkpoint(candidates)
    raise TxlError(f"{path} is not a txl checkpoint or run directory: no {CONFIG_NAME} in it or in best/ or last/")


def resume_run_dir(path: str | Path) -> Path:
    """The run directory that ``txl train --resume PATH`` continues.

    ``PATH`` is normally the run directory (it holds ``run.json``, ``last/``, ``best/``). Its newest
    checkpoint, ``RUN/last``, is accepted too and stands for its run; any other checkpoint of a run
    (``best/``, an older ``last.<step>/``) is refused with a line naming the run folder, because a
    run always continues from its newest checkpoint.

    Raises:
        TxlError: ``PATH`` does not exist, or is neither a run directory nor its ``last/``.
    """
    path = Path(path)
    if not path.exists():
        raise TxlError(f"{path} is not a run directory: it does not exist (--resume takes the folder of the run "
                       "to continue)")
    if (path / CONFIG_NAME).is_file():  # a checkpoint, not a run
        run_dir = path.parent
        if not (run_dir / RUN_NAME).is_file():
            raise TxlError(f"{path} is a checkpoint, not a run directory; --resume takes the folder of a run "
                           f"(the one holding {RUN_NAME}, last/ and best/)")
        if path.name == "last":
            return run_dir
        raise TxlError(f"{path} is a checkpoint of the run {run_dir}, which continues from its newest checkpoint "
                       f"(last/): use --resume {run_dir}")
    if not (path / RUN_NAME).is_file():
        raise TxlError(f"{path} is not a run directory (no {RUN_NAME}); --resume takes the folder of the run "
                       "to continue (the --out it was trained with)")
    return path


def state_int(folder: str | Path, key: str) -> int | None:
    """The integer ``key`` recorded in a checkpoint's ``state.json``; None when it records none (no readable
    ``state.json``, no such key, or a value that is not an integer)."""
    try:
        value = _read_json(Path(folder) / STATE_NAME).get(key)
    except TxlError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def checkpoint_step(folder: str | Path) -> int | None:
    """The training step recorded in a checkpoint's ``state.json`` (:func:`state_int`); None when it records none."""
    return state_int(folder, "step")


def describe_checkpoint(directory: str | Path) -> str:
    """Which checkpoint this is, for the user: ``runs/x/best (step 600; last/ is at step 700)``.

    The step comes from its ``state.json``; for a ``best``/``last`` checkpoint inside a run directory
    the other one's step is added when it differs (after an interrupted run ``best/`` may be older).
    """
    directory = Path(directory)
    step = checkpoint_step(directory)
    notes = [f"step {step}"] if step is not None else []
    base = directory.name.split(".")[0]
    if base in CHECKPOINT_NAMES:
        other = CHECKPOINT_NAMES[1 - CHECKPOINT_NAMES.index(base)]
        if (directory.parent / other / CONFIG_NAME).is_file():
            other_step = checkpoint_step(directory.parent / other)
            if other_step is not None and other_step != step:
                notes.append(f"{other}/ is at step {other_step}")
    return f"{directory}" + (f" ({'; '.join(notes)})" if notes else "")


def load_checkpoint(path: str | Path, map_location: str = "cpu", name: str | None = None) -> Checkpoint:
    """Load model (in eval mode), tokenizer, run config and state (safetensors + JSON only).

    ``path`` may be a run directory (its ``best/``, else the newest intact ``last*/``; ``name``
    "best" or "last" picks one, see :func:`resolve_checkpoint_dir`).

    Raises:
        TxlError: missing files, invalid JSON, a file that fails its checksum (e.g. a vocabulary or
            weights replaced after saving), a vocabulary whose size differs from the model's; a ``path``
            that is not a str or path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TxlError(f"load_checkpoint takes a folder path (str or pathlib.Path), got {type(path).__name__}")
    directory = resolve_checkpoint_dir(path, name)
    if not verify_checkpoint(directory) and (directory / STATE_NAME).is_file():  # written by txl, checksums lost
        print(f"txl: warning: {directory} has no {CHECKSUMS_NAME}; its files cannot be verified", file=sys.stderr)
    if (directory / CLASSIFIER_NAME).is_file():
        raise TxlError(f"{directory} is a document classifier (txl classify), not a language model; use "
                       "txl classify predict, or give the language-model checkpoint it was made from")
    model = TransformerXLLM.from_pretrained(directory, map_location=map_location)
    if not (directory / VOCAB_NAME).is_file():
        raise TxlError(f"{directory} has no {VOCAB_NAME}: cannot decode or encode text for this model")
    tokenizer = load_tokenizer(directory / VOCAB_NAME)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise TxlError(f"{directory / VOCAB_NAME} has {tokenizer.vocab_size} tokens but the model expects "
                       f"{model.config.vocab_size}: the vocabulary does not belong to this checkpoint")
    has_run = (directory / RUN_NAME).is_file()
    run = RunConfig()
    if has_run:
        saved = _read_json(directory / RUN_NAME)
        try:
            run = RunConfig.from_dict(saved)
        except TxlError as err:  # e.g. eval.mem_len "256": name the file
            raise TxlError(f"{directory / RUN_NAME}: {err}") from None
    run.model = model.config
    state = _read_json(directory / STATE_NAME) if (directory / STATE_NAME).is_file() else {}
    return Checkpoint(model=model, tokenizer=tokenizer, run=run, state=state, path=directory, has_run_config=has_run)


def saved_vocabulary(directory: str | Path) -> tuple[Tokenizer, dict]:
    """The tokenizer and the saved state of the run checkpoint ``directory`` (what a resumed run checks
    before it loads the weights: :func:`load_into`).

    Raises:
        TxlError: no or a broken vocabulary, invalid JSON.
    """
    directory = Path(directory)
    if not (directory / VOCAB_NAME).is_file():
        raise TxlError(f"{directory} has no {VOCAB_NAME}: cannot check the vocabulary of this run")
    state = _read_json(directory / STATE_NAME) if (directory / STATE_NAME).is_file() else {}
    return load_tokenizer(directory / VOCAB_NAME), state


def load_into(model: torch.nn.Module, directory: str | Path, map_location: str = "cpu") -> None:
    """Load the weights of the run checkpoint ``directory`` into ``model`` (the module the run trains: a
    language model, or a task's model such as a classifier).

    Raises:
        TxlError: weights whose names or shapes differ from ``model``'s (the model config changed), broken
            weights.
    """
    directory = Path(directory)
    try:
        check_weights_header(model, directory, "the model")
    except TxlError as err:
        if "do not match" not in str(err):  # no or unreadable weights: said as they are
            raise
        raise TxlError(f"the weights in {directory} do not fit this run's model config: the config changed, or the "
                       "checkpoint comes from another run; model shapes cannot change when resuming (start a new "
                       "run instead)") from None
    load_weights(model, directory, map_location, str(directory / CONFIG_NAME))


def quarantine(bad: list[Path]) -> None:
    """Rename checkpoints that failed verification to ``NAME.corrupt`` (kept for inspection, never
    loaded or rotated), so that the next save cannot push the good one out."""
    for path in bad:
        target = path.with_name(path.name + ".corrupt")  # last.corrupt, last.25.corrupt, ...
        check_replaceable(target)
        shutil.rmtree(target, ignore_errors=True)
        path.rename(target)
