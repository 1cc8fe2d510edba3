"""Metrics over test items and their bootstrap intervals (numpy only).

``accuracy`` and ``macro_f1`` score predicted class indices against true ones;
:func:`bootstrap_interval` gives a percentile interval of any such statistic by resampling the test
items with replacement (Efron & Tibshirani 1993, ch. 13). Paired arrays are resampled together, so the
interval of a *difference* between two systems on the same items is one call::

    bootstrap_interval((y, pred_a, pred_b), lambda y, a, b: macro_f1(y, a) - macro_f1(y, b), seed=0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from txl.errors import TxlError


def _labels(y_true: Sequence[int], y_pred: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Both label arrays as int64 [N], checked to be the same non-zero length of indices >= 0."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if y_true.ndim != 1 or y_true.size == 0 or y_true.shape != y_pred.shape:
        raise TxlError(f"metrics need the same, non-zero number of true and predicted labels, got "
                       f"{y_true.shape} and {y_pred.shape}")
    if int(min(y_true.min(), y_pred.min())) < 0:
        raise TxlError("labels must be class indices >= 0")
    return y_true, y_pred


def accuracy(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """Fraction of items whose predicted class index equals the true one, in [0, 1].

    Raises:
        TxlError: empty or mismatched inputs, or negative indices.
    """
    y_true, y_pred = _labels(y_true, y_pred)
    return float((y_true == y_pred).mean())


def macro_f1(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int | None = None) -> float:
    """Unweighted mean of the per-class F1 (``2 tp / (2 tp + fp + fn)``), in [0, 1].

    Only classes that occur in ``y_true`` or ``y_pred`` count (a class with no support and no
    prediction is left out, as scikit-learn's ``f1_score(average="macro")`` does with the labels
    present); a class that occurs but is never predicted right has F1 0.

    Args:
        y_true, y_pred: class indices, int [N] each.
        num_labels: number of classes (None: ``max + 1`` of both arrays); only sets the counting range.

    Raises:
        TxlError: empty or mismatched inputs, or indices outside ``[0, num_labels)``.
    """
    y_true, y_pred = _labels(y_true, y_pred)
    k = int(max(y_true.max(), y_pred.max())) + 1 if num_labels is None else num_labels
    if int(max(y_true.max(), y_pred.max())) >= k:
        raise TxlError(f"labels must be class indices in [0, {k})")
    tp = np.bincount(y_true[y_true == y_pred], minlength=k)
    support = np.bincount(y_true, minlength=k)    # tp + fn
    predicted = np.bincount(y_pred, minlength=k)  # tp + fp
    present = (support + predicted) > 0
    return float((2 * tp[present] / (support[present] + predicted[present])).mean())


@dataclass
class Interval:
    """A statistic on the test items and its bootstrap percentile interval.

    Attributes:
        estimate: the statistic on the items as given.
        low, high: the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the statistic over
            ``n`` resamples (numpy's default linear interpolation).
        level: the coverage asked for (0.95: a 95% interval).
        n: resamples drawn.
    """

    estimate: float
    low: float
    high: float
    level: float
    n: int

    def to_dict(self) -> dict:
        """``{"estimate", "low", "high", "level", "n"}`` (JSON-able)."""
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level, "n": self.n}


def bootstrap_interval(values, statistic: Callable[..., float] = np.mean, *, n: int = 1000, seed: int = 0,
                       level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of ``statistic`` over test items.

    The items are resampled with replacement: ``idx = np.random.default_rng(seed).integers(0, N, size=(n, N))``
    and resample ``r`` is ``statistic(*(a[idx[r]] for a in arrays))``; the interval is
    ``np.percentile(resampled, [100 * (1 - level) / 2, 100 * (1 + level) / 2])``.

    Args:
        values: per-item scores, float [N] (with ``statistic`` e.g. ``np.mean``), or a tuple of arrays of
            the same length N resampled together (e.g. ``(y_true, y_pred)`` with ``statistic=macro_f1``).
        statistic: maps the resampled array(s) to a number.
        n: resamples (>= 1).
        seed: seeds the resampling (the same seed gives the same interval).
        level: coverage in (0, 1).

    Returns:
        :class:`Interval` (``estimate`` is ``statistic`` of the items as given).

    Raises:
        TxlError: no items, arrays of different lengths, ``n`` < 1 or ``level`` outside (0, 1).
    """
    arrays = tuple(np.asarray(a) for a in values) if isinstance(values, tuple) else (np.asarray(values),)
    size = len(arrays[0]) if arrays[0].ndim else 0
    if size == 0 or any(a.ndim == 0 or len(a) != size for a in arrays):
        raise TxlError(f"a bootstrap needs one or more items, the same number in every array, got "
                       f"{[a.shape for a in arrays]}")
    if n < 1 or not 0.0 < level < 1.0:
        raise TxlError(f"need n >= 1 resamples and a level in (0, 1), got {n} and {level}")
    idx = np.random.default_rng(seed).integers(0, size, size=(n, size))
    resampled = np.array([float(statistic(*(a[row] for a in arrays))) for row in idx])
    low, high = np.percentile(resampled, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return Interval(estimate=float(statistic(*arrays)), low=float(low), high=float(high), level=level, n=n)


__all__ = ["Interval", "accuracy", "bootstrap_interval", "macro_f1"]
