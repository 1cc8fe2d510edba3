"""Attention distances (``txl plot CHECKPOINT --attention``): how far back each layer and head looks while
reading a text, and the share of attention on a compressed memory, measured from the attention
probabilities of :func:`txl.analysis.attention_maps.segment_probabilities`.
"""

from __future__ import annotations

import numpy as np
import torch

from txl.analysis.attention_maps import segment_probabilities
from txl.analysis.plots import pyplot, save_figure
from txl.config import AttentionSpan, resolve_span
from txl.errors import TxlError
from txl.kernels.cpu import check_reading_fits
from txl.model.compressive import split_mems
from txl.segments import eval_mode, segments


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
    segments of ``data``, read with the memory carried as in evaluation (:func:`txl.segments.segments`,
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
    :func:`txl.segments.segments`, in eval mode; ``model.config`` is not changed); for every
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


def plot_attention_distance(distance: np.ndarray, path, title: str = "") -> dict:
    """Heatmap of mean attention distance (tokens) per layer (rows) and head (columns).

    Args:
        distance: float [n_layer, n_head] (see :func:`mean_attention_distance`).

    Returns ``{"distance": distance}`` (the plotted array).
    """
    distance = np.asarray(distance, dtype=np.float64)
    if distance.ndim != 2:
        raise TxlError(f"distance must be [layers, heads], got shape {distance.shape}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * distance.shape[1], 1.0 + 0.6 * distance.shape[0]))
    im = ax.imshow(distance, cmap="viridis", aspect="auto")
    middle = (distance.min() + distance.max()) / 2
    for i in range(distance.shape[0]):
        for j in range(distance.shape[1]):
            ax.text(j, i, f"{distance[i, j]:.0f}", ha="center", va="center", fontsize=8,
                    color="w" if distance[i, j] < middle else "k")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(distance.shape[1]))
    ax.set_yticks(range(distance.shape[0]))
    fig.colorbar(im, ax=ax, label="mean distance (tokens)")
    if title:
        ax.set_title(title, fontsize=9)
    save_figure(fig, path)
    return {"distance": distance}
