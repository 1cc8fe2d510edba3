"""The segment-recurrent training loop (paper §3.2): memory carried across segments, detached."""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

import torch

from txl.config import IGNORE_INDEX, RunConfig
from txl.errors import TxlError
from txl.runtime import compile_module, progress_bar, resolve_device, seed_everything, set_threads
from txl.evaluation.stream import EvalResult, metric_value
from txl.fileio import FolderClaim, write_json
from txl import distributed
from txl.training import runlog, setup
from txl.training.checkpoint import (RUN_NAME, NonFiniteWeights, load_checkpoint, save_checkpoint)
from txl.training.fingerprint import STATE_KEY as DATA_KEY
from txl.training.resume import rank_rng_state, restore_run, save_trainer_state
from txl.training.runlog import (TENSORBOARD_DIR, MetricsLog, StopRequest, record_resumed_config,
                                remove_unfinished)
from txl.training.optim import make_optimizer
from txl.training.step import StepResult, train_step
from txl.training.lm_task import LMTask, evaluate_run, sample_text, shuffled_batches  # noqa: F401 - public here too
from txl.training.schedules import learning_rate, segment_span


@dataclass
class TrainResult:
    """Outcome of :func:`train`.

    Attributes:
        run_dir: the run directory; ``best_dir``: the best checkpoint in it (a resumed run that was
            already complete before its first validation has no ``best/``: then the ``last/`` it resumed).
        final: evaluation of ``best_dir`` with the ``[eval]`` settings (memory included).
        steps, tokens: optimizer steps taken and target tokens trained on.
        wall_s: wall-clock seconds of the training loop; tokens_per_s: tokens / wall_s (evaluation included).
        sample_prompt, sample: the prompt and the text sampled after it from the best checkpoint
            ("" when ``sample_tokens`` is 0, and on ranks other than 0).
        rank: this process's torchrun rank (0 for a single process).
        start_step: the step a resumed run continued after (0 for a new run); ``steps - start_step``
            steps were trained by this call.
    """

    run_dir: Path
    best_dir: Path
    final: EvalResult
    steps: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    sample_prompt: str
    sample: str
    rank: int = 0
    start_step: int = 0


def train(run: RunConfig, *, progress: bool = True, log: Callable[[str], None] | None = None,
          resume: bool = False, allow_data_change: bool = False, task=None) -> TrainResult:
    """Train a Transformer-XL language model as described by ``run`` and report validation with memory.

    Writes into ``run.train.out_dir``: ``run.json`` (resolved config), ``metrics.csv`` (one row per
    ``log_interval`` steps and per validation), ``best/`` and ``last/`` checkpoints (plus
    ``keep_last - 1`` older ``last.<step>/``). ``last/`` holds the trainer state (optimizer, RNG states,
    data position, memory), so ``resume=True`` continues a run from its newest intact checkpoint
    exactly as if it had not stopped (float32, same device, number of ranks and CPU threads; shuffled-sentence
    corpora restart their shard order). A resumed ``run`` that differs from the saved ``run.json`` (changes
    the CLI accepts with ``--allow-config-change``) is written to it once its checks pass, so it is the
    run's config from then on. SIGINT/SIGTERM finish the current step, write ``last/`` and
    raise :class:`KeyboardInterrupt`.

    Started by torchrun (``WORLD_SIZE`` > 1), every rank runs this function: each owns
    ``batch_size / world`` consecutive streams and their memory, DistributedDataParallel averages
    the gradients, validation is split over the ranks, and rank 0 alone writes files and logs.

    Before anything is read or written, rank 0 claims ``out_dir`` (:func:`txl.fileio.claim_folder`):
    a second run on the same folder, new or resumed, is refused while this one runs; the claim is
    released when this function returns or raises (and dies with the process).

    torch's CPU threads follow ``train.threads`` (0: :func:`txl.runtime.choose_threads` picks them from
    the free CPUs), said in the ``model:`` line, and are set back when this function returns.

    A new run needs a new or empty ``out_dir``; txl never deletes or replaces a file or folder of
    the run directory that it did not write (:func:`txl.training.checkpoint_files.check_run_folder`).
    Every checkpoint records the size and sha256 of the data (:mod:`txl.training.fingerprint`); a
    resumed run whose data differ is refused unless ``allow_data_change`` (then one warning line).
    A ``metrics.csv`` row is written before the checkpoint of its step, so a kill between the two
    loses no row. A checkpoint is never written with NaN or infinite weights.

    ``task``: the task to train (see :mod:`txl.training.lm_task` for the interface), e.g.
    :class:`txl.training.lm_task.LMTask`; None: the one ``run`` describes (:func:`~txl.training.setup.make_task`).
    A given task is not recorded in ``run.json``: resuming such a run needs the same task again.

    Raises:
        TxlError: bad config or data, an ``out_dir`` that already holds a run or anything else (or,
            with ``resume``, one without a resumable checkpoint, or whose data changed), an
            ``out_dir`` in use by another process (or inside a checkpoint or run folder, or an input
            folder), a checkpoint that cannot be written (or whose weights are not finite).
    """
    claims: list[FolderClaim] = []
    threads = torch.get_num_threads()  # train.threads holds for this run only
    try:
        return _train(run, progress=progress, log=log, resume=resume, claims=claims,
                      allow_data_change=allow_data_change, task=task)
    finally:
        for claim in claims:
            claim.release()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


@dataclass(slots=True)
class _Run:
    """What a training run is made of (none of it changes between steps); :func:`_start` adds ``ddp``, the
    progress bar and, on rank 0 alone, where the metric rows go (``metrics``: metrics.csv, TensorBoard)."""

    run: RunConfig
    d: distributed.Dist
    device: torch.device
    out_dir: Path
    log: Callable[[str], None]
    resume: bool
    created: bool  # rank 0's claim created out_dir (removed again by a new run that fails before any checkpoint)
    candidates: list[Path]  # a resumed run's last/ checkpoints, newest first ([] for a new run)
    resume_dir: Path | None  # the first intact one of them, resumed
    task: Any
    unit: str
    fingerprint: Any  # the data's (:mod:`txl.training.fingerprint`)
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    generator: torch.Generator  # segment lengths: identical on every rank
    batches: Any
    rows: slice  # this rank's rows of the global batch
    ddp: torch.nn.Module | None = None  # what the steps call: the task's objective, in DDP, compiled (:func:`_start`)
    metrics: Any = None
    bar: Any = None


@dataclass(slots=True)
class _Progress:
    """The state the steps carry from one to the next and write into ``last/``."""

    state: dict[str, Any]  # state.json (and trainer.json)'s dict
    start_step: int  # the step a resumed run continues after (0 for a new run)
    step: int  # the step being trained (``start_step`` before the first)
    pos: int  # data position
    mems: list[torch.Tensor] | None  # this rank's rows of the memory
    best: float  # the best validation loss so far
    span: Any  # the phase of train.tgt_len_schedule in force (set each step)
    total_tokens: torch.Tensor  # on the device: no sync per step
    start: float  # perf_counter() at the run's start (a resumed run's clock goes on)
    window_loss: Any  # summed loss, tokens before, start of the logging window
    window_tokens: int
    window_start: float
    window_recon: Any = 0.0  # attention-reconstruction loss (compressed memory) in the window
    window_steps: int = 0
    bad_in_a_row: int = 0  # non-finite steps in a row


def _train(run: RunConfig, *, progress: bool, log: Callable[[str], None] | None, resume: bool,
           claims: list[FolderClaim], allow_data_change: bool = False, task=None) -> TrainResult:
    """:func:`train`; the folder claim it takes is appended to ``claims`` (released by the caller)."""
    d = distributed.from_environment()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if not d.is_main:
        log = lambda msg: None  # noqa: E731 - rank 0 speaks for the run
    setup.check_run(run, d)
    t = run.train
    if t.deterministic:  # cuBLAS needs a fixed workspace for deterministic matmuls (read when CUDA starts)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    seed_everything(t.seed)
    device = distributed.device_for(d, resolve_device(t.device))
    created, candidates, resume_dir = setup.claim_run_folder(run, d, resume=resume, claims=claims, task=task, log=log)

    # torchrun's ranks: OMP_NUM_THREADS shares the CPUs; a resumed run keeps the count it recorded (automatic
    # choices follow the load, and another count changes the losses in their last digits)
    threads = set_threads(t.threads, flag="train.threads", keep=setup.recorded_threads(resume_dir) if resume else None)
    task = setup.make_task(run, progress=bool(progress and d.is_main)) if task is None else task
    fingerprint = task.fingerprint()  # recorded in every checkpoint, compared when resuming
    unit = task.unit
    run, spans = setup.run_for_task(run, task)
    task.check(run, spans)
    log(task.describe())

    distributed.init(d, device)
    model = setup.build_model(run, d, device, task, spans, resume=resume)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters, {run.model.n_layer} layers, d_model {run.model.d_model}, "
        f"attn_type {run.model.attn_type}; device {device}, dtype {t.dtype}; {threads}"
        + (f"; {d.world} processes" if d.enabled else ""))
    optimizer = make_optimizer(model, t.lr, t.weight_decay)
    # every rank reads the same global batch and keeps its own rows (same data as one process)
    batches = task.batches(run, device)
    rows = d.rows(t.batch_size)
    generator = torch.Generator().manual_seed(t.seed)  # segment lengths: identical on every rank
    if d.rank:  # dropout differs between ranks; rank 0 draws exactly what a single process would
        torch.manual_seed(t.seed + 7919 * d.rank)
    # float16 needs loss scaling against gradient underflow; for other dtypes the scaler is a no-op
    scaler = torch.amp.GradScaler(device.type, enabled=t.dtype == "float16")
    r = _Run(run=run, d=d, device=device, out_dir=Path(t.out_dir), log=log, resume=resume, created=created,
             candidates=candidates, resume_dir=resume_dir, task=task, unit=unit, fingerprint=fingerprint,
             model=model, optimizer=optimizer, scaler=scaler, generator=generator, batches=batches, rows=rows)

    p = _start(r, progress=progress, allow_data_change=allow_data_change)
    _run_steps(r, p)
    return _finish(r, p, progress=progress)


def _start(r: _Run, *, progress: bool, allow_data_change: bool) -> _Progress:
    """The state before the first step trained here (a resumed run's from its checkpoint); sets ``r.ddp``,
    rank 0's ``run.json`` and ``metrics.csv``, and the progress bar."""
    t = r.run.train
    state: dict[str, Any] = {"step": 0, "tokens": 0, "best_val_loss": None, "unit": r.unit, DATA_KEY: r.fingerprint,
                             "threads": torch.get_num_threads()}
    pos, mems, best, start_step = 0, None, float("inf"), 0
    span = r.model.config.span  # the phase of train.tgt_len_schedule in force (set each step)
    if r.resume:
        start_step, pos, mems, state, best = restore_run(
            r.resume_dir, r.candidates, model=r.model, optimizer=r.optimizer, scaler=r.scaler, generator=r.generator,
            device=r.device, d=r.d, rows=r.rows, batch_size=t.batch_size, dtype=t.dtype, seed=t.seed, task=r.task,
            unit=r.unit, fingerprint=r.fingerprint, allow_data_change=allow_data_change, log=r.log)
        r.log(f"resuming {r.out_dir} after step {start_step} (from {r.resume_dir.name}/)")
    r.ddp = r.task.objective(r.model)
    if r.d.enabled:
        r.ddp = torch.nn.parallel.DistributedDataParallel(r.ddp, device_ids=[r.device.index]
                                                          if r.device.type == "cuda" else None)
    if t.compile:  # the checkpoints are still written from `model` (no "_orig_mod." names)
        r.ddp = compile_module(r.ddp)
    if r.d.is_main:
        r.metrics = _open_run_files(r, start_step)

    total_tokens = torch.tensor(state["tokens"], dtype=torch.int64, device=r.device)  # on the device: no sync per step
    window_loss, window_tokens, window_start = 0.0, state["tokens"], time.perf_counter()
    if "window" in state:  # resumed inside a logging window: its first row averages the whole window again
        saved_loss, window_tokens, window_elapsed = state["window"]
        window_loss, window_start = saved_loss, window_start - window_elapsed
    start = time.perf_counter() - float(state.get("elapsed_s") or 0.0)  # a resumed run's clock goes on
    r.bar = progress_bar(t.max_steps, bool(progress and r.d.is_main), "", unit="it", initial=start_step, leave=True)
    return _Progress(state=state, start_step=start_step, step=start_step, pos=pos, mems=mems, best=best, span=span,
                     total_tokens=total_tokens, start=start, window_loss=window_loss, window_tokens=window_tokens,
                     window_start=window_start)


def _open_run_files(r: _Run, start_step: int):
    """Rank 0: writes ``run.json`` (a resumed run's accepted changes), opens ``metrics.csv`` (and TensorBoard's
    event files with ``train.log``); returns the :class:`~txl.training.runlog.MetricsLog`."""
    r.out_dir.mkdir(parents=True, exist_ok=True)
    if not r.resume:
        write_json(r.out_dir / RUN_NAME, r.run.to_dict())
    else:  # accepted changes (--allow-config-change) are the run's config from now on
        changes = record_resumed_config(r.out_dir / RUN_NAME, r.run.to_dict())
        if changes:
            r.log(f"the run's config from now on (written to {r.out_dir / RUN_NAME}): {', '.join(changes)}")
    return MetricsLog(r.out_dir, start_step, r.run.train.log)


def _run_steps(r: _Run, p: _Progress) -> None:
    """The steps after ``p.start_step`` up to ``train.max_steps``. SIGINT/SIGTERM finish the step, write
    ``last/`` and raise :class:`KeyboardInterrupt`; a new run that fails (or is interrupted before a step
    finished) leaves no ``run.json`` or ``metrics.csv`` behind when it wrote no checkpoint."""
    r.model.train()
    stop = StopRequest()
    try:
        for p.step in range(p.start_step + 1, r.run.train.max_steps + 1):
            if _step(r, p, stop):  # Ctrl-C or SIGTERM (on any rank) during this step: every rank stops after it
                stop.requested = True
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        _close_outputs(r)
        if p.step == p.start_step or not stop.requested:  # nothing finished, or a second Ctrl-C mid-step
            if not r.resume and p.step == p.start_step and r.d.is_main:
                remove_unfinished(r.out_dir, r.created, (RUN_NAME, "metrics.csv", TENSORBOARD_DIR))
            r.log(f"interrupted; the last checkpoint in {r.out_dir} is kept as it was")
            raise
        _save_last(r, p, {"interrupted": True})
        r.log(f"interrupted after step {p.step}; checkpoint written to {r.out_dir / 'last'} (continue with --resume)")
        raise
    except Exception:
        _close_outputs(r)
        if not r.resume and r.d.is_main:
            remove_unfinished(r.out_dir, r.created, (RUN_NAME, "metrics.csv", TENSORBOARD_DIR))
        raise
    finally:
        stop.restore()
    _close_outputs(r)


def _close_outputs(r: _Run) -> None:
    """The progress bar and the metric files closed."""
    r.bar.close()
    if r.metrics:
        r.metrics.close()


def _step(r: _Run, p: _Progress, stop: StopRequest) -> bool:
    """Step ``p.step``: one optimizer update on the next batch, then its metrics row, validation and
    checkpoint when due. Returns whether SIGINT/SIGTERM arrived (on any rank) during it."""
    t = r.run.train
    tgt_len, mem_len = segment_span(p.step, t.tgt_len_schedule, r.run.model.tgt_len, r.run.model.mem_len)
    p.span = r.model.config.span.replace(tgt_len=tgt_len, mem_len=mem_len)
    x, y, p.pos, fresh = r.batches.next(p.pos, tgt_len, r.generator)
    if fresh:
        p.mems = None
    n_tok = (y != IGNORE_INDEX).sum()  # the global batch's targets
    lr = learning_rate(p.step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, max_steps=t.max_steps)
    for group in r.optimizer.param_groups:
        group["lr"] = lr
    out = train_step(r.ddp, x[r.rows], y[r.rows], p.mems, n_global=n_tok, optimizer=r.optimizer, scaler=r.scaler,
                     clip=t.clip, dtype=t.dtype, chunks=t.grad_accum_steps, d=r.d, stop=stop.requested,
                     span=p.span)
    if out.finite:
        p.bad_in_a_row = 0
        p.mems = out.mems
        p.total_tokens += n_tok
        p.window_loss = p.window_loss + out.loss_sum
        if out.recon_loss is not None:
            p.window_recon, p.window_steps = p.window_recon + out.recon_loss, p.window_steps + 1
    else:
        _skip_step(r, p, out)
    r.bar.update(1)
    row = None
    if p.step % t.log_interval == 0 or p.step == t.max_steps:
        row = _window_row(r, p, lr, tgt_len, mem_len)
    if p.step % t.eval_interval == 0 or p.step == t.max_steps:
        _validate(r, p, row)
    else:
        _write_row(r, row)
        if t.save_interval and p.step % t.save_interval == 0:
            _save_last(r, p)
    return out.stop


def _skip_step(r: _Run, p: _Progress, out: StepResult) -> None:
    """A step whose loss was not finite was skipped: no update; the data moved on, so the memory starts
    afresh. ``train.max_bad_steps`` of them in a row end the run."""
    t = r.run.train
    p.mems = None
    p.bad_in_a_row += 1
    p.state["skipped_steps"] = p.state.get("skipped_steps", 0) + 1
    what = (f"loss is {float(out.loss_sum)}" if out.recon_finite else "attention-reconstruction term "
            f"(model.recon_loss_weight {r.run.model.recon_loss_weight} × reconstruction loss) is not finite")
    if r.d.is_main:
        r.bar.write(f"step {p.step}: {what}, step skipped ({p.bad_in_a_row} in a row)", file=sys.stderr)
    if p.bad_in_a_row >= t.max_bad_steps and not out.recon_finite:
        raise TxlError(f"the {what} for {p.bad_in_a_row} steps in a row (up to step {p.step}); lower "
                       "model.recon_loss_weight (default 1.0) and start again (or --resume with "
                       "--allow-config-change)")
    if p.bad_in_a_row >= t.max_bad_steps:
        raise TxlError(f"the loss was not finite for {p.bad_in_a_row} steps in a row (up to step {p.step}); "
                       "lower train.lr, raise train.warmup_steps or check the data")


def _window_row(r: _Run, p: _Progress, lr: float, tgt_len: int, mem_len: int) -> dict[str, Any]:
    """The metrics row of the logging window that ends with this step (its loss and speed, also shown on the
    progress bar); the next window starts."""
    now = time.perf_counter()
    state = p.state
    state["tokens"] = int(p.total_tokens)
    count = state["tokens"] - p.window_tokens
    train_loss = float(p.window_loss) / max(1, count)
    speed = count / max(1e-9, now - p.window_start)
    row = {"step": p.step, "tokens": state["tokens"], "elapsed_s": round(now - p.start, 3), "lr": lr,
           "tgt_len": tgt_len, "mem_len": mem_len, "train_loss": train_loss,
           "train_metric": metric_value(train_loss, r.unit), "tokens_per_s": round(speed, 1)}
    if p.window_steps:
        row["recon_loss"] = float(p.window_recon) / p.window_steps
        p.window_recon, p.window_steps = 0.0, 0
    r.bar.set_postfix_str(f"loss {train_loss:.3f} {r.unit} {metric_value(train_loss, r.unit):.3f} "
                          f"lr {lr:.2e} {speed:,.0f} tok/s", refresh=sys.stderr.isatty())  # a log: every 30 s
    p.window_loss, p.window_tokens, p.window_start = 0.0, state["tokens"], now
    return row


def _validate(r: _Run, p: _Progress, row: dict[str, Any] | None) -> None:
    """Validation after step ``p.step``: its metrics row (``row`` with the validation added), then the
    checkpoints; a non-finite validation loss writes ``last/`` and ends the run."""
    res = r.task.validate(r.model, r.run, p.span, r.d)  # valid split (train.eval_max_tokens) at the training span
    r.model.train()
    row = row or {"step": p.step, "tokens": int(p.total_tokens), "elapsed_s": round(time.perf_counter() - p.start, 3)}
    row.update(val_loss=res.loss, val_metric=metric_value(res.loss, r.unit))
    _write_row(r, row)  # the row first: a kill after the checkpoint must not lose it
    if not math.isfinite(res.loss):
        _save_last(r, p)
        raise TxlError(f"the validation loss is {res.loss} at step {p.step}: training diverged; lower "
                       f"train.lr or raise train.warmup_steps (last state written to {r.out_dir / 'last'})")
    if r.d.is_main:
        r.bar.write(f"step {p.step}: valid {r.unit} {res.value:.4f} ({runlog.eval_scope(res)})", file=sys.stderr)
    _save_validated(r, p, res)
    p.window_start = time.perf_counter()  # do not count evaluation time as training speed


def _write_row(r: _Run, row: dict[str, Any] | None) -> None:
    """A step's metrics.csv row; written before that step's checkpoint, so that no kill loses it
    (a resumed run drops the rows after its checkpoint and writes them again)."""
    if row and r.metrics is not None:
        r.metrics.write({**row, "unit": r.unit})


def _save_validated(r: _Run, p: _Progress, res: EvalResult) -> None:
    """After a finite validation: ``best/`` when it is the best so far, then ``last/``."""
    p.state.update(step=p.step, tokens=int(p.total_tokens), val_loss=res.loss, val_metric=res.value,
                   elapsed_s=time.perf_counter() - p.start)
    if res.loss < p.best:
        p.best = res.loss
        p.state["best_val_loss"] = p.best
        _write_checkpoint(r, p, "best", 1, trainer=False)
    _save_last(r, p)


def _save_last(r: _Run, p: _Progress, extra_state: dict[str, Any] | None = None) -> None:
    """``last/`` with the trainer state after step ``p.step`` (``extra_state`` added to its state)."""
    p.state.update(step=p.step, tokens=int(p.total_tokens), elapsed_s=time.perf_counter() - p.start,
                   window=[float(p.window_loss), p.window_tokens, time.perf_counter() - p.window_start],
                   **(extra_state or {}))
    _write_checkpoint(r, p, "last", r.run.train.keep_last, trainer=True)


def _write_checkpoint(r: _Run, p: _Progress, name: str, keep: int, trainer: bool) -> None:
    """Every rank calls this (memory and RNG states are gathered); rank 0 writes."""
    d = r.d
    full_mems = [distributed.gather_rows(d, m) for m in p.mems] if (trainer and p.mems is not None) else p.mems
    rng = distributed.gather_objects(d, rank_rng_state(r.device)) if trainer else None
    error = None
    files = functools.partial(_checkpoint_files, r, p, trainer=trainer, mems=full_mems, rank_rng=rng)
    if d.is_main:
        try:  # save_checkpoint refuses non-finite weights: said here as the run's divergence
            save_checkpoint(r.out_dir / name, r.model, r.task.tokenizer, r.run, dict(p.state), keep=keep, span=p.span,
                            extra=files)
        except NonFiniteWeights as err:
            error = runlog.diverged(p.step, err.names, r.out_dir, r.run)
        except TxlError as err:
            error = str(err)
    error = distributed.broadcast_object(d, error)
    if error:
        raise TxlError(error)


def _checkpoint_files(r: _Run, p: _Progress, folder: Path, *, trainer: bool, mems: list[torch.Tensor] | None,
                      rank_rng: list | None) -> None:
    """A checkpoint's files besides the model: the task's own (e.g. a classifier's classifier.json) and, with
    ``trainer``, the trainer state (``mems``: every rank's rows, ``rank_rng``: every rank's RNG states)."""
    task_files = getattr(r.task, "checkpoint_files", None)
    if task_files is not None:
        task_files(folder, r.model)
    if trainer:
        save_trainer_state(folder, optimizer=r.optimizer, scaler=r.scaler, generator=r.generator, mems=mems,
                           position=p.pos, step=p.step, state=dict(p.state), rank_rng=rank_rng)


def _finish(r: _Run, p: _Progress, *, progress: bool) -> TrainResult:
    """After the last step: the best checkpoint evaluated with the ``[eval]`` settings (and sampled from)."""
    wall = time.perf_counter() - p.start  # training wall-clock time, earlier sessions of a resumed run included
    p.state["tokens"] = int(p.total_tokens)

    distributed.barrier(r.d)  # best/ is complete on disk for every rank
    best_dir = r.out_dir / "best"
    if r.resume and not best_dir.is_dir():  # already complete before its first validation: its last/, as txl eval
        best_dir = r.resume_dir
    load = getattr(r.task, "load_model", None)
    best_model = (load_checkpoint(best_dir, map_location=str(r.device)).model if load is None
                  else load(best_dir, r.device))
    final = r.task.final(best_model, r.run, r.d, progress=progress and r.d.is_main)
    prompt, sample = "", ""
    if r.run.train.sample_tokens and r.d.is_main:
        prompt, sample = r.task.sample(best_model, r.run)
    distributed.shutdown(r.d)
    return TrainResult(run_dir=r.out_dir, best_dir=best_dir, final=final, steps=p.step, tokens=p.state["tokens"],
                       wall_s=wall, tokens_per_s=p.state["tokens"] / wall, sample_prompt=prompt,
                       sample=sample, rank=r.d.rank, start_step=p.start_step)


def finetune(init: str | Path, data: str | Path | None = None, *, out_dir: str | Path,
             config: str | Path | None = None, overrides: Sequence[str] = (), progress: bool = True,
             log=None, resume: bool = False, allow_data_change: bool = False):
    """Fine-tune the language model ``init`` on prompt/completion pairs; the Python form of ``txl finetune``.

    Returns :func:`txl.training.loop.train`'s :class:`~txl.training.loop.TrainResult` (``final`` is
    the completion loss on ``eval.split``). ``resume=True`` continues the run in ``out_dir`` from its
    saved config (``init``, ``data``, ``config`` and ``overrides`` are then not used); pairs files that
    changed since its checkpoint are refused unless ``allow_data_change``.

    Raises:
        TxlError: as :func:`finetune_config` and :func:`txl.training.loop.train`.
    """
    from txl.fileio import read_json_object
    from txl.training.finetune import finetune_config

    if resume:
        run = RunConfig.from_dict(read_json_object(Path(out_dir) / RUN_NAME))
        run.train.out_dir = str(out_dir)
    else:
        run = finetune_config(init, data, out_dir=out_dir, config=config, overrides=overrides)
    return train(run, progress=progress, log=log, resume=resume, allow_data_change=allow_data_change)
