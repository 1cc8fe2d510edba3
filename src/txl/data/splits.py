"""Cutting a corpus into train, valid and test: at fractions of a token array, at the line start nearest
a fraction of a text, or between whole files (:func:`split_files`, ``data.split_by = "file"``); and the
checks that every split asked for holds enough to train or evaluate on."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from txl.config import check_split
from txl.data.files import _file_size
from txl.errors import TxlError

SPLITS = ("train", "valid", "test")


def _boundaries(total: int, fr: tuple[float, float, float]) -> tuple[int, int]:
    """Split points (end of train, end of valid) for ``total`` items, rounded half up."""
    b1 = min(total, math.floor(total * fr[0] + 0.5))
    b2 = total if fr[2] == 0 else min(total, math.floor(total * (fr[0] + fr[1]) + 0.5))
    if fr[1] == 0:
        b2 = b1
    return b1, max(b1, b2)


def split_tokens(tokens: np.ndarray, fractions: Sequence[float] = (0.9, 0.05, 0.05)) -> dict[str, np.ndarray]:
    """Contiguous train/valid/test split of a 1-D array, in order (views, not copies).

    With N tokens, train ends at ``round(N*f_train)`` and valid at ``round(N*(f_train+f_valid))``
    (rounding half up); a zero fraction gives an empty split.

    Raises :class:`TxlError` if the fractions are negative or do not sum to 1 (within 1e-6),
    or if a split with a non-zero fraction would be empty.
    """
    fr = check_split(fractions, "split fractions")
    b1, b2 = _boundaries(len(tokens), fr)
    parts = {"train": tokens[:b1], "valid": tokens[b1:b2], "test": tokens[b2:]}
    for name, f in zip(SPLITS, fr):
        if f > 0 and len(parts[name]) == 0:
            raise TxlError(
                f"the {name} split would be empty ({len(tokens)} tokens, fraction {f}); "
                "use a larger corpus or a larger fraction"
            )
    return parts


def line_cuts(read: Callable[[int, int], bytes], total: int, fr: tuple[float, float, float]) -> tuple[int, int]:
    """The split points of :func:`_boundaries` moved to the nearest line starts (ties go to the earlier one) in
    ``total`` bytes of text, of which ``read(lo, hi)`` gives ``[lo, hi)``: read in growing windows around
    each point, so a text larger than memory is cut without being held."""

    def nearest(target: int) -> int:
        if target <= 0 or target >= total:
            return max(0, min(target, total))
        if read(target - 1, target) == b"\n":
            return target
        before = after = None
        width = 1 << 20
        while before is None or after is None:
            if before is None:
                start = max(0, target - width)
                back = read(start, target).rfind(b"\n")
                before = start + back + 1 if back >= 0 else (0 if start == 0 else None)
            if after is None:
                end = min(total, target + width)
                fwd = read(target, end).find(b"\n")
                after = target + fwd + 1 if fwd >= 0 else (total if end == total else None)
            width *= 2
        return before if target - before <= after - target else after

    b1, b2 = _boundaries(total, fr)
    b1 = nearest(b1)
    b2 = total if fr[2] == 0 else max(b1, nearest(b2))
    return b1, b1 if fr[1] == 0 else b2


def split_files(files: Sequence[Path], fractions: Sequence[float]) -> dict[str, list[Path]]:
    """Whole files per split, in order: a file goes to the split its middle byte falls in when the
    files' bytes are cut at ``fractions`` (train, valid, test), so no file is in two splits.

    Raises:
        TxlError: fewer files than splits with a share, or a split with a share left without a file
            (naming the fractions to change or the files to add).
    """
    fr = check_split(fractions, "split fractions")
    sizes = [_file_size(f) for f in files]
    b1, b2 = _boundaries(sum(sizes), fr)
    sets: dict[str, list[Path]] = {name: [] for name in SPLITS}
    start = 0
    for f, size in zip(files, sizes):
        middle = start + size / 2
        sets["train" if middle < b1 else "valid" if middle < b2 else "test"].append(Path(f))
        start += size
    empty = [name for name, share in zip(SPLITS, fr) if share > 0 and not sets[name]]
    if empty:
        raise TxlError(f"data.split_by=file: no file falls in the {' and '.join(empty)} split ({len(files)} files, "
                       f"split {'/'.join(f'{x:g}' for x in fr)}); give more files, larger shares for "
                       f"{' and '.join(empty)}, or data.split_by=text")
    return {name: fs for name, fs in sets.items() if fs or name != "test"}


def _split_fix(name: str, fr: tuple[float, float, float] | None) -> str:
    """What to change when the ``name`` split is too small: its fraction in ``data.split`` (``fr``, the
    fractions in use) or, for separate split files (``fr`` None), the ``data.<name>`` file."""
    if fr is None:
        return f"give a longer {name} file (data.{name}; data.train, data.valid and data.test name the split files)"
    now = "[" + ", ".join(f"{x:g}" for x in fr) + "]"
    return (f"use a larger corpus or a larger {name} fraction in data.split (train, valid, test; now "
            f"data.split={now})")


def _check_sizes(parts: dict[str, np.ndarray], requested: dict[str, bool], source: str,
                 fr: tuple[float, float, float] | None = None) -> None:
    for name in SPLITS:
        n = len(parts[name])
        if (name == "train" or requested[name]) and n < 2:
            raise TxlError(f"the {name} split of {source} has {n} token(s); it needs at least 2: {_split_fix(name, fr)}")
