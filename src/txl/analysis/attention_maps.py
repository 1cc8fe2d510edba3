"""Attention probabilities for analysis, from the plain reference of the mathematics.

The model's attention never materialises its probabilities (fused kernels). Here they come from
:mod:`txl.model.reference`, which reads a segment with the model's weights and the memory the model
carried: the paper's score (§3.3) ``A = ((q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}) / sqrt(d_head)``
(Shaw's or the vanilla score for those models), masked, softmax over keys. Nothing in the model is
hooked or changed; the tests hold the reference equal to the model's fast paths.
"""

from __future__ import annotations

import numpy as np
import torch

from txl.errors import TxlError
from txl.model.segments import eval_mode, segments
from txl.model import reference
from txl.model.compressive import layer_memory, split_mems
from txl.config import AttentionSpan, resolve_span
from txl.kernels.cpu import check_reading_fits


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


def _token_tensor(tokens: np.ndarray, max_segments: int) -> torch.Tensor:
    """``tokens`` as int64 [N], checked: at least one token, and ``max_segments`` >= 1."""
    if max_segments < 1:
        raise TxlError(f"max_segments must be >= 1, got {max_segments}")
    data = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if data.numel() < 1:
        raise TxlError("the text encodes to no tokens; give a longer text")
    return data


def distance_matrix(qlen: int, klen: int) -> torch.Tensor:
    """float [T, K]: distance ``M + i - j`` (tokens back) from query i to key j, M = K - T."""
    mlen = klen - qlen
    return (mlen + torch.arange(qlen)[:, None] - torch.arange(klen)[None, :]).float()


def _mean_over_queries(model, data: torch.Tensor, span: AttentionSpan, max_segments: int, measure) -> np.ndarray:
    """float64 [n_layer, n_head]: ``measure(seg, probs)`` averaged over the queries of the first ``max_segments``
    segments of ``data``, read with the memory carried as in evaluation (:func:`txl.model.segments.segments`,
    in eval mode, at ``span``). ``measure`` gets a segment and its :func:`segment_probabilities` and returns
    float64 [n_layer, n_head] summed over the segment's queries."""
    device = next(model.parameters()).device
    x_all = data[None, :span.tgt_len * max_segments].to(device)
    total, count = None, 0
    with eval_mode(model):
        check_reading_fits(model, x_all, span)
        for seg in segments(model, x_all, span=span):
            part = measure(seg, segment_probabilities(model, seg.inputs, seg.mems, span))
            total = part if total is None else total + part
            count += seg.inputs.size(1)
    return (total / count).numpy()


@torch.no_grad()
def mean_attention_distance(model, tokens: np.ndarray, *, tgt_len: int | None = None,
                            mem_len: int | None = None, max_segments: int = 8,
                            cmem_len: int | None = None) -> np.ndarray:
    """Average attention distance per layer and head over a text, with the memory carried.

    The text is read in segments of ``tgt_len`` (memory of ``mem_len``, as in evaluation, through
    :func:`txl.model.segments.segments`, in eval mode; ``model.config`` is not changed); for every
    query the expected distance ``sum_j p_ij (M + i - j)`` in tokens is averaged over queries and
    segments. With a compressed memory (``cmem_len``, None: the model's) distances count key slots:
    a compressed slot is one step older than the slot after it (see :mod:`txl.model.compressive`);
    :func:`compressed_attention_mass` says how much attention those slots get.

    Args:
        tokens: 1-D int array (at least 1 token); max_segments: stop after this many segments.

    Returns:
        float64 [n_layer, n_head] mean distances in tokens (key slots).

    Raises:
        TxlError: an empty text, or ``max_segments`` < 1.
    """
    data = _token_tensor(tokens, max_segments)
    span = resolve_span(model.config, tgt_len=tgt_len, mem_len=mem_len, cmem_len=cmem_len)

    def distance(seg, probs: list[torch.Tensor]) -> torch.Tensor:
        per_layer = []
        for p in probs:  # [1, H, T, K]
            dist = distance_matrix(p.size(2), p.size(3)).to(p.device)
            per_layer.append((p * dist).sum(-1).sum(-1)[0].double().cpu())  # [H], summed over queries
        return torch.stack(per_layer)  # [L, H]

    return _mean_over_queries(model, data, span, max_segments, distance)


@torch.no_grad()
def compressed_attention_mass(model, tokens: np.ndarray, *, tgt_len: int | None = None, mem_len: int | None = None,
                              cmem_len: int | None = None, max_segments: int = 8) -> np.ndarray:
    """Share of attention on the compressed memory per layer and head (Rae et al. 2019, §5.6 / Figure 3).

    The text is read as in :func:`mean_attention_distance`; for every query the probability mass on
    the compressed slots (the first C keys; the pending states are not counted) is averaged over the
    queries of every segment, also those read before the compressed memory filled (mass 0 there).

    Returns:
        float64 [n_layer, n_head] shares in [0, 1].

    Raises:
        TxlError: an empty text, ``max_segments`` < 1, or a span without compressed memory (``cmem_len`` 0).
    """
    data = _token_tensor(tokens, max_segments)
    span = resolve_span(model.config, tgt_len=tgt_len, mem_len=mem_len, cmem_len=cmem_len)
    if span.cmem_len == 0:
        raise TxlError("this model is read without a compressed memory (cmem_len 0): there is no attention on it")

    def mass(seg, probs: list[torch.Tensor]) -> torch.Tensor:
        _, compressed, _ = split_mems(seg.mems, model.config.n_layer)
        slots = 0 if compressed is None else compressed[0].size(1)
        return torch.stack([p[..., :slots].sum(-1).sum(-1)[0].double().cpu() for p in probs])  # [L, H]

    return _mean_over_queries(model, data, span, max_segments, mass)
