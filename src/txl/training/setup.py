"""A run before its first step: the task it describes, the checks that it can train, its folder claimed,
the run as its checkpoints record it, and the model (:func:`txl.training.loop.train` runs these in order)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from txl import distributed
from txl.config import RunConfig, check_compilable
from txl.data.iterators import longest_segment
from txl.errors import TxlError
from txl.fileio import FolderClaim, claim_folder, continue_command
from txl.model import TransformerXLLM
from txl.kernels.cpu import check_attention_fits
from txl.training.checkpoint import RUN_NAME, state_int
from txl.training.checkpoint_files import check_run_folder, checkpoint_candidates, first_good_checkpoint
from txl.training.lm_task import LMTask
from txl.training.resume import JSON_NAME as TRAINER_JSON
from txl.training.runlog import check_new_run_folder
from txl.training.schedules import segment_span


def absolute_paths(data):
    """The data section with absolute paths, so that a run's checkpoints work from any directory."""
    paths = {k: str(Path(v).resolve()) for k in ("path", "train", "valid", "test")
             if (v := getattr(data, k)) is not None}
    return dataclasses.replace(data, **paths)


def recorded_threads(checkpoint: Path) -> int | None:
    """The CPU thread count a run recorded in a checkpoint's ``state.json`` (None for runs before it did)."""
    value = state_int(checkpoint, "threads")
    return value if value is not None and value >= 1 else None


def make_task(run: RunConfig, progress: bool = False):
    """The task ``run`` describes: :class:`~txl.training.finetune.PairsTask` when it has a
    ``[finetune]`` section, else :class:`~txl.training.lm_task.LMTask` (loads the data; ``progress``:
    bars while a large corpus is encoded)."""
    if run.finetune is not None:
        from txl.training.finetune import PairsTask

        return PairsTask(run)
    return LMTask(run, progress=progress)


def task_inputs(run: RunConfig) -> list:
    """The paths a run reads (its output folder may not be one of them, nor inside one)."""
    data = run.data
    inputs = [data.path, data.train, data.valid, data.test]
    return inputs + ([run.finetune.init] if run.finetune is not None else [])


def check_run(run: RunConfig, d: distributed.Dist) -> None:
    """Refuses a config that cannot train (on these ranks)."""
    run.check()
    if run.train.compile:  # (a saved run's config may hold it: refused where training starts, not on loading)
        check_compilable(run.model, "train.compile")
    t = run.train
    if d.enabled and t.batch_size % (d.world * t.grad_accum_steps):
        raise TxlError(f"train.batch_size {t.batch_size} must divide into {d.world} ranks × train.grad_accum_steps "
                       f"{t.grad_accum_steps} equal pieces")
    if not d.enabled and t.grad_accum_steps > t.batch_size:
        raise TxlError(f"train.grad_accum_steps {t.grad_accum_steps} exceeds train.batch_size {t.batch_size}")


def claim_run_folder(run: RunConfig, d: distributed.Dist, *, resume: bool, claims: list[FolderClaim], task,
                      log: Callable[[str], None]) -> tuple[bool, list[Path], Path | None]:
    """Rank 0 claims ``train.out_dir`` (appended to ``claims``); a new run needs a new or empty folder, a
    resumed one a resumable checkpoint. Returns whether the claim created the folder, and for a resumed run
    its ``last`` checkpoints (newest first) and the first intact one of them."""
    out_dir = Path(run.train.out_dir)
    if resume and not out_dir.is_dir():
        raise TxlError(f"{out_dir} has no resumable checkpoint (last/{TRAINER_JSON}); start a new run instead")
    created = False
    if d.is_main:  # one process per run folder: claimed before anything is read or written
        claim = claim_folder(out_dir, flag="train.out_dir", create=not resume,
                             inputs=task_inputs(run) + list(getattr(task, "inputs", ())))
        claims.append(claim)
        created = claim.created
        if not resume:
            check_new_run_folder(out_dir)  # never over a run, nor over files txl did not write
        check_run_folder(out_dir)  # checkpoint rotation will not meet a folder txl did not write
    candidates, resume_dir = [], None
    if resume:
        candidates = checkpoint_candidates(out_dir, "last")
        if not candidates:
            raise TxlError(f"{out_dir} has no resumable checkpoint (last/{TRAINER_JSON}); start a new run instead")
        resume_dir = first_good_checkpoint(candidates, required=TRAINER_JSON, warn=lambda m: log(f"txl: warning: {m}"))
    elif (out_dir / RUN_NAME).exists():
        raise TxlError(f"{out_dir} already holds a run; choose another train.out_dir (--out), remove it, "
                       f"or continue it with {continue_command(out_dir)}")
    return created, candidates, resume_dir


def run_for_task(run: RunConfig, task) -> tuple[RunConfig, list[tuple[int, int]]]:
    """``run`` as its checkpoints record it (the task's vocabulary size, absolute paths), and the
    ``(tgt_len, mem_len)`` of each phase of its ``train.tgt_len_schedule``."""
    t = run.train
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=task.vocab_size),
                              data=absolute_paths(run.data))
    if run.finetune is not None:
        run = dataclasses.replace(run, finetune=dataclasses.replace(run.finetune,
                                                                    init=str(Path(run.finetune.init).resolve())))
    spans = [segment_span(s, t.tgt_len_schedule, run.model.tgt_len, run.model.mem_len) for s in
             [0] + [e[0] for e in t.tgt_len_schedule]]
    return run, spans


def build_model(run: RunConfig, d: distributed.Dist, device: torch.device, task, spans: list[tuple[int, int]], *,
                 resume: bool) -> torch.nn.Module:
    """The model to train, on ``device`` (a new run's with the task's initial weights)."""
    t = run.train
    build = getattr(task, "build_model", None)  # a task may train another model around the LM (a classifier)
    model = (TransformerXLLM(run.model) if build is None else build(run)).to(device)
    if build is None:  # the longest segment's attention scores, under autograd
        longest = max(longest_segment(s[0]) if t.varlen else s[0] for s in spans)
        check_attention_fits(model, len(range(t.batch_size)[d.rows(t.batch_size)]), longest,
                             longest + max(s[1] for s in spans), grad=True, dtype=t.dtype)
    if not resume:
        task.init_weights(model)
    return model
