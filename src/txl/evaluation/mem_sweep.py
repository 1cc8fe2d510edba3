"""Evaluate one model at several evaluation memory lengths (paper §3.2: mem_len may grow at test time)."""

from __future__ import annotations

import numpy as np

from txl.errors import TxlError
from txl.evaluation.stream import EvalResult, evaluate


def sweep_mem_len(model, tokens: np.ndarray, mem_lens: list[int], *, warmup: bool = False,
                  **eval_kwargs) -> list[EvalResult]:
    """:func:`~txl.evaluation.stream.evaluate` once per memory length, on the same scored tokens.

    Without ``warmup`` every run scores all targets from the start of the text. With ``warmup``
    the run at memory m starts ``max(mem_lens) - m`` tokens into the text and uses its first m
    tokens as warm-up context, so all runs score exactly the targets after index ``max(mem_lens)``
    (same streams), each with a full memory.

    Args:
        mem_lens: memory lengths >= 0 (tokens); eval_kwargs: passed to ``evaluate`` (unit,
            batch_size, tgt_len, clamp_len, same_length, max_tokens, dtype; ``progress=True``: one
            progress bar per memory length, labelled ``mem_len M``).

    Returns:
        one :class:`~txl.evaluation.stream.EvalResult` per memory length, in order.

    Raises:
        TxlError: a vanilla (``attn_type="abs"``) model, which has no memory, or evaluation errors.
    """
    if not model.config.has_memory:
        raise TxlError("--sweep-mem needs a model with memory (attn_type rel, shaw or rope); a vanilla model has no memory")
    top = max(mem_lens)
    progress = eval_kwargs.pop("progress", False)
    results = []
    for m in mem_lens:
        part = tokens[top - m:] if warmup else tokens
        results.append(evaluate(model, part, mem_len=m, warmup=warmup, progress=progress and f"mem_len {m}",
                                **eval_kwargs))
    return results


def format_sweep(mem_lens: list[int], results: list[EvalResult]) -> str:
    """A Markdown table: mem_len, the metric (bpb, bpc or ppl), loss in nats/token, scored tokens."""
    unit = results[0].unit
    rows = [f"| mem_len | {unit} | loss (nats/token) | tokens |", "|---:|---:|---:|---:|"]
    for m, r in zip(mem_lens, results):
        rows.append(f"| {m} | {r.value:.4f} | {r.loss:.4f} | {r.n_tokens} |")
    return "\n".join(rows)
