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
from txl.training.lm_task import LMTask, sample_text, shuffled_batches  # noqa: F401 - public here too
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
        trainer = _Trainer(run, progress=progress, log=log, resume=resume, claims=claims,
                           allow_data_change=allow_data_change, task=task)
        trainer.start()
        trainer.run_steps()
        return trainer.finish()
    finally:
        for claim in claims:
            claim.release()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


class _Trainer:
    """One run of :func:`train`.

    ``__init__`` sets up what the run is made of (none of it changes between steps; the folder claim it
    takes is appended to ``claims``, released by the caller). :meth:`start` adds what the steps call
    (``ddp``: the task's objective, in DDP, compiled), the progress bar, rank 0's metric outputs
    (``metrics``: metrics.csv, TensorBoard) and the state the steps carry from one to the next and write
    into ``last/``. :meth:`run_steps` trains, :meth:`finish` evaluates the best checkpoint.
    """

    def __init__(self, run: RunConfig, *, progress: bool, log: Callable[[str], None] | None, resume: bool,
                 claims: list[FolderClaim], allow_data_change: bool, task) -> None:
        self.d = d = distributed.from_environment()
        log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.log = log if d.is_main else (lambda msg: None)  # rank 0 speaks for the run
        setup.check_run(run, d)
        t = run.train
        if t.deterministic:  # cuBLAS needs a fixed workspace for deterministic matmuls (read when CUDA starts)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        seed_everything(t.seed)
        self.device = device = distributed.device_for(d, resolve_device(t.device))
        self.progress, self.resume, self.allow_data_change = progress, resume, allow_data_change
        self.out_dir = Path(t.out_dir)
        # created: rank 0's claim created out_dir (removed again by a new run that fails before any checkpoint);
        # candidates: a resumed run's last/ checkpoints, newest first ([] for a new run); resume_dir: the first
        # intact one of them, resumed
        self.created, self.candidates, self.resume_dir = setup.claim_run_folder(run, d, resume=resume, claims=claims,
                                                                                task=task, log=self.log)

        # torchrun's ranks: OMP_NUM_THREADS shares the CPUs; a resumed run keeps the count it recorded (automatic
        # choices follow the load, and another count changes the losses in their last digits)
        keep = setup.recorded_threads(self.resume_dir) if resume else None
        threads = set_threads(t.threads, flag="train.threads", keep=keep)
        self.task = task = setup.make_task(run, progress=bool(progress and d.is_main)) if task is None else task
        self.fingerprint = task.fingerprint()  # recorded in every checkpoint, compared when resuming
        self.unit = task.unit
        self.run, spans = setup.run_for_task(run, task)
        task.check(self.run, spans)
        self.log(task.describe())

        distributed.init(d, device)
        self.model = setup.build_model(self.run, d, device, task, spans, resume=resume)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model: {n_params / 1e6:.2f}M parameters, {run.model.n_layer} layers, d_model {run.model.d_model}, "
                 f"attn_type {run.model.attn_type}; device {device}, dtype {t.dtype}; {threads}"
                 + (f"; {d.world} processes" if d.enabled else ""))
        self.optimizer = make_optimizer(self.model, t.lr, t.weight_decay)
        # every rank reads the same global batch and keeps its own rows (same data as one process)
        self.batches = task.batches(self.run, device)
        self.rows = d.rows(t.batch_size)
        self.generator = torch.Generator().manual_seed(t.seed)  # segment lengths: identical on every rank
        if d.rank:  # dropout differs between ranks; rank 0 draws exactly what a single process would
            torch.manual_seed(t.seed + 7919 * d.rank)
        # float16 needs loss scaling against gradient underflow; for other dtypes the scaler is a no-op
        self.scaler = torch.amp.GradScaler(device.type, enabled=t.dtype == "float16")

    def start(self) -> None:
        """The state before the first step trained here (a resumed run's from its checkpoint), the objective
        the steps call, rank 0's ``run.json`` and ``metrics.csv``, and the progress bar."""
        t = self.run.train
        self.state: dict[str, Any] = {"step": 0, "tokens": 0, "best_val_loss": None, "unit": self.unit,
                                      DATA_KEY: self.fingerprint, "threads": torch.get_num_threads()}
        self.pos, self.mems, self.best, self.start_step = 0, None, float("inf"), 0  # mems: this rank's rows
        self.span = self.model.config.span  # the phase of train.tgt_len_schedule in force (set each step)
        if self.resume:
            self.start_step, self.pos, self.mems, self.state, self.best = restore_run(self)
            self.log(f"resuming {self.out_dir} after step {self.start_step} (from {self.resume_dir.name}/)")
        self.step = self.start_step  # the step being trained
        self.ddp = self.task.objective(self.model)
        if self.d.enabled:
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.ddp, device_ids=[self.device.index]
                                                                 if self.device.type == "cuda" else None)
        if t.compile:  # the checkpoints are still written from `model` (no "_orig_mod." names)
            self.ddp = compile_module(self.ddp)
        self.metrics = self._open_run_files() if self.d.is_main else None

        # on the device: no sync per step
        self.total_tokens = torch.tensor(self.state["tokens"], dtype=torch.int64, device=self.device)
        # the logging window: summed loss, tokens before it, its start; attention-reconstruction loss (compressed
        # memory) summed over its steps
        self.window_loss, self.window_tokens, self.window_start = 0.0, self.state["tokens"], time.perf_counter()
        self.window_recon, self.window_steps = 0.0, 0
        if "window" in self.state:  # resumed inside a logging window: its first row averages the whole window again
            saved_loss, self.window_tokens, window_elapsed = self.state["window"]
            self.window_loss, self.window_start = saved_loss, self.window_start - window_elapsed
        # perf_counter() at the run's start (a resumed run's clock goes on)
        self.started = time.perf_counter() - float(self.state.get("elapsed_s") or 0.0)
        self.bad_in_a_row = 0  # non-finite steps in a row
        self.bar = progress_bar(t.max_steps, bool(self.progress and self.d.is_main), "", unit="it",
                                initial=self.start_step, leave=True)

    def _open_run_files(self):
        """Rank 0: writes ``run.json`` (a resumed run's accepted changes), opens ``metrics.csv`` (and TensorBoard's
        event files with ``train.log``); returns the :class:`~txl.training.runlog.MetricsLog`."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            write_json(self.out_dir / RUN_NAME, self.run.to_dict())
        else:  # accepted changes (--allow-config-change) are the run's config from now on
            changes = record_resumed_config(self.out_dir / RUN_NAME, self.run.to_dict())
            if changes:
                self.log(f"the run's config from now on (written to {self.out_dir / RUN_NAME}): {', '.join(changes)}")
        return MetricsLog(self.out_dir, self.start_step, self.run.train.log)

    def run_steps(self) -> None:
        """The steps after ``start_step`` up to ``train.max_steps``. SIGINT/SIGTERM finish the step, write
        ``last/`` and raise :class:`KeyboardInterrupt`; a new run that fails (or is interrupted before a step
        finished) leaves no ``run.json`` or ``metrics.csv`` behind when it wrote no checkpoint."""
        self.model.train()
        stop = StopRequest()
        try:
            for self.step in range(self.start_step + 1, self.run.train.max_steps + 1):
                if self._step(stop):  # Ctrl-C or SIGTERM (on any rank) during this step: every rank stops after it
                    stop.requested = True
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            self._close_outputs()
            if self.step == self.start_step or not stop.requested:  # nothing finished, or a second Ctrl-C mid-step
                if not self.resume and self.step == self.start_step and self.d.is_main:
                    remove_unfinished(self.out_dir, self.created, (RUN_NAME, "metrics.csv", TENSORBOARD_DIR))
                self.log(f"interrupted; the last checkpoint in {self.out_dir} is kept as it was")
                raise
            self._save_last({"interrupted": True})
            self.log(f"interrupted after step {self.step}; checkpoint written to {self.out_dir / 'last'} "
                     "(continue with --resume)")
            raise
        except Exception:
            self._close_outputs()
            if not self.resume and self.d.is_main:
                remove_unfinished(self.out_dir, self.created, (RUN_NAME, "metrics.csv", TENSORBOARD_DIR))
            raise
        finally:
            stop.restore()
        self._close_outputs()

    def _close_outputs(self) -> None:
        """The progress bar and the metric files closed."""
        self.bar.close()
        if self.metrics:
            self.metrics.close()

    def _step(self, stop: StopRequest) -> bool:
        """Step ``self.step``: one optimizer update on the next batch, then its metrics row, validation and
        checkpoint when due. Returns whether SIGINT/SIGTERM arrived (on any rank) during it."""
        t = self.run.train
        tgt_len, mem_len = segment_span(self.step, t.tgt_len_schedule, self.run.model.tgt_len, self.run.model.mem_len)
        self.span = self.model.config.span.replace(tgt_len=tgt_len, mem_len=mem_len)
        x, y, self.pos, fresh = self.batches.next(self.pos, tgt_len, self.generator)
        if fresh:
            self.mems = None
        n_tok = (y != IGNORE_INDEX).sum()  # the global batch's targets
        lr = learning_rate(self.step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, max_steps=t.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        out = train_step(self.ddp, x[self.rows], y[self.rows], self.mems, n_global=n_tok, optimizer=self.optimizer,
                         scaler=self.scaler, clip=t.clip, dtype=t.dtype, chunks=t.grad_accum_steps, d=self.d,
                         stop=stop.requested, span=self.span)
        if out.finite:
            self.bad_in_a_row = 0
            self.mems = out.mems
            self.total_tokens += n_tok
            self.window_loss = self.window_loss + out.loss_sum
            if out.recon_loss is not None:
                self.window_recon, self.window_steps = self.window_recon + out.recon_loss, self.window_steps + 1
        else:
            self._skip_step(out)
        self.bar.update(1)
        row = None
        if self.step % t.log_interval == 0 or self.step == t.max_steps:
            row = self._window_row(lr, tgt_len, mem_len)
        if self.step % t.eval_interval == 0 or self.step == t.max_steps:
            self._validate(row)
        else:
            self._write_row(row)
            if t.save_interval and self.step % t.save_interval == 0:
                self._save_last()
        return out.stop

    def _skip_step(self, out: StepResult) -> None:
        """A step whose loss was not finite was skipped: no update; the data moved on, so the memory starts
        afresh. ``train.max_bad_steps`` of them in a row end the run."""
        self.mems = None
        self.bad_in_a_row += 1
        self.state["skipped_steps"] = self.state.get("skipped_steps", 0) + 1
        what = (f"loss is {float(out.loss_sum)}" if out.recon_finite else "attention-reconstruction term "
                f"(model.recon_loss_weight {self.run.model.recon_loss_weight} × reconstruction loss) is not finite")
        if self.d.is_main:
            self.bar.write(f"step {self.step}: {what}, step skipped ({self.bad_in_a_row} in a row)", file=sys.stderr)
        if self.bad_in_a_row >= self.run.train.max_bad_steps and not out.recon_finite:
            raise TxlError(f"the {what} for {self.bad_in_a_row} steps in a row (up to step {self.step}); lower "
                           "model.recon_loss_weight (default 1.0) and start again (or --resume with "
                           "--allow-config-change)")
        if self.bad_in_a_row >= self.run.train.max_bad_steps:
            raise TxlError(f"the loss was not finite for {self.bad_in_a_row} steps in a row (up to step {self.step}); "
                           "lower train.lr, raise train.warmup_steps or check the data")

    def _window_row(self, lr: float, tgt_len: int, mem_len: int) -> dict[str, Any]:
        """The metrics row of the logging window that ends with this step (its loss and speed, also shown on the
        progress bar); the next window starts."""
        now = time.perf_counter()
        state = self.state
        state["tokens"] = int(self.total_tokens)
        count = state["tokens"] - self.window_tokens
        train_loss = float(self.window_loss) / max(1, count)
        speed = count / max(1e-9, now - self.window_start)
        row = {"step": self.step, "tokens": state["tokens"], "elapsed_s": round(now - self.started, 3), "lr": lr,
               "tgt_len": tgt_len, "mem_len": mem_len, "train_loss": train_loss,
               "train_metric": metric_value(train_loss, self.unit), "tokens_per_s": round(speed, 1)}
        if self.window_steps:
            row["recon_loss"] = float(self.window_recon) / self.window_steps
            self.window_recon, self.window_steps = 0.0, 0
        self.bar.set_postfix_str(f"loss {train_loss:.3f} {self.unit} {metric_value(train_loss, self.unit):.3f} "
                                 f"lr {lr:.2e} {speed:,.0f} tok/s", refresh=sys.stderr.isatty())  # a log: every 30 s
        self.window_loss, self.window_tokens, self.window_start = 0.0, state["tokens"], now
        return row

    def _validate(self, row: dict[str, Any] | None) -> None:
        """Validation after step ``self.step``: its metrics row (``row`` with the validation added), then the
        checkpoints; a non-finite validation loss writes ``last/`` and ends the run."""
        # the valid split (train.eval_max_tokens) at the training span
        res = self.task.validate(self.model, self.run, self.span, self.d)
        self.model.train()
        row = row or {"step": self.step, "tokens": int(self.total_tokens),
                      "elapsed_s": round(time.perf_counter() - self.started, 3)}
        row.update(val_loss=res.loss, val_metric=metric_value(res.loss, self.unit))
        self._write_row(row)  # the row first: a kill after the checkpoint must not lose it
        if not math.isfinite(res.loss):
            self._save_last()
            raise TxlError(f"the validation loss is {res.loss} at step {self.step}: training diverged; lower "
                           f"train.lr or raise train.warmup_steps (last state written to {self.out_dir / 'last'})")
        if self.d.is_main:
            self.bar.write(f"step {self.step}: valid {self.unit} {res.value:.4f} ({runlog.eval_scope(res)})",
                           file=sys.stderr)
        self._save_validated(res)
        self.window_start = time.perf_counter()  # do not count evaluation time as training speed

    def _write_row(self, row: dict[str, Any] | None) -> None:
        """A step's metrics.csv row; written before that step's checkpoint, so that no kill loses it
        (a resumed run drops the rows after its checkpoint and writes them again)."""
        if row and self.metrics is not None:
            self.metrics.write({**row, "unit": self.unit})

    def _save_validated(self, res: EvalResult) -> None:
        """After a finite validation: ``best/`` when it is the best so far, then ``last/``."""
        self.state.update(step=self.step, tokens=int(self.total_tokens), val_loss=res.loss, val_metric=res.value,
                          elapsed_s=time.perf_counter() - self.started)
        if res.loss < self.best:
            self.best = res.loss
            self.state["best_val_loss"] = self.best
            self._write_checkpoint("best", 1, trainer=False)
        self._save_last()

    def _save_last(self, extra_state: dict[str, Any] | None = None) -> None:
        """``last/`` with the trainer state after step ``self.step`` (``extra_state`` added to its state)."""
        self.state.update(step=self.step, tokens=int(self.total_tokens), elapsed_s=time.perf_counter() - self.started,
                          window=[float(self.window_loss), self.window_tokens, time.perf_counter() - self.window_start],
                          **(extra_state or {}))
        self._write_checkpoint("last", self.run.train.keep_last, trainer=True)

    def _write_checkpoint(self, name: str, keep: int, trainer: bool) -> None:
        """Every rank calls this (memory and RNG states are gathered); rank 0 writes."""
        d = self.d
        full_mems = self.mems
        if trainer and self.mems is not None:
            full_mems = [distributed.gather_rows(d, m) for m in self.mems]
        rng = distributed.gather_objects(d, rank_rng_state(self.device)) if trainer else None
        error = None
        files = functools.partial(self._checkpoint_files, trainer=trainer, mems=full_mems, rank_rng=rng)
        if d.is_main:
            try:  # save_checkpoint refuses non-finite weights: said here as the run's divergence
                save_checkpoint(self.out_dir / name, self.model, self.task.tokenizer, self.run, dict(self.state),
                                keep=keep, span=self.span, extra=files)
            except NonFiniteWeights as err:
                error = runlog.diverged(self.step, err.names, self.out_dir, self.run)
            except TxlError as err:
                error = str(err)
        error = distributed.broadcast_object(d, error)
        if error:
            raise TxlError(error)

    def _checkpoint_files(self, folder: Path, *, trainer: bool, mems: list[torch.Tensor] | None,
                          rank_rng: list | None) -> None:
        """A checkpoint's files besides the model: the task's own (e.g. a classifier's classifier.json) and, with
        ``trainer``, the trainer state (``mems``: every rank's rows, ``rank_rng``: every rank's RNG states)."""
        task_files = getattr(self.task, "checkpoint_files", None)
        if task_files is not None:
            task_files(folder, self.model)
        if trainer:
            save_trainer_state(folder, optimizer=self.optimizer, scaler=self.scaler, generator=self.generator,
                               mems=mems, position=self.pos, step=self.step, state=dict(self.state), rank_rng=rank_rng)

    def finish(self) -> TrainResult:
        """After the last step: the best checkpoint evaluated with the ``[eval]`` settings (and sampled from)."""
        # training wall-clock time, earlier sessions of a resumed run included
        wall = time.perf_counter() - self.started
        self.state["tokens"] = int(self.total_tokens)

        distributed.barrier(self.d)  # best/ is complete on disk for every rank
        best_dir = self.out_dir / "best"
        if self.resume and not best_dir.is_dir():  # complete before its first validation: its last/, as txl eval
            best_dir = self.resume_dir
        load = getattr(self.task, "load_model", None)
        best_model = (load_checkpoint(best_dir, map_location=str(self.device)).model if load is None
                      else load(best_dir, self.device))
        final = self.task.final(best_model, self.run, self.d, progress=self.progress and self.d.is_main)
        prompt, sample = "", ""
        if self.run.train.sample_tokens and self.d.is_main:
            prompt, sample = self.task.sample(best_model, self.run)
        distributed.shutdown(self.d)
        tokens = self.state["tokens"]
        return TrainResult(run_dir=self.out_dir, best_dir=best_dir, final=final, steps=self.step, tokens=tokens,
                           wall_s=wall, tokens_per_s=tokens / wall, sample_prompt=prompt, sample=sample,
                           rank=self.d.rank, start_step=self.start_step)


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
