"""The loss of completions given long prompts: each example read segment by segment with the memory.

A batch holds right-padded token rows ``prompt + SEP + completion + END``
(:func:`txl.data.pairs.pair_batch`); the labels are ``IGNORE_INDEX`` except at the completion and END
targets. The rows are read with the one segment loop (:func:`txl.segments.segments`):
segment k of every row with the memory of its segment k - 1 (paper §3.2), a row leaving once its last
scored target is read. Fine-tuning (:mod:`txl.training.finetune`) back-propagates through the last
segments of each row; evaluation reads without autograd.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from txl.config import IGNORE_INDEX, AttentionSpan
from txl.data.pairs import pair_batch
from txl.errors import TxlError
from txl.segments import eval_mode, segments
from txl.evaluation.stream import EvalResult, check_unit
from txl.runtime import progress_bar
from txl.kernels.cpu import check_reading_fits


def grad_window(labels: torch.Tensor, tgt_len: int, grad_segments: int | None) -> torch.Tensor:
    """int64 [B]: the first segment of each row read with autograd when fine-tuning.

    Row b's last scored target is in segment ``last = (L_b - 1) // tgt_len`` (``L_b``: one past its
    last scored position), its first in segment ``first``; the window starts at
    ``min(first, last - K + 1)`` (clamped at 0): the last K segments, and always every segment that
    holds a scored target. ``grad_segments`` None (or 0): from segment 0 (all of them).
    """
    scored = labels != IGNORE_INDEX
    cols = torch.arange(labels.size(1), device=labels.device)
    first = torch.where(scored, cols, labels.size(1)).min(dim=1).values // tgt_len
    last = torch.where(scored, cols, -1).max(dim=1).values // tgt_len
    if not grad_segments:
        return torch.zeros_like(first)
    return torch.minimum(first, last - grad_segments + 1).clamp(min=0)


def completion_losses(model, inputs: torch.Tensor, labels: torch.Tensor, *, span: AttentionSpan,
                      grad: bool = False, grad_segments: int | None = 1, dtype: str = "float32",
                      recon: list | None = None) -> torch.Tensor:
    """Summed negative log-likelihood (nats) of each row's scored targets: float [B].

    Args:
        model: a :class:`~txl.model.TransformerXLLM` (its train/eval mode is the caller's business).
        inputs, labels: int64 [B, L] right-padded rows and their labels (``IGNORE_INDEX``: not scored);
            every row needs at least one scored target.
        span: the attention span (``tgt_len`` cuts the segments, ``mem_len`` is the memory carried).
        grad: read with autograd, through the window of :func:`grad_window` (``grad_segments``);
            False: no graph at all.
        dtype: "float32" or an autocast dtype for the forward passes.
        recon: a list that receives each segment's attention-reconstruction loss (compressed memory,
            read with autograd), to be trained with the rest; None: not collected.

    Raises:
        TxlError: a row without a scored target, or shapes that do not match.
    """
    if labels.shape != inputs.shape or inputs.dim() != 2:
        raise TxlError(f"inputs and labels must both be [rows, tokens], got {tuple(inputs.shape)} and {tuple(labels.shape)}")
    scored = labels != IGNORE_INDEX
    if not bool(scored.any(dim=1).all()):
        raise TxlError("every row needs at least one scored target (a completion)")
    cols = torch.arange(labels.size(1), device=labels.device)
    lengths = torch.where(scored, cols, -1).max(dim=1).values + 1  # rows leave after their last target
    window = grad_window(labels, span.tgt_len, grad_segments) if grad else None
    sums = None
    check_reading_fits(model, inputs, span, grad=grad, dtype=dtype)
    for seg in segments(model, inputs, labels, span=span, lengths=lengths, dtype=dtype, grad=grad, grad_from=window):
        part = seg.output.token_loss.sum(dim=1)
        if recon is not None and seg.output.recon_loss is not None:
            recon.append(seg.output.recon_loss)
        if sums is None:
            sums = torch.zeros(inputs.size(0), dtype=part.dtype, device=part.device)
        sums = sums.index_add(0, seg.rows, part.to(sums.dtype))
    return sums


@torch.no_grad()
def evaluate_completions(model, rows: Sequence[tuple[np.ndarray, int]], *, span: AttentionSpan, unit: str,
                         batch_size: int = 8, dtype: str = "float32", dist=None,
                         progress: bool | str = False) -> EvalResult:
    """Mean NLL per completion target (the completion's tokens and END) over encoded pairs.

    ``rows`` are :func:`txl.data.pairs.encode_pair` results; they are batched by length (longest
    first) and read in eval mode (the model's mode is restored). With ``dist`` (a
    :class:`txl.distributed.Dist`) each rank reads its share of the batches and the sums
    are added over ranks, so every rank gets the single-process result. ``progress`` (True or a
    label): a progress bar over this rank's examples on stderr.

    Returns:
        :class:`~txl.evaluation.stream.EvalResult` (loss in nats per completion token).

    Raises:
        TxlError: no rows, or an unknown ``unit``.
    """
    if not rows:
        raise TxlError("no examples to evaluate")
    check_unit(unit)
    device = next(model.parameters()).device
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if dist is not None:
        chunks = chunks[dist.rank::dist.world]
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    with eval_mode(model), progress_bar(sum(map(len, chunks)), progress, "evaluating", "example") as bar:
        for chunk in chunks:
            x, y = pair_batch([rows[i] for i in chunk], device)
            sums[0] += completion_losses(model, x, y, span=span, dtype=dtype).double().sum()
            sums[1] += (y != IGNORE_INDEX).sum()
            bar.update(len(chunk))
    if dist is not None:
        from txl.distributed import all_sum

        all_sum(dist, sums)
    total, count = sums.tolist()
    return EvalResult(loss=total / count, n_tokens=int(count), unit=unit,
                      settings={"tgt_len": span.tgt_len, "mem_len": span.mem_len, "examples": len(rows)})
