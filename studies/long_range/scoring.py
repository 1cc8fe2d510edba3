"""Does the model answer with the fact it read d tokens ago? Exact-match retrieval of answers in a stream.

The episodes of :mod:`txl_studies.long_range.episodes` hold a question whose answer bytes are known. A model
reads each episode as it reads any text: segment by segment with its memory (paper §3.2) through
:func:`txl.segments.segments`, or, for a vanilla model (``attn_type="abs"``), with a
window of the last ``context`` tokens before each answer byte (the paper's vanilla protocol, §3.1).
Answers are teacher-forced: the prediction of answer byte i sees the true bytes before it, and an
answer is right when every byte's arg max is the true byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from txl.config import IGNORE_INDEX, AttentionSpan
from txl.kernels.cpu import check_reading_fits
from txl.segments import eval_mode, segments

__all__ = ["RetrievalScore", "retrieval_score"]


@dataclass(frozen=True)
class RetrievalScore:
    """Exact-match retrieval over a set of episodes.

    Attributes:
        exact: bool [n] per episode, every answer byte right.
        bytes_right, bytes_total: answer bytes predicted right, and in all.
    """

    exact: np.ndarray
    bytes_right: int
    bytes_total: int

    @property
    def accuracy(self) -> float:
        """The fraction of episodes answered exactly."""
        return float(self.exact.mean()) if self.exact.size else 0.0

    @property
    def byte_accuracy(self) -> float:
        """The fraction of answer bytes predicted right."""
        return self.bytes_right / self.bytes_total if self.bytes_total else 0.0


@torch.no_grad()
def retrieval_score(model, tokens: np.ndarray, labels: np.ndarray, *, span: AttentionSpan | None = None,
                    context: int | None = None, batch_size: int = 32) -> RetrievalScore:
    """Teacher-forced exact match of the answers in ``labels``.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` (its mode is restored afterwards).
        tokens: int64 [B, L] episodes (left-padded to one length).
        labels: int64 [B, L]: at an answer byte's position, that byte (the model predicts it from the
            position before); -100 elsewhere.
        span: the span to read with, segment by segment with the memory (models with memory).
        context: instead, a vanilla window: each answer byte is predicted from the ``context``
            tokens before it, read in one forward pass without memory (``attn_type="abs"``).
        batch_size: episodes read together.

    Returns:
        :class:`RetrievalScore`.
    """
    if (span is None) == (context is None):
        raise ValueError("give span (memory) or context (vanilla window), not both")
    device = next(model.parameters()).device
    n = tokens.shape[0]
    exact = np.ones(n, dtype=bool)
    right = total = 0
    with eval_mode(model):
        for start in range(0, n, batch_size):
            x = torch.as_tensor(tokens[start:start + batch_size], device=device)
            y = torch.as_tensor(labels[start:start + batch_size], device=device)
            pred = _predict(model, x, y, span, context)  # [b, L]: arg max for position t (target y[t])
            scored = y != IGNORE_INDEX
            ok = (pred == y) | ~scored
            exact[start:start + x.size(0)] = ok.all(1).cpu().numpy()
            right += int(((pred == y) & scored).sum())
            total += int(scored.sum())
    return RetrievalScore(exact, right, total)


def _predict(model, x: torch.Tensor, y: torch.Tensor, span: AttentionSpan | None, context: int | None) -> torch.Tensor:
    """Arg max predictions of the targets ``y`` (predicted from the position before), -1 where not scored."""
    pred = torch.full_like(y, -1)
    if span is not None:
        check_reading_fits(model, x[:, :-1], span)
        for seg in segments(model, x[:, :-1], span=span):  # the output at column j predicts token j + 1
            pred[:, seg.start + 1:seg.start + 1 + seg.inputs.size(1)] = seg.output.logits.argmax(-1)
        return pred
    for t in torch.nonzero((y != IGNORE_INDEX).any(0)).flatten().tolist():  # the answer columns only
        lo = max(0, t - context)
        logits = model(x[:, lo:t]).logits[:, -1]
        pred[:, t] = logits.argmax(-1)
    return pred
