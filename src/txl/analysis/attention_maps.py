"""Attention probabilities for analysis, recomputed outside the fast (fused SDPA) path.

The model's attention never materialises its probabilities. Here forward pre-hooks record each
layer's attention inputs (hidden states, memory, positional encodings, mask, u/v biases) during an
ordinary forward pass, and :func:`layer_probabilities` recomputes the probabilities from them with
the paper's score (§3.3): ``A = ((q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}) / sqrt(d_head)``, masked,
softmax over keys (or ``q·k / sqrt(d_head)`` for ``attn_type="abs"``). Nothing in the model changes.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from txl.errors import TxlError
from txl.model.attention import shaw_distances


def layer_probabilities(attn, h, mem, pos_emb, mask, r_w_bias=None, r_r_bias=None) -> torch.Tensor:
    """Attention probabilities of one :class:`~txl.model.attention.MultiHeadAttention` call.

    Args:
        attn: the attention module; h: [B, T, d_model] layer input; mem: [B, M, d_model] or None;
        pos_emb: [K, d_model] R for distances K-1 .. 0 ("rel"; None for "shaw" and "abs"); mask: bool [T, K], True = hidden;
        r_w_bias, r_r_bias: shared u, v [H, D] (ignored when the layer has its own).

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
            u = attn.r_w_bias if hasattr(attn, "r_w_bias") else r_w_bias
            v = attn.r_r_bias if hasattr(attn, "r_r_bias") else r_r_bias
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


@torch.no_grad()
def attention_probabilities(model, input_ids: torch.Tensor, mems=None) -> tuple[list[torch.Tensor], object]:
    """Run one forward pass and return every layer's attention probabilities.

    Args:
        model: :class:`~txl.model.TransformerXLLM` (use eval mode: dropout is not re-applied here).
        input_ids: int64 [B, T]; mems: memory from the previous segment or None.

    Returns:
        (probs, output): ``probs[l]`` float [B, H, T, M + T] for layer l, and the model's
        :class:`~txl.model.transformer.LMOutput` (its ``mems`` feed the next segment).
    """
    captured: list[tuple] = []
    hooks = [layer.attn.register_forward_pre_hook(lambda module, args: captured.append((module, args)))
             for layer in model.layers]
    try:
        out = model(input_ids, mems=mems)
    finally:
        for hook in hooks:
            hook.remove()
    probs = [layer_probabilities(module, *args[:6]) for module, args in captured]
    return probs, out


def distance_matrix(qlen: int, klen: int) -> torch.Tensor:
    """float [T, K]: distance ``M + i - j`` (tokens back) from query i to key j, M = K - T."""
    mlen = klen - qlen
    return (mlen + torch.arange(qlen)[:, None] - torch.arange(klen)[None, :]).float()


@torch.no_grad()
def mean_attention_distance(model, tokens: np.ndarray, *, tgt_len: int | None = None,
                            mem_len: int | None = None, max_segments: int = 8) -> np.ndarray:
    """Average attention distance per layer and head over a text, with the memory carried.

    The text is read in segments of ``tgt_len`` (memory of ``mem_len``, as in evaluation); for every
    query the expected distance ``sum_j p_ij (M + i - j)`` in tokens is averaged over queries and
    segments.

    Args:
        tokens: 1-D int array (at least 1 token); max_segments: stop after this many segments.

    Returns:
        float64 [n_layer, n_head] mean distances in tokens.

    Raises:
        TxlError: an empty text.
    """
    from txl.evaluation.stream import attention_span

    data = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if data.numel() < 1:
        raise TxlError("the text encodes to no tokens; give a longer --text")
    device = next(model.parameters()).device
    total, count = None, 0
    with attention_span(model, tgt_len=tgt_len, mem_len=mem_len) as cfg:
        mems = None
        for n, start in enumerate(range(0, data.numel(), cfg.tgt_len)):
            if n >= max_segments:
                break
            x = data[None, start:start + cfg.tgt_len].to(device)
            probs, out = attention_probabilities(model, x, mems=mems)
            mems = out.mems
            per_layer = []
            for p in probs:  # [1, H, T, K]
                dist = distance_matrix(p.size(2), p.size(3)).to(p.device)
                per_layer.append((p * dist).sum(-1).sum(-1)[0].double().cpu())  # [H], summed over queries
            stacked = torch.stack(per_layer)  # [L, H]
            total = stacked if total is None else total + stacked
            count += x.size(1)
    return (total / count).numpy()
