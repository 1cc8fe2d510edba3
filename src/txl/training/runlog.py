"""Bookkeeping around the training loop: metrics.csv, stop signals, and cleaning up a failed start."""

from __future__ import annotations

import csv
import signal
import threading
import time
from pathlib import Path
from typing import Any

from txl.errors import TxlError
from txl.training.checkpoint import RUN_NAME

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
    """metrics.csv opened for writing, header written; when resuming after ``start_step``, the rows
    of later steps (written before a crash) are dropped. Returns (file, csv.DictWriter)."""
    rows = []
    if start_step and path.is_file():
        with open(path, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("step") and int(r["step"]) <= start_step]
    f = open(path, "w", newline="", encoding="utf-8")
    writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS)
    writer.writeheader()
    writer.writerows({k: r.get(k, "") for k in METRIC_FIELDS} for r in rows)
    f.flush()
    return f, writer


def check_new_run_folder(out_dir: Path, flag: str = "train.out_dir (--out)") -> None:
    """Refuse to start a new run in ``out_dir`` unless it is missing or empty: a folder holding a run
    (``run.json``) is continued with ``--resume``, and files txl did not write are never overwritten
    or deleted (``metrics.csv``, ``best/``, ``last/`` ... of another program).

    Raises:
        TxlError: one line naming the folder and (up to four of) its entries; nothing is changed.
    """
    if not out_dir.is_dir():
        return
    if (out_dir / RUN_NAME).exists():
        raise TxlError(f"{out_dir} already holds a run; choose another {flag}, remove it, or continue it with --resume")
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in out_dir.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        raise TxlError(f"{out_dir} is not empty ({shown}) and is not a txl run; a new run needs a new or empty "
                       f"folder, and txl never overwrites files it did not write: choose another {flag}")


def remove_unfinished(out_dir: Path, created: bool, names: tuple[str, ...]) -> None:
    """Remove what a run that never wrote a checkpoint left behind, so the same --out can be reused."""
    if any(p.is_dir() for p in out_dir.glob("last*")) or (out_dir / "best").exists():
        return
    for name in names:
        (out_dir / name).unlink(missing_ok=True)
    if created and out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
