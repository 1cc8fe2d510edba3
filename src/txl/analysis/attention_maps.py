"""Attention probabilities for analysis, from the plain reference of the mathematics.

The model's attention never materialises its probabilities (fused kernels). Here they come from
:mod:`txl.model.reference`, which reads a segment with the model's weights and the memory the model
carried: the paper's score (§3.3) ``A = ((q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}) / sqrt(d_head)``
(Shaw's or the vanilla score for those models), masked, softmax over keys. Nothing in the model is
hooked or changed; the tests hold the reference equal to the model's fast paths.
"""

from __future__ import annotations

import torch

from txl.model import reference
from txl.model.compressive import layer_memory, split_mems
from txl.config import AttentionSpan


@torch.no_grad()
def segment_probabilities(model, input_ids: torch.Tensor, mems=None,
                          span: AttentionSpan | None = None) -> list[torch.Tensor]:
    """Every layer's attention probabilities for one segment read after the memory ``mems``.

    Args:
        model: :class:`~txl.model.TransformerXLLM` in eval mode; input_ids: int64 [B, T].
        mems: the memory the segment is read with, as the model returns it (``n_layer`` tensors
            [B, M, d_model], or the ``3 * n_layer`` of a compressed memory) or None.
        span: the :class:`~txl.model.AttentionSpan` it is read with (None: the model's).

    Returns:
        per layer, float [B, H, T, K] over the keys [compressed, pending, memory, segment]; rows sum
        to 1 and hidden keys get exactly 0.
    """
    n_layer = len(model.layers)
    memory, compressed, pending = split_mems(mems, n_layer)
    before = None if mems is None else [layer_memory(memory, compressed, pending, i) for i in range(n_layer)]
    leading = sum(part[0].size(1) for part in (compressed, pending) if part is not None)
    return reference.read_segment(model, input_ids, before, leading, span).probs
