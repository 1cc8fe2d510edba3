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

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError

from txl.training.config import RunConfig
from txl.data import Tokenizer, load_tokenizer
from txl.errors import TxlError
from txl.fileio import read_json_object as _read_json
from txl.fileio import path_inside, write_json
from txl.model import TransformerXLLM
from txl.model.span import AttentionSpan
from txl.config import CHECKSUMS_NAME, CLASSIFIER_NAME, CONFIG_NAME, RUN_NAME, STATE_NAME, VOCAB_NAME, WEIGHTS_NAME
from txl.model.serialization import check_weights_header, load_weights, save_model

# the trainer state of a resumable checkpoint (txl.training.resume writes and reads them)
TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"


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
    step = _step_of(directory) if directory.exists() else 0
    replaced = directory.with_name(f"{directory.name}.{step}" if keep > 1 else directory.name + ".old")
    check_replaceable(directory, complete=True)  # nothing is renamed or deleted that txl did not write
    for folder in [replaced, tmp, *(_numbered(directory.parent, directory.name) if keep > 1 else [])]:
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
        write_json(tmp / CHECKSUMS_NAME, {name: _sha256(tmp / name) for name in _payload(tmp)})
    except (OSError, SafetensorError) as err:  # safetensors reports I/O failures (disk full) as its own error
        shutil.rmtree(tmp, ignore_errors=True)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        after = ("the previous checkpoints are intact (free some space, then continue with --resume)"
                 if any(p.is_dir() for p in directory.parent.glob("last*")) else
                 "no checkpoint was written yet (free some space and start again)")
        raise TxlError(f"could not write checkpoint {directory}: {reason}; {after}") from None
    _fsync_dir(tmp)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        old = replaced  # with keep > 1 the current one stays as NAME.<its step>; nothing is deleted before tmp is in place
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    if keep > 1:
        for stale in _numbered(directory.parent, directory.name)[keep - 1:]:
            shutil.rmtree(stale, ignore_errors=True)
    else:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(directory.parent)


def _step_of(folder: Path) -> int:
    try:
        return int(_read_json(folder / STATE_NAME).get("step", 0))
    except (TxlError, TypeError, ValueError):
        return 0


# the files txl writes into a checkpoint folder (the model, the run and the trainer state), and the
# temporary names of :func:`txl.fileio.atomic_write` that a crash can leave beside them
_WRITTEN = {WEIGHTS_NAME, CONFIG_NAME, VOCAB_NAME, RUN_NAME, STATE_NAME, CHECKSUMS_NAME, CLASSIFIER_NAME,
            TRAINER_JSON, TRAINER_TENSORS}
_ATOMIC_TMP = re.compile(r"\..+\.tmp")
# the folders of a run directory that txl renames, replaces or deletes: best/, last/, last.<step>/, and the
# .tmp (being written), .old (being replaced) and .corrupt (set aside) ones
_ROTATED = re.compile(r"(best|last)(\.(\d+|old))?(\.(tmp|corrupt))?")


def nonfinite_weights(model: torch.nn.Module) -> list[str]:
    """Names of the floating-point parameters and buffers of ``model`` that hold a NaN or an infinity
    (one host synchronisation for the whole model); empty when every value is finite."""
    tensors = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()]
    if not tensors:
        return []
    with torch.no_grad():
        finite = torch.stack([t.isfinite().all() for _, t in tensors]).cpu().tolist()
    return [name for (name, _), ok in zip(tensors, finite) if not ok]


def foreign_files(folder: str | Path, complete: bool = False) -> list[str]:
    """What in ``folder`` txl did not write, so may never delete or replace; empty when it may.

    A folder txl may delete or replace holds only files (no folders, no links) named as txl names the
    files of a checkpoint (or listed in its ``checksums.json``, or left by an interrupted atomic write);
    it may be empty or partial (a ``.tmp`` folder being written, an older ``last.<step>/`` whose
    deletion was cut short). With ``complete`` (``best/`` and ``last/``, which txl only ever creates
    whole) a non-empty folder must also hold ``state.json`` or ``checksums.json``. A missing folder
    gives an empty list; a file or link where the folder should be is foreign itself.
    """
    folder = Path(folder)
    if not os.path.lexists(folder):
        return []
    if folder.is_symlink() or not folder.is_dir():
        return [f"{folder.name} is not a folder"]
    listed: set[str] = set()
    try:
        listed = set(_read_json(folder / CHECKSUMS_NAME)) if (folder / CHECKSUMS_NAME).is_file() else set()
    except TxlError:
        pass
    entries = sorted(folder.iterdir())
    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries
               if p.is_symlink() or not p.is_file()
               or not (p.name in _WRITTEN or p.name in listed or _ATOMIC_TMP.fullmatch(p.name))]
    if not foreign and entries and complete and not any((folder / n).is_file() for n in (STATE_NAME, CHECKSUMS_NAME)):
        foreign = [p.name for p in entries]  # files named like txl's, but no checkpoint of txl's
    return foreign


def check_replaceable(folder: str | Path, complete: bool = False) -> None:
    """Refuse before a checkpoint write renames, replaces or deletes ``folder`` when it holds anything
    txl did not write (see :func:`foreign_files`).

    Raises:
        TxlError: naming the folder and (up to three of) the foreign files.
    """
    foreign = foreign_files(folder, complete=complete)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise TxlError(f"{folder} is not a txl checkpoint ({shown}); txl never deletes or replaces what it did not "
                       f"write: move it out of {Path(folder).parent}, then start again (or --resume)")


def check_run_folder(run_dir: str | Path) -> None:
    """Check, before a run writes its first checkpoint, every folder of ``run_dir`` that checkpoint
    rotation may rename, replace or delete (``best/``, ``last/``, ``last.<step>/``, ``*.tmp``,
    ``*.old``, ``*.corrupt``) with :func:`check_replaceable`.

    Raises:
        TxlError: one of them holds something txl did not write.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for path in sorted(run_dir.iterdir()):
        if _ROTATED.fullmatch(path.name):
            check_replaceable(path, complete=path.name in ("best", "last"))


def _numbered(run_dir: Path, name: str) -> list[Path]:
    """``NAME.<step>`` folders, newest step first."""
    found = [p for p in run_dir.glob(f"{name}.*") if p.is_dir() and p.suffix[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.suffix[1:]), reverse=True)


def _payload(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS_NAME
                  and not p.name.startswith("."))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def verify_checkpoint(directory: str | Path) -> bool:
    """Check every file of a checkpoint against its ``checksums.json``.

    Only files of the checkpoint folder itself are read: a listed name with a folder separator,
    ``..`` or an absolute path (a crafted ``checksums.json``), or one that is a symbolic link (it could
    lead anywhere; ``checksums.json`` itself neither), is refused before anything is opened.

    Returns:
        True when verified; False for a checkpoint written without checksums (older txl versions,
        folders made by hand), which is accepted unverified.

    Raises:
        TxlError: a listed file is missing, truncated or altered, the checksum list is unreadable,
            or it names a file outside the folder or a symbolic link.
    """
    directory = Path(directory)
    _refuse_link(directory, directory / CHECKSUMS_NAME)
    if not (directory / CHECKSUMS_NAME).is_file():
        return False
    listed = _read_json(directory / CHECKSUMS_NAME)
    if not listed:
        return False
    where = str(directory / CHECKSUMS_NAME)
    files = {path_inside(directory, name, where): digest for name, digest in listed.items()}
    for f in files:  # every name is checked before the first file is read
        _refuse_link(directory, f)
    for f, digest in files.items():
        name = f.name
        if not isinstance(digest, str):
            raise TxlError(f"{where} gives {name} a checksum that is not a string; the checksum list is corrupt")
        if not f.is_file():
            raise TxlError(f"checkpoint {directory} is incomplete: {name} is missing")
        if _sha256(f) != digest:
            raise TxlError(f"checkpoint {directory} is corrupt: {name} does not match its checksum")
    return True


def _refuse_link(directory: Path, path: Path) -> None:
    """Refuse a file of a checkpoint that is a symbolic link: a crafted checkpoint could link to any file."""
    if path.is_symlink():
        raise TxlError(f"checkpoint {directory} holds {path.name} as a symbolic link; txl reads only the checkpoint's "
                       "own files (a link can lead anywhere): replace the link with the file itself")


def checkpoint_candidates(run_dir: str | Path, name: str = "last") -> list[Path]:
    """``last/``, then the older ``last.<step>/`` (newest first) and a ``last.old/`` left by a crash."""
    run_dir = Path(run_dir)
    found = [run_dir / name] if (run_dir / name).is_dir() else []
    found += _numbered(run_dir, name)
    if (run_dir / f"{name}.old").is_dir():
        found.append(run_dir / f"{name}.old")
    return found


def first_good_checkpoint(candidates: list[Path], required: str = CONFIG_NAME,
                          warn: Callable[[str], None] | None = None) -> Path:
    """The first of ``candidates`` that holds ``required`` and passes :func:`verify_checkpoint`.

    A skipped (torn or corrupt) candidate is reported through ``warn`` (default: stderr).

    Raises:
        TxlError: none of them is usable (the message lists why).
    """
    warn = warn or (lambda msg: print(f"txl: warning: {msg}", file=sys.stderr, flush=True))
    problems = []
    for path in candidates:
        try:
            if not (path / required).is_file():
                raise TxlError(f"checkpoint {path} is incomplete: {required} is missing")
            verify_checkpoint(path)
        except TxlError as err:
            problems.append(str(err))
            continue
        for problem in problems:
            warn(f"{problem}; using {path} instead")
        return path
    if not candidates:
        raise TxlError("no checkpoint found")
    raise TxlError("; ".join(problems) + " (no intact checkpoint left)")


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model, its tokenizer, the run config and the saved state."""

    model: TransformerXLLM
    tokenizer: Tokenizer
    run: RunConfig
    state: dict[str, Any]
    path: Path
    has_run_config: bool = True


CHECKPOINT_NAMES = ("best", "last")  # the checkpoints of a run a command can be told to use


def resolve_checkpoint_dir(path: str | Path, name: str | None = None) -> Path:
    """Accept a checkpoint directory or a run directory (then its ``best/``, else ``last/``).

    ``name`` ("best" or "last") picks that checkpoint of a run directory (the newest intact one of
    that name); it cannot be combined with a checkpoint directory.

    Raises:
        TxlError: nothing that looks like a checkpoint there, an unknown ``name``, ``name`` with a
            checkpoint directory, or no checkpoint of that name in the run.
    """
    path = Path(path)
    if name is not None and name not in CHECKPOINT_NAMES:
        raise TxlError(f"the checkpoint name must be one of {', '.join(CHECKPOINT_NAMES)}, got {name!r}")
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


def checkpoint_step(folder: str | Path) -> int | None:
    """The training step recorded in a checkpoint's ``state.json``; None when it records none."""
    try:
        step = _read_json(Path(folder) / STATE_NAME).get("step")
    except TxlError:
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


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
            weights replaced after saving), a vocabulary whose size differs from the model's.
    """
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
        raise TxlError(f"the weights in {directory} do not fit the changed model config; model shapes cannot "
                       "change when resuming (start a new run instead)") from None
    load_weights(model, directory, map_location, str(directory / CONFIG_NAME))


def quarantine(bad: list[Path]) -> None:
    """Rename checkpoints that failed verification to ``NAME.corrupt`` (kept for inspection, never
    loaded or rotated), so that the next save cannot push the good one out."""
    for path in bad:
        target = path.with_name(path.name + ".corrupt")  # last.corrupt, last.25.corrupt, ...
        check_replaceable(target)
        shutil.rmtree(target, ignore_errors=True)
        path.rename(target)
