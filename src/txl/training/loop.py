"""The segment-recurrent training loop (paper §3.2): memory carried across segments, detached."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

import torch
from tqdm import tqdm

from txl.training.config import RunConfig
from txl.config import IGNORE_INDEX
from txl.errors import TxlError
from txl.runtime import compile_module, resolve_device, seed_everything, set_threads
from txl.evaluation.stream import EvalResult, metric_value
from txl.fileio import FolderClaim, claim_folder, write_json
from txl.model import TransformerXLLM
from txl.model.config import check_compilable
from txl.data.iterators import longest_segment
from txl.model.checks import check_attention_fits
from txl import distributed
from txl.training.checkpoint import (RUN_NAME, NonFiniteWeights, checkpoint_step, load_checkpoint, save_checkpoint)
from txl.training.checkpoint_files import check_run_folder, checkpoint_candidates, first_good_checkpoint
from txl.training.fingerprint import STATE_KEY as DATA_KEY
from txl.training.resume import JSON_NAME as TRAINER_JSON
from txl.training.resume import rank_rng_state, restore_run, save_trainer_state
from txl.training.runlog import (StopRequest, check_new_run_folder, open_metrics, record_resumed_config,
                                remove_unfinished)
from txl.training.optim import make_optimizer
from txl.training.step import train_step
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


def _absolute_paths(data):
    """The data section with absolute paths, so that a run's checkpoints work from any directory."""
    paths = {k: str(Path(v).resolve()) for k in ("path", "train", "valid", "test")
             if (v := getattr(data, k)) is not None}
    return dataclasses.replace(data, **paths)


def eval_scope(res: EvalResult) -> str:
    """What an evaluation's number was measured on, for the log: ``"32,768 tokens, tgt_len 64, mem_len 64"``
    (completion tokens and pairs for fine-tuning; ``cmem_len`` when a compressed memory was read)."""
    s = res.settings
    if "documents" in s:  # a classifier's held-out documents
        return f"{s['documents']:,} documents, accuracy {s['accuracy']:.4f}"
    what = (f"{res.n_tokens:,} completion tokens of {s['examples']:,} pairs" if "examples" in s
            else f"{res.n_tokens:,} tokens")
    return ", ".join([what] + [f"{key} {s[key]}" for key in ("tgt_len", "mem_len", "cmem_len") if key in s])


def _diverged(step: int, bad: list[str], out_dir: Path, run: RunConfig) -> str:
    """The error line when the weights are no longer finite at a checkpoint (none is written then)."""
    kept = checkpoint_step(out_dir / "last")
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    where = (f"last/ still holds step {kept} (continue from it with --resume --allow-config-change)" if kept is not None
             else "no checkpoint was written (start again)")
    recon = " or model.recon_loss_weight" if run.model.cmem_len else ""
    return (f"training diverged: after step {step} the weights hold NaN or inf ({bad[0]}{more}), and txl never "
            f"saves such weights; {where}; lower train.lr{recon} or raise train.warmup_steps")


def _recorded_threads(checkpoint: Path) -> int | None:
    """The CPU thread count a run recorded in a checkpoint's ``state.json`` (None for runs before it did)."""
    from txl.training.checkpoint import STATE_NAME
    from txl.fileio import read_json_object

    try:
        value = read_json_object(checkpoint / STATE_NAME).get("threads")
    except TxlError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def make_task(run: RunConfig):
    """The task ``run`` describes: :class:`~txl.training.finetune.PairsTask` when it has a
    ``[finetune]`` section, else :class:`~txl.training.lm_task.LMTask` (loads the data)."""
    if run.finetune is not None:
        from txl.training.finetune import PairsTask

        return PairsTask(run)
    return LMTask(run)


def task_inputs(run: RunConfig) -> list:
    """The paths a run reads (its output folder may not be one of them, nor inside one)."""
    data = run.data
    inputs = [data.path, data.train, data.valid, data.test]
    return inputs + ([run.finetune.init] if run.finetune is not None else [])


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

    ``task``: the task to train (see :mod:`txl.training.lm_task` for the interface), e.g. a
    :class:`txl.training.stream_task.StreamTask`; None: the one ``run`` describes (:func:`make_task`).
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


def _train(run: RunConfig, *, progress: bool, log: Callable[[str], None] | None, resume: bool,
           claims: list[FolderClaim], allow_data_change: bool = False, task=None) -> TrainResult:
    """:func:`train`; the folder claim it takes is appended to ``claims`` (released by the caller)."""
    d = distributed.from_environment()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if not d.is_main:
        log = lambda msg: None  # noqa: E731 - rank 0 speaks for the run
    run.validate()
    if run.train.compile:  # (a saved run's config may hold it: refused where training starts, not on loading)
        check_compilable(run.model, "train.compile")
    t = run.train
    if d.enabled and t.batch_size % (d.world * t.grad_accum_steps):
        raise TxlError(f"train.batch_size {t.batch_size} must divide into {d.world} ranks × train.grad_accum_steps "
                       f"{t.grad_accum_steps} equal pieces")
    if not d.enabled and t.grad_accum_steps > t.batch_size:
        raise TxlError(f"train.grad_accum_steps {t.grad_accum_steps} exceeds train.batch_size {t.batch_size}")
    if t.deterministic:  # cuBLAS needs a fixed workspace for deterministic matmuls (read when CUDA starts)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    seed_everything(t.seed)
    device = distributed.device_for(d, resolve_device(t.device))
    out_dir = Path(t.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TxlError(f"train.out_dir {out_dir} is a file; choose a folder for the run")
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
    if resume:
        candidates = checkpoint_candidates(out_dir, "last")
        if not candidates:
            raise TxlError(f"{out_dir} has no resumable checkpoint (last/{TRAINER_JSON}); start a new run instead")
        resume_dir = first_good_checkpoint(candidates, required=TRAINER_JSON, warn=lambda m: log(f"txl: warning: {m}"))
    elif (out_dir / RUN_NAME).exists():
        raise TxlError(f"{out_dir} already holds a run; choose another train.out_dir (--out), remove it, "
                       "or continue it with --resume")

    # torchrun's ranks: OMP_NUM_THREADS shares the CPUs; a resumed run keeps the count it recorded (automatic
    # choices follow the load, and another count changes the losses in their last digits)
    threads = set_threads(t.threads, flag="train.threads", keep=_recorded_threads(resume_dir) if resume else None)
    task = make_task(run) if task is None else task
    fingerprint = task.fingerprint()  # recorded in every checkpoint, compared when resuming
    unit = task.unit
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=task.vocab_size),
                              data=_absolute_paths(run.data))
    if run.finetune is not None:
        run = dataclasses.replace(run, finetune=dataclasses.replace(run.finetune,
                                                                    init=str(Path(run.finetune.init).resolve())))
    spans = [segment_span(s, t.tgt_len_schedule, run.model.tgt_len, run.model.mem_len) for s in
             [0] + [e[0] for e in t.tgt_len_schedule]]
    task.check(run, spans)
    log(task.describe())

    distributed.init(d, device)
    build = getattr(task, "build_model", None)  # a task may train another model around the LM (a classifier)
    model = (TransformerXLLM(run.model) if build is None else build(run)).to(device)
    if build is None:  # the longest segment's attention scores, under autograd
        longest = max(longest_segment(s[0]) if t.varlen else s[0] for s in spans)
        check_attention_fits(model, len(range(t.batch_size)[d.rows(t.batch_size)]), longest,
                             longest + max(s[1] for s in spans), grad=True, dtype=t.dtype)
    if not resume:
        task.init_weights(model)
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

    state: dict[str, Any] = {"step": 0, "tokens": 0, "best_val_loss": None, "unit": unit, DATA_KEY: fingerprint,
                             "threads": torch.get_num_threads()}
    pos, mems, best, start_step = 0, None, float("inf"), 0
    span = model.config.span  # the phase of train.tgt_len_schedule in force (set each step)
    if resume:
        start_step, pos, mems, state, best = restore_run(
            resume_dir, candidates, model=model, optimizer=optimizer, scaler=scaler, generator=generator,
            device=device, d=d, rows=rows, batch_size=t.batch_size, dtype=t.dtype, seed=t.seed, task=task, unit=unit,
            fingerprint=fingerprint, allow_data_change=allow_data_change, log=log)
        log(f"resuming {out_dir} after step {start_step} (from {resume_dir.name}/)")
    ddp = task.objective(model)
    if d.enabled:
        ddp = torch.nn.parallel.DistributedDataParallel(ddp, device_ids=[device.index] if device.type == "cuda"
                                                        else None)
    if t.compile:  # the checkpoints are still written from `model` (no "_orig_mod." names)
        ddp = compile_module(ddp)

    metrics_file = writer = None
    if d.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            write_json(out_dir / RUN_NAME, run.to_dict())
        else:  # accepted changes (--allow-config-change) are the run's config from now on
            changes = record_resumed_config(out_dir / RUN_NAME, run.to_dict())
            if changes:
                log(f"the run's config from now on (written to {out_dir / RUN_NAME}): {', '.join(changes)}")
        metrics_file, writer = open_metrics(out_dir / "metrics.csv", start_step)
    total_tokens = torch.tensor(state["tokens"], dtype=torch.int64, device=device)  # on the device: no sync per step
    window_loss, window_tokens, window_start = 0.0, state["tokens"], time.perf_counter()
    window_recon, window_steps = 0.0, 0  # attention-reconstruction loss (compressed memory) in the window
    if "window" in state:  # resumed inside a logging window: its first row averages the whole window again
        saved_loss, window_tokens, window_elapsed = state["window"]
        window_loss, window_start = saved_loss, window_start - window_elapsed
    start = time.perf_counter() - float(state.get("elapsed_s") or 0.0)  # a resumed run's clock goes on
    bar = tqdm(total=t.max_steps, initial=start_step, disable=not progress or not d.is_main, dynamic_ncols=True,
               file=sys.stderr)
    step = start_step

    def write_checkpoint(name: str, keep: int, trainer: bool) -> None:
        """Every rank calls this (memory and RNG states are gathered); rank 0 writes."""
        full_mems = [distributed.gather_rows(d, m) for m in mems] if (trainer and mems is not None) else mems
        rng = distributed.gather_objects(d, rank_rng_state(device)) if trainer else None
        error = None
        task_files = getattr(task, "checkpoint_files", None)  # e.g. a classifier's classifier.json

        def files(folder: Path) -> None:
            if task_files is not None:
                task_files(folder, model)
            if trainer:
                save_trainer_state(folder, optimizer=optimizer, scaler=scaler, generator=generator, mems=full_mems,
                                   position=pos, step=step, state=dict(state), rank_rng=rng)

        if d.is_main:
            try:  # save_checkpoint refuses non-finite weights: said here as the run's divergence
                save_checkpoint(out_dir / name, model, task.tokenizer, run, dict(state), keep=keep, span=span,
                                extra=files)
            except NonFiniteWeights as err:
                error = _diverged(step, err.names, out_dir, run)
            except TxlError as err:
                error = str(err)
        error = distributed.broadcast_object(d, error)
        if error:
            raise TxlError(error)

    def save_last(extra_state: dict[str, Any] | None = None) -> None:
        state.update(step=step, tokens=int(total_tokens), elapsed_s=time.perf_counter() - start,
                     window=[float(window_loss), window_tokens, time.perf_counter() - window_start], **(extra_state or {}))
        write_checkpoint("last", t.keep_last, trainer=True)

    def write_row(row: dict[str, Any] | None) -> None:
        """A step's metrics.csv row; written before that step's checkpoint, so that no kill loses it
        (a resumed run drops the rows after its checkpoint and writes them again)."""
        if row and writer is not None:
            writer.writerow({**row, "unit": unit})
            metrics_file.flush()

    def save_validated(res: EvalResult) -> None:
        """After a finite validation: ``best/`` when it is the best so far, then ``last/``."""
        nonlocal best
        state.update(step=step, tokens=int(total_tokens), val_loss=res.loss, val_metric=res.value, elapsed_s=time.perf_counter() - start)
        if res.loss < best:
            best = res.loss
            state["best_val_loss"] = best
            write_checkpoint("best", 1, trainer=False)
        save_last()

    model.train()
    stop = StopRequest()
    bad_in_a_row = 0
    try:
        for step in range(start_step + 1, t.max_steps + 1):
            tgt_len, mem_len = segment_span(step, t.tgt_len_schedule, run.model.tgt_len, run.model.mem_len)
            span = model.config.span.replace(tgt_len=tgt_len, mem_len=mem_len)
            x, y, pos, fresh = batches.next(pos, tgt_len, generator)
            if fresh:
                mems = None
            n_tok = (y != IGNORE_INDEX).sum()  # the global batch's targets
            lr = learning_rate(step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, max_steps=t.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            out = train_step(ddp, x[rows], y[rows], mems, n_global=n_tok, optimizer=optimizer, scaler=scaler,
                             clip=t.clip, dtype=t.dtype, chunks=t.grad_accum_steps, d=d, stop=stop.requested,
                             span=span)
            if out.finite:
                bad_in_a_row = 0
                mems = out.mems
                total_tokens += n_tok
                window_loss = window_loss + out.loss_sum
                if out.recon_loss is not None:
                    window_recon, window_steps = window_recon + out.recon_loss, window_steps + 1
            else:  # skipped: no update; the data moved on, so the memory starts afresh
                mems = None
                bad_in_a_row += 1
                state["skipped_steps"] = state.get("skipped_steps", 0) + 1
                what = (f"loss is {float(out.loss_sum)}" if out.recon_finite else "attention-reconstruction term "
                        f"(model.recon_loss_weight {run.model.recon_loss_weight} × reconstruction loss) is not finite")
                if d.is_main:
                    bar.write(f"step {step}: {what}, step skipped ({bad_in_a_row} in a row)", file=sys.stderr)
                if bad_in_a_row >= t.max_bad_steps and not out.recon_finite:
                    raise TxlError(f"the {what} for {bad_in_a_row} steps in a row (up to step {step}); lower "
                                   "model.recon_loss_weight (default 1.0) and start again (or --resume with "
                                   "--allow-config-change)")
                if bad_in_a_row >= t.max_bad_steps:
                    raise TxlError(f"the loss was not finite for {bad_in_a_row} steps in a row (up to step {step}); "
                                   "lower train.lr, raise train.warmup_steps or check the data")
            bar.update(1)
            row = None
            if step % t.log_interval == 0 or step == t.max_steps:
                now = time.perf_counter()
                state["tokens"] = int(total_tokens)
                count = state["tokens"] - window_tokens
                train_loss = float(window_loss) / max(1, count)
                speed = count / max(1e-9, now - window_start)
                row = {"step": step, "tokens": state["tokens"], "elapsed_s": round(now - start, 3), "lr": lr,
                       "tgt_len": tgt_len, "mem_len": mem_len, "train_loss": train_loss,
                       "train_metric": metric_value(train_loss, unit), "tokens_per_s": round(speed, 1)}
                if window_steps:
                    row["recon_loss"] = float(window_recon) / window_steps
                    window_recon, window_steps = 0.0, 0
                bar.set_postfix_str(f"loss {train_loss:.3f} {unit} {metric_value(train_loss, unit):.3f} "
                                    f"lr {lr:.2e} {speed:,.0f} tok/s")
                window_loss, window_tokens, window_start = 0.0, state["tokens"], now
            if step % t.eval_interval == 0 or step == t.max_steps:
                res = task.validate(model, run, span, d)  # valid split (train.eval_max_tokens) at the training span
                model.train()
                row = row or {"step": step, "tokens": int(total_tokens), "elapsed_s": round(time.perf_counter() - start, 3)}
                row.update(val_loss=res.loss, val_metric=metric_value(res.loss, unit))
                write_row(row)  # the row first: a kill after the checkpoint must not lose it
                if not math.isfinite(res.loss):
                    save_last()
                    raise TxlError(f"the validation loss is {res.loss} at step {step}: training diverged; lower "
                                   f"train.lr or raise train.warmup_steps (last state written to {out_dir / 'last'})")
                if d.is_main:
                    bar.write(f"step {step}: valid {unit} {res.value:.4f} ({eval_scope(res)})", file=sys.stderr)
                save_validated(res)
                window_start = time.perf_counter()  # do not count evaluation time as training speed
            else:
                write_row(row)
                if t.save_interval and step % t.save_interval == 0:
                    save_last()
            if out.stop:  # Ctrl-C or SIGTERM (on any rank) during this step: every rank stops after it
                stop.requested = True
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        bar.close()
        if metrics_file:
            metrics_file.close()
        if step == start_step or not stop.requested:  # nothing finished, or a second Ctrl-C mid-step
            if not resume and step == start_step and d.is_main:
                remove_unfinished(out_dir, created, (RUN_NAME, "metrics.csv"))
            log(f"interrupted; the last checkpoint in {out_dir} is kept as it was")
            raise
        save_last({"interrupted": True})
        log(f"interrupted after step {step}; checkpoint written to {out_dir / 'last'} (continue with --resume)")
        raise
    except Exception:
        bar.close()
        if metrics_file:
            metrics_file.close()
        if not resume and d.is_main:
            remove_unfinished(out_dir, created, (RUN_NAME, "metrics.csv"))
        raise
    finally:
        stop.restore()
    bar.close()
    if metrics_file:
        metrics_file.close()
    wall = time.perf_counter() - start  # training wall-clock time, earlier sessions of a resumed run included
    state["tokens"] = int(total_tokens)

    distributed.barrier(d)  # best/ is complete on disk for every rank
    best_dir = out_dir / "best"
    if resume and not best_dir.is_dir():  # already complete before its first validation: its last/, as txl eval
        best_dir = resume_dir
    load = getattr(task, "load_model", None)
    best_model = (load_checkpoint(best_dir, map_location=str(device)).model if load is None
                  else load(best_dir, device))
    final = task.final(best_model, run, d, progress=progress and d.is_main)
    prompt, sample = "", ""
    if t.sample_tokens and d.is_main:
        prompt, sample = task.sample(best_model, run)
    distributed.shutdown(d)
    return TrainResult(run_dir=out_dir, best_dir=best_dir, final=final, steps=step, tokens=state["tokens"],
                       wall_s=wall, tokens_per_s=state["tokens"] / wall, sample_prompt=prompt,
                       sample=sample, rank=d.rank, start_step=start_step)


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
