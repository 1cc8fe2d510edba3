"""Learning curves of runs (``txl plot RUN_DIR...``): the columns of each run's ``metrics.csv`` against
steps and wall-clock time, with the metric's unit on the axis.

Every plotting function writes its PNG atomically and returns the data series it drew, so that tests
can check the data.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from txl.analysis.plots import pyplot, save_figure, unit_suffix
from txl.errors import TxlError


def read_metrics(path) -> dict[str, np.ndarray]:
    """Columns of a run's ``metrics.csv`` (see ``txl.training.runlog.METRIC_FIELDS``) as float64 arrays.

    Empty cells (e.g. ``val_loss`` on steps without validation) become NaN.

    Args:
        path: a ``metrics.csv`` file or a run directory holding one.

    Raises:
        TxlError: missing/unreadable file, not UTF-8 or not CSV, no ``step`` column, no rows, or a
            non-numeric cell.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # (a byte-order mark, as a spreadsheet saves it)
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise TxlError(f"cannot read {path}: {err.strerror or err} (give a run directory with metrics.csv)") from None
    except UnicodeDecodeError as err:
        raise TxlError(f"{path} is not UTF-8 text (byte {err.start}); give the metrics.csv a txl run wrote") from None
    except csv.Error as err:
        raise TxlError(f"{path} is not a CSV file ({err}); give the metrics.csv a txl run wrote") from None
    if not rows or "step" not in rows[0]:
        raise TxlError(f"{path} has no metric rows (expected a header with 'step' and one row per log step)")
    columns: dict[str, np.ndarray] = {}
    for name in rows[0]:
        if name == "unit":  # text: the metric's unit (see metrics_unit)
            continue
        try:
            columns[name] = np.array([float(r[name]) if r[name] not in ("", None) else math.nan for r in rows])
        except ValueError:
            raise TxlError(f"{path}: column {name!r} holds a non-numeric value") from None
    return columns


def _metric_label(run_dir: Path) -> str:
    """The unit of ``train_metric``/``val_metric`` for a run: "bpb", "bpc" or "ppl" ("metric" if unknown).

    Read from ``metrics.csv``'s ``unit`` column, else the checkpoints' ``state.json``, else the
    tokenizer in ``run.json``. A byte model's "bpc" is read as "bpb" (the numbers are bits per byte:
    :func:`~txl.evaluation.stream.stored_unit`).
    """
    from txl.config import CHECKPOINT_NAMES, RUN_NAME, STATE_NAME
    from txl.evaluation.stream import metric_unit, stored_unit
    from txl.fileio import read_json_object

    try:
        tokenizer = (read_json_object(run_dir / RUN_NAME).get("data") or {}).get("tokenizer")
    except TxlError:
        tokenizer = None
    candidates = [metrics_unit(run_dir)]
    for folder in CHECKPOINT_NAMES:  # the unit the run itself chose (its tokenizer may have been detected)
        try:
            candidates.append(read_json_object(run_dir / folder / STATE_NAME).get("unit"))
        except TxlError:
            continue
    for unit in candidates:
        known = stored_unit(unit, tokenizer)
        if known:
            return known
    return metric_unit(tokenizer) if tokenizer and tokenizer != "auto" else "metric"


def metrics_unit(path) -> str | None:
    """The ``unit`` column of a run's ``metrics.csv`` (the last non-empty value), or None when the file
    has none or cannot be read.

    Args:
        path: a ``metrics.csv`` file or a run directory holding one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            units = [r.get("unit") for r in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    units = [u for u in units if u]
    return units[-1] if units else None


def plot_learning_curves(run_dirs: list, out_dir, labels: list[str] | None = None) -> dict:
    """Learning curves of one or more runs from their ``metrics.csv``.

    Writes into ``out_dir``: ``curves_steps.png`` (train and validation metric against steps),
    ``curves_time.png`` (the same against wall-clock seconds), ``lr.png`` (learning rate) and
    ``throughput.png`` (training tokens/s). The metric is bits per byte for byte runs, bits per
    character for char runs and perplexity for word/BPE runs (``train_metric``/``val_metric``
    columns; the axis says which, see :func:`metrics_unit`).

    Returns:
        ``{"files": [paths], "series": {label: {"step", "elapsed_s", "train_metric", "val_step",
        "val_metric", "lr", "tokens_per_s"}}}`` with the plotted float arrays (validation rows only
        where a validation ran).

    Raises:
        TxlError: no runs, unreadable metrics, duplicate labels, or matplotlib missing.
    """
    plt = pyplot()
    if not run_dirs:
        raise TxlError("give at least one run directory")
    run_dirs = [Path(d) for d in run_dirs]
    labels = labels or [d.name if d.name else str(d) for d in run_dirs]
    if len(set(labels)) != len(labels):
        labels = [str(d) for d in run_dirs]
    series, units = {}, set()
    for label, run_dir in zip(labels, run_dirs):
        m = read_metrics(run_dir)
        for column in ("elapsed_s", "lr", "train_metric", "tokens_per_s", "val_metric"):
            if column not in m:
                raise TxlError(f"{run_dir}/metrics.csv has no {column!r} column")
        has_val = ~np.isnan(m["val_metric"])
        series[label] = {"step": m["step"], "elapsed_s": m["elapsed_s"], "train_metric": m["train_metric"],
                         "val_step": m["step"][has_val], "val_elapsed_s": m["elapsed_s"][has_val],
                         "val_metric": m["val_metric"][has_val], "lr": m["lr"], "tokens_per_s": m["tokens_per_s"]}
        units.add(_metric_label(run_dir))
    unit = units.pop() if len(units) == 1 else "metric"
    out_dir = Path(out_dir)
    files = []
    for x_key, vx_key, name, xlabel in (("step", "val_step", "curves_steps.png", "step"),
                                        ("elapsed_s", "val_elapsed_s", "curves_time.png", "wall time (s)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for k, (label, s) in enumerate(series.items()):
            color = f"C{k % 10}"
            ax.plot(s[x_key], s["train_metric"], color=color, alpha=0.6, linewidth=1, label=f"{label} train")
            if s["val_metric"].size:
                ax.plot(s[vx_key], s["val_metric"], color=color, marker="o", label=f"{label} valid")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit + unit_suffix(unit))
        ax.legend(fontsize=8)
        files.append(save_figure(fig, out_dir / name))
    for key, name, ylabel in (("lr", "lr.png", "learning rate"), ("tokens_per_s", "throughput.png", "training tokens/s")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for label, s in series.items():
            ax.plot(s["step"], s[key], label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        files.append(save_figure(fig, out_dir / name))
    return {"files": files, "series": series}
