"""Bookkeeping around the training loop: metrics.csv (and TensorBoard), stop signals, and cleaning up a failed
start."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from txl.errors import TxlError
from txl.fileio import atomic_write, continue_command, read_json_object, refuse_nonempty_folder, write_json
from txl.training.checkpoint import RUN_NAME, checkpoint_step

METRIC_FIELDS = ["step", "tokens", "elapsed_s", "lr", "tgt_len", "mem_len", "train_loss", "train_metric",
                 "tokens_per_s", "val_loss", "val_metric", "unit", "recon_loss"]
"""Columns of metrics.csv. ``unit`` names the unit of ``train_metric``/``val_metric``: "bpb" (byte
models), "bpc" (char models) or "ppl"; files written before it existed lack the column (and said
"bpc" for byte models in ``state.json``): readers accept both. ``recon_loss`` (compressive memory
only, else empty) is the mean attention-reconstruction loss per step over the logging window."""


class StopRequest:
    """SIGINT/SIGTERM handler for training: the first signal asks the loop to stop after the current
    step (which then writes ``last/``); a second one more than a second later interrupts at once.
    (torchrun follows a Ctrl-C with a SIGTERM to every rank: that pair counts as one request.)"""

    def __init__(self) -> None:
        self.requested = False
        self._at = 0.0
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested and time.monotonic() - self._at > 1.0:
            raise KeyboardInterrupt
        if not self.requested:
            self.requested, self._at = True, time.monotonic()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def open_metrics(path: Path, start_step: int):
    """metrics.csv opened for appending rows, its header written; when resuming after ``start_step``,
    the rows of later steps (written before a crash) are dropped. The kept rows are written to a new
    file that replaces the old one atomically, so a kill at any moment keeps every row up to
    ``start_step``. Returns (file, csv.DictWriter)."""
    rows = []
    if start_step and path.is_file():
        with open(path, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("step") and int(r["step"]) <= start_step]

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS)
            writer.writeheader()
            writer.writerows({k: r.get(k, "") for k in METRIC_FIELDS} for r in rows)

    atomic_write(path, write)
    f = open(path, "a", newline="", encoding="utf-8")
    return f, csv.DictWriter(f, fieldnames=METRIC_FIELDS)


TENSORBOARD_DIR = "tensorboard"
"""The folder of a run's TensorBoard event files (``train.log = ["tensorboard"]``, ``--log tensorboard``)."""

# metrics.csv's numeric columns as TensorBoard scalars: column -> tag ({unit}: bpb, bpc or ppl)
_SCALARS = {"train_loss": "train/loss", "train_metric": "train/{unit}", "lr": "train/lr",
            "tokens_per_s": "train/tokens_per_s", "tgt_len": "train/tgt_len", "mem_len": "train/mem_len",
            "recon_loss": "train/recon_loss", "val_loss": "valid/loss", "val_metric": "valid/{unit}"}


class MetricsLog:
    """Where a run's metric rows go (rank 0): ``metrics.csv`` always (:func:`open_metrics`), and with
    ``"tensorboard"`` in ``log`` TensorBoard event files under ``OUT/tensorboard/``, each numeric column a
    scalar at the row's step. A resumed run drops the rows (and events) after ``start_step``, which it
    writes again.

    Raises:
        TxlError: ``"tensorboard"`` is asked for and the tensorboard package is not installed.
    """

    def __init__(self, out_dir: Path, start_step: int, log: list[str] | tuple[str, ...] = ()) -> None:
        self.board = None
        if "tensorboard" in log:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TxlError("train.log tensorboard needs the tensorboard package: in the txl folder, "
                               ".venv/bin/python -m pip install -e '.[log]' (or pip install tensorboard)") from None
            # events after the checkpoint a run resumes from are dropped, as metrics.csv's rows are
            self.board = SummaryWriter(str(out_dir / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)
        self.file, self.writer = open_metrics(out_dir / "metrics.csv", start_step)

    def write(self, row: dict[str, Any]) -> None:
        """One row of metrics.csv (flushed), and its numbers as scalars at ``row["step"]``."""
        self.writer.writerow(row)
        self.file.flush()
        if self.board is not None:
            for column, tag in _SCALARS.items():
                value = row.get(column)
                if value is not None and value != "":
                    self.board.add_scalar(tag.format(unit=row.get("unit") or "metric"), float(value), int(row["step"]))
            self.board.flush()

    def close(self) -> None:
        self.file.close()
        if self.board is not None:
            self.board.close()


def check_new_run_folder(out_dir: Path, flag: str = "train.out_dir (--out)") -> None:
    """Refuse to start a new run in ``out_dir`` unless it is missing or empty: a folder holding a run
    (``run.json``) is continued with ``--resume``, and files txl did not write are never overwritten
    or deleted (``metrics.csv``, ``best/``, ``last/`` ... of another program).

    Raises:
        TxlError: one line naming the folder and (up to four of) its entries; nothing is changed.
    """
    if (out_dir / RUN_NAME).exists():
        raise TxlError(f"{out_dir} already holds a run; choose another {flag}, remove it, or continue it with "
                       f"{continue_command(out_dir)}")
    refuse_nonempty_folder(out_dir, str(out_dir), " and is not a txl run; a new run needs a new or empty folder, and "
                           f"txl never overwrites files it did not write: choose another {flag}")


def remove_unfinished(out_dir: Path, created: bool, names: tuple[str, ...]) -> None:
    """Remove what a run that never wrote a checkpoint left behind (the files and folders ``names``, all
    written by it: its folder was new or empty), so the same --out can be reused."""
    if any(p.is_dir() for p in out_dir.glob("last*")) or (out_dir / "best").exists():
        return
    for name in names:
        if (out_dir / name).is_dir():
            shutil.rmtree(out_dir / name, ignore_errors=True)
        else:
            (out_dir / name).unlink(missing_ok=True)
    if created and out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()


# how a run is carried out, not what it trains: a resumed run may differ here without changing its config
_HOW_IT_RUNS = (("train", "out_dir"), ("train", "threads"))


def record_resumed_config(path: Path, config: dict[str, Any]) -> list[str]:
    """Make ``config`` (a resumed run's config, :meth:`RunConfig.to_dict`) the run's config from now on:
    rewrite the run's top-level ``run.json`` at ``path`` atomically when it differs, so that the next
    plain ``--resume`` (and its "already complete" check) reads the accepted changes. ``train.out_dir``
    and ``train.threads`` keep their saved values (where the folder was named from, and ``--threads``,
    which a resume accepts without a config change).

    Returns:
        the changes written, as ``"section.key OLD -> NEW"`` in the saved order (empty, and nothing written,
        when ``run.json`` already holds every value of ``config`` it names).

    Raises:
        TxlError: ``run.json`` cannot be read; OSError: it cannot be written (it is left as it was).
    """
    saved = read_json_object(path, "run config")
    new = json.loads(json.dumps(config))  # tuples as lists, as they read back
    for section, key in _HOW_IT_RUNS:
        if isinstance(saved.get(section), dict) and key in saved[section] and isinstance(new.get(section), dict):
            new[section][key] = saved[section][key]
    changes = []  # of the values saved (fields a newer txl added with their defaults change nothing)
    for section, old_part in saved.items():
        new_part = new.get(section)
        if isinstance(old_part, dict) and isinstance(new_part, dict):
            changes += [f"{section}.{key} {old_part[key]!r} -> {new_part[key]!r}" for key in old_part
                        if key in new_part and old_part[key] != new_part[key]]
        elif old_part != new_part:
            changes.append(f"[{section}] changed")
    if changes:
        write_json(path, new)
    return changes


def eval_scope(res) -> str:
    """What an evaluation's number was measured on, for the log: ``"32,768 tokens, tgt_len 64, mem_len 64"``
    (completion tokens and pairs for fine-tuning; ``cmem_len`` when a compressed memory was read)."""
    s = res.settings
    if "documents" in s:  # a classifier's held-out documents
        return f"{s['documents']:,} documents, accuracy {s['accuracy']:.4f}"
    what = (f"{res.n_tokens:,} completion tokens of {s['examples']:,} pairs" if "examples" in s
            else f"{res.n_tokens:,} tokens")
    return ", ".join([what] + [f"{key} {s[key]}" for key in ("tgt_len", "mem_len", "cmem_len") if key in s])


def diverged(step: int, bad: list[str], out_dir: Path, run) -> str:
    """The error line when the weights are no longer finite at a checkpoint (none is written then)."""
    kept = checkpoint_step(out_dir / "last")
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    where = (f"last/ still holds step {kept} (continue from it with --resume --allow-config-change)" if kept is not None
             else "no checkpoint was written (start again)")
    recon = " or model.recon_loss_weight" if run.model.cmem_len else ""
    return (f"training diverged: after step {step} the weights hold NaN or inf ({bad[0]}{more}), and txl never "
            f"saves such weights; {where}; lower train.lr{recon} or raise train.warmup_steps")
