"""Attention probabilities for analysis, recomputed outside the fast (fused SDPA) path.

The model's attention never materialises its probabilities. Here forward pre-hooks record each
layer's attention inputs (hidden states, memory, positional encodings, mask) during an
ordinary forward pass, and :func:`layer_probabilities` recomputes the probabilities from them with
the paper's score (§3.3): ``A = ((q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}) / sqrt(d_head)``, masked,
softmax over keys (or ``q·k / sqrt(d_head)`` for ``attn_type="abs"``). Nothing in the model changes.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from txl.errors import TxlError
from txl.evaluation.segments import eval_mode, segments
from txl.model.attention import shaw_distances
from txl.model.compressive import split_mems
from txl.model.span import AttentionSpan, resolve_span


def layer_probabilities(attn, h, mem, pos_emb, mask) -> torch.Tensor:
    """Attention probabilities of one :class:`~txl.model.attention.MultiHeadAttention` call.

    Args:
        attn: the attention module; h: [B, T, d_model] layer input; mem: [B, M, d_model] or None;
        pos_emb: [K, d_model] R for distances K-1 .. 0 ("rel"; None for "shaw" and "abs"); mask: bool [T, K], True = hidden.
        The u, v of a "rel" layer are ``attn.r_w_bias``/``attn.r_r_bias`` (its own, or the model's shared pair tied in).

    Returns:
        float [B, H, T, K] probabilities over keys [memory + current]; rows sum to 1, and masked
        keys get exactly 0.
    """
    hd = attn.n_head * attn.d_head
    mlen = 0 if mem is None else mem.size(1)
    cat = h if mlen == 0 else torch.cat([mem, h], dim=1)
    x = attn.layer_norm(cat) if attn.pre_lnorm else cat
    w = attn.qkv_net.weight
    q = attn._heads(F.linear(x[:, mlen:], w[:hd]))  # [B, H, T, D]
    k = attn._heads(F.linear(x, w[hd:2 * hd]))  # [B, H, K, D]
    klen = k.size(2)
    if attn.attn_type in ("rel", "shaw"):
        if attn.attn_type == "rel":
            u, v = attn.r_w_bias, attn.r_r_bias
            r_k = attn.r_net(pos_emb).view(klen, attn.n_head, attn.d_head)  # [K, H, D], slot m = distance K-1-m
        else:  # Shaw: no u, v; the learned a_d of this layer for the same slots (distances clipped)
            u = v = torch.zeros(attn.n_head, attn.d_head, dtype=q.dtype, device=q.device)
            r_k = attn.r_emb[shaw_distances(klen, attn.max_dist, q.device)].to(q.dtype)  # [K, H, D]
        content = torch.einsum("bhtd,bhkd->bhtk", q + u[:, None, :], k)
        by_slot = torch.einsum("bhtd,mhd->bhtm", q + v[:, None, :], r_k)  # [B, H, T, K] by distance slot
        # entry (i, j) needs distance M + i - j, which sits in slot K-1-(M+i-j)
        qi = torch.arange(h.size(1), device=h.device)[:, None]
        kj = torch.arange(klen, device=h.device)[None, :]
        slot = (klen - 1 - (mlen + qi - kj)).clamp(0, klen - 1)  # masked (future) entries: any slot
        position = by_slot.gather(-1, slot.expand(*by_slot.shape[:2], -1, -1))
        scores = (content + position) * attn.scale
    else:
        scores = torch.einsum("bhtd,bhkd->bhtk", q, k) * attn.scale
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


@contextlib.contextmanager
def recording(model):
    """Within the block, every layer's attention call appends ``(module, args)`` to the yielded list.

    ``args`` are the positional inputs of :meth:`~txl.model.attention.MultiHeadAttention.forward`
    (h, mem, pos_emb, mask, cache); :func:`taken_probabilities` turns them into probabilities.
    """
    captured: list[tuple] = []
    hooks = [layer.attn.register_forward_pre_hook(lambda module, args: captured.append((module, args)))
             for layer in model.layers]
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()


def taken_probabilities(captured: list[tuple]) -> list[torch.Tensor]:
    """The probabilities (float [B, H, T, K] per layer) of the calls in ``captured``, which is emptied."""
    probs = [layer_probabilities(module, *args[:4]) for module, args in captured]
    captured.clear()
    return probs


@torch.no_grad()
def attention_probabilities(model, input_ids: torch.Tensor, mems=None,
                            span: AttentionSpan | None = None) -> tuple[list[torch.Tensor], object]:
    """Run one forward pass and return every layer's attention probabilities.

    Args:
        model: :class:`~txl.model.TransformerXLLM` (use eval mode: dropout is not re-applied here).
        input_ids: int64 [B, T]; mems: memory from the previous segment or None.
        span: the :class:`~txl.model.AttentionSpan` of the forward pass (None: the model's).

    Returns:
        (probs, output): ``probs[l]`` float [B, H, T, M + T] for layer l, and the model's
        :class:`~txl.model.transformer.LMOutput` (its ``mems`` feed the next segment).
    """
    with recording(model) as captured:
        out = model(input_ids, mems=mems, span=span)
    return taken_probabilities(captured), out


def distance_matrix(qlen: int, klen: int) -> torch.Tensor:
    """float [T, K]: distance ``M + i - j`` (tokens back) from query i to key j, M = K - T."""
    mlen = klen - qlen
    return (mlen + torch.arange(qlen)[:, None] - torch.arange(klen)[None, :]).float()


@torch.no_grad()
def mean_attention_distance(model, tokens: np.ndarray, *, tgt_len: int | None = None,
                            mem_len: int | None = None, max_segments: int = 8,
                            cmem_len: int | None = None) -> np.ndarray:
    """Average attention distance per layer and head over a text, with the memory carried.

    The text is read in segments of ``tgt_len`` (memory of ``mem_len``, as in evaluation, through
    :func:`txl.evaluation.segments.segments`, in eval mode; ``model.config`` is not changed); for every
    query the expected distance ``sum_j p_ij (M + i - j)`` in tokens is averaged over queries and
    segments. With a compressed memory (``cmem_len``, None: the model's) distances count key slots:
    a compressed slot is one step older than the slot after it (see :mod:`txl.model.compressive`);
    :func:`compressed_attention_mass` says how much attention those slots get.

    Args:
        tokens: 1-D int array (at least 1 token); max_segments: stop after this many segments.

    Returns:
        float64 [n_layer, n_head] mean distances in tokens (key slots).

    Raises:
        TxlError: an empty text.
    """
    data = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if data.numel() < 1:
        raise TxlError("the text encodes to no tokens; give a longer --text")
    device = next(model.parameters()).device
    total, count = None, 0
    span = resolve_span(model.config, tgt_len=tgt_len, mem_len=mem_len, cmem_len=cmem_len)
    x_all = data[None, :span.tgt_len * max_segments].to(device)
    with eval_mode(model), recording(model) as captured:
        for seg in segments(model, x_all, span=span):
            probs, x = taken_probabilities(captured), seg.inputs
            per_layer = []
            for p in probs:  # [1, H, T, K]
                dist = distance_matrix(p.size(2), p.size(3)).to(p.device)
                per_layer.append((p * dist).sum(-1).sum(-1)[0].double().cpu())  # [H], summed over queries
            stacked = torch.stack(per_layer)  # [L, H]
            total = stacked if total is None else total + stacked
            count += x.size(1)
    return (total / count).numpy()


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
        TxlError: an empty text, or a span without compressed memory (``cmem_len`` 0).
    """
    data = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if data.numel() < 1:
        raise TxlError("the text encodes to no tokens; give a longer --text")
    span = resolve_span(model.config, tgt_len=tgt_len, mem_len=mem_len, cmem_len=cmem_len)
    if span.cmem_len == 0:
        raise TxlError("this model is read without a compressed memory (cmem_len 0): there is no attention on it")
    device = next(model.parameters()).device
    x_all = data[None, :span.tgt_len * max_segments].to(device)
    total, count = None, 0
    with eval_mode(model), recording(model) as captured:
        for seg in segments(model, x_all, span=span):
            probs = taken_probabilities(captured)
            _, compressed, _ = split_mems(seg.mems, model.config.n_layer)
            slots = 0 if compressed is None else compressed[0].size(1)
            mass = torch.stack([p[..., :slots].sum(-1).sum(-1)[0].double().cpu() for p in probs])  # [L, H]
            total = mass if total is None else total + mass
            count += seg.inputs.size(1)
    return (total / count).numpy()
