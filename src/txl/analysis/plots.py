"""Plots: matplotlib behind one import (:func:`pyplot`), figures written atomically (:func:`save_figure`), and
the metric against memory length (``txl eval --sweep-mem``). ``txl plot``'s learning curves and attention
distances are the plot recipe (``recipes/plot``), the studies' figures sit in their folders.

matplotlib is an optional dependency (the ``plot`` extra: ``pip install -e '.[plot]'`` in the txl folder);
it is imported lazily with the Agg backend, and its absence is one clear :class:`~txl.errors.TxlError`.
Every plotting function writes its PNG atomically and returns the data series it drew, so that tests
can check the data.
"""

from __future__ import annotations

from pathlib import Path

from txl.errors import TxlError
from txl.fileio import atomic_write


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend.

    Raises:
        TxlError: matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        raise TxlError("plots need matplotlib: in the txl folder, .venv/bin/python -m pip install -e '.[plot]' "
                       "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> Path:
    """Write ``fig`` at ``path`` atomically (parent folders created) in the format its suffix names
    (``.png``, ``.pdf``, ``.svg``, ...; no suffix: PNG), and close it.

    Raises:
        TxlError: a suffix matplotlib cannot write, or a path that cannot be written.
    """
    path = Path(path)
    try:
        kind = path.suffix[1:].lower() or "png"
        supported = fig.canvas.get_supported_filetypes()
        if kind not in supported:
            raise TxlError(f"cannot draw {path}: unknown image type .{kind}; use one of "
                           f"{', '.join('.' + k for k in sorted(supported))}")
        fig.tight_layout()
        try:
            atomic_write(path, lambda tmp: fig.savefig(tmp, format=kind, dpi=100))
        except RuntimeError as err:  # e.g. .pgf needs a LaTeX installation
            raise TxlError(f"cannot draw {path}: {err}; use .png, .pdf or .svg") from None
    finally:
        pyplot().close(fig)
    return path


def unit_suffix(unit: str) -> str:
    """" (bits per byte)" / " (bits per character)" after an axis label's unit; "" for others."""
    from txl.evaluation.stream import UNIT_NAMES

    return f" ({UNIT_NAMES[unit]})" if unit in ("bpb", "bpc") else ""


def plot_mem_sweep(mem_lens: list[int], values: list[float], unit: str, path, label: str = "") -> dict:
    """Evaluation metric (bpb, bpc or perplexity) against evaluation memory length, as a PNG.

    Returns ``{"mem_len": [...], unit: [...]}``, the plotted series.

    Raises:
        TxlError: lists of different lengths or matplotlib missing.
    """
    if len(mem_lens) != len(values) or not mem_lens:
        raise TxlError("need one value per memory length")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(mem_lens, values, marker="o", label=label or None)
    ax.set_xlabel("evaluation mem_len (tokens)")
    ax.set_ylabel(unit + unit_suffix(unit))
    if label:
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return {"mem_len": list(mem_lens), unit: list(values)}
