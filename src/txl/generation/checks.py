"""The argument checks of decoding, without torch: the command line runs them before it imports torch,
and the decoding functions run them again for library callers."""

from __future__ import annotations

import math

from txl.errors import TxlError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise :class:`TxlError` for a temperature that is not a finite number >= 0, top_k < 1 or top_p
    outside (0, 1]."""
    if not temperature >= 0 or temperature == float("inf"):  # also catches NaN
        raise TxlError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise TxlError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise TxlError(f"top_p must be in (0, 1], got {top_p}")


def check_decoding(repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                   length_penalty: float = 1.0) -> None:
    """Raise :class:`TxlError` for a repetition penalty that is not a finite number > 0, a negative
    ``no_repeat_ngram_size`` or ``min_new_tokens``, or a beam-search ``length_penalty`` that is not a
    finite number (NaN would make every finished hypothesis score NaN, inf make them all 0 or inf)."""
    if not 0 < repetition_penalty < float("inf"):
        raise TxlError(f"repetition_penalty must be a finite number > 0 (1: none), got {repetition_penalty}")
    if no_repeat_ngram_size < 0:
        raise TxlError(f"no_repeat_ngram_size must be >= 0 (0: off), got {no_repeat_ngram_size}")
    if min_new_tokens < 0:
        raise TxlError(f"min_new_tokens must be >= 0, got {min_new_tokens}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or \
            not math.isfinite(length_penalty):
        raise TxlError(f"length_penalty must be a finite number (1: log-prob per token), got {length_penalty!r}")
