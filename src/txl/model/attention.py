"""Multi-head attention for Transformer-XL and the kernels of its relative position term (paper §3.3).

How positions enter a layer is a scheme of :mod:`txl.model.positions` (relative, Shaw, absolute, rotary).

Shapes use B = batch, T = query length (current segment), M = memory length, K = M + T keys,
H = heads, D = d_head. Everything is batch-first.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from txl.kernels import cpu
from txl.kernels.cpu import Dropout, Linear
from txl.model.decoding import LayerCache


def inverse_frequencies(dim: int, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``10000^(-2k/dim)`` for k = 0 .. dim/2 - 1 ([dim/2] of ``dtype``): the sinusoid's frequencies, and the
    rotary angles' θ (Su et al. 2021, eq. 15) in float64."""
    return 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=dtype, device=device) / dim))


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal encoding of (relative or absolute) positions (Vaswani et al. 2017; paper §3.3 R).

    Args:
        positions: tensor [N] of positions/distances (int64 or float).
        dim: even encoding width.

    Returns:
        float tensor [N, dim]: ``[sin(p * f_0..f_{dim/2-1}), cos(p * f_0..)]`` with
        ``f_k = 10000^(-2k/dim)`` (sine half first, as in the reference implementation).
    """
    inv_freq = inverse_frequencies(dim, positions.device)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_positions(klen: int, clamp_len: int, device: torch.device | str) -> torch.Tensor:
    """Distances ``klen-1, ..., 1, 0`` (int64 [klen]) clamped at ``clamp_len`` if > 0 (a ``clamp_len`` of
    ``klen`` or more changes nothing, however large): those R encodes ("rel"), or the rows of the Shaw table
    (``clamp_len``: its ``max_dist``)."""
    pos = torch.arange(klen - 1, -1, -1, device=device)
    if 0 < clamp_len < klen:
        pos = pos.clamp(max=clamp_len)
    return pos


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Realign position scores from "column m holds distance K-m" to "entry (i, j) holds distance M+i-j".

    Args:
        x: [..., T, K + 1] scores of each query against R for distances K ... 0 (each [T, K + 1] block
            dense; the leading dims may be a permutation, e.g. [B, H] of a head-major [H, B, T, K + 1]).
            Column 0, distance K, is read by no causal entry: any finite values will do.

    Returns:
        [..., T, K] strided view of ``x`` (no copy) with ``out[..., i, j] = x[..., i, T - i + j]`` for every
        causal entry ``j <= M + i`` (M = K - T): the pad-and-reshape trick of the reference implementation,
        with the pad as a real column. Row i starts T-i elements into row i of ``x`` and rows are K apart,
        so the view covers the last T*K elements of each block, each once; entries for future keys read
        the start of the next row, which no causal entry reads: they hold unrelated finite values and
        must be masked. Use :func:`rel_shift_bias` under autograd.
    """
    *lead, qlen, width = x.shape
    if x.stride()[-2:] != (width, 1):  # the trick needs each [T, K + 1] block dense (the leading dims may be permuted)
        x = x.contiguous()
    return x.as_strided((*lead, qlen, width - 1), x.stride()[:-2] + (width - 1, 1), x.storage_offset() + qlen)


class _RelShiftBias(torch.autograd.Function):
    """rel_shift plus the additive mask, as a new tensor, with a cheap backward (one strided copy)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, additive: torch.Tensor) -> torch.Tensor:
        ctx.head_major = x.dim() == 4 and not x.is_contiguous() and x.transpose(0, 1).is_contiguous()
        return rel_shift(x) + additive.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        *lead, qlen, klen = grad.shape
        if ctx.head_major:  # x was the [B, H] view of a dense [H, B, T, K + 1]: give its gradient that layout
            out = grad.new_empty((lead[1], lead[0], qlen, klen + 1)).transpose(0, 1)
        else:
            out = grad.new_empty((*lead, qlen, klen + 1))
        rel_shift(out).copy_(grad)  # each slot the view covers, once
        # slots m < T - i of row i: row 0's are outside the view, row i's hold row i-1's future entries
        corner = torch.ones(qlen, qlen, dtype=torch.bool, device=grad.device).tril_().flip(0)
        out[..., :qlen].masked_fill_(corner, 0.0)
        return out, None


def position_scores(q: torch.Tensor, r_k: torch.Tensor) -> torch.Tensor:
    """Scores of every query against every distance's position key, as the [B, H] view of a
    head-major product.

    Args:
        q: [B, H, T, D] queries (with v added and the scale applied, for "rel").
        r_k: [H, D, P] position keys (for :func:`rel_shift`, P = K + 1: distances K ... 0).

    Returns:
        [B, H, T, P], the transposed view of a dense [H, B, T, P]: one [B*T, D] x [D, P] product per
        head. (A batched matmul of [B, H, T, D] with [H, D, P] would copy r_k B times, and its
        backward would form B gradients of r_k and sum them.) :func:`rel_shift` reads this layout
        without a copy.
    """
    bsz, heads, qlen, d_head = q.shape
    x = torch.matmul(q.transpose(0, 1).reshape(heads, bsz * qlen, d_head), r_k)  # [H, B*T, P]
    return x.view(heads, bsz, qlen, -1).transpose(0, 1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = not visible) as the scores' addend: -inf where True, else 0, of ``dtype``.
    Added to finite scores it masks them; an infinite score (float16 that overflowed) becomes NaN."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


def rel_shift_bias(x: torch.Tensor, additive: torch.Tensor) -> torch.Tensor:
    """``rel_shift(x) + additive``, a new tensor [..., T, K] of ``x``'s dtype (and layout: head-major for
    :func:`position_scores`): the realigned, masked position term.

    Args:
        x: [..., T, K + 1] position scores ((b) + (d) of §3.3) for distances K ... 0.
        additive: [T, K] (or broadcastable to the output) :func:`additive_mask` of the attention mask.

    The backward maps gradients back with one strided copy. While ``torch.compile`` traces the model,
    the shift is a gather instead (:func:`rel_shift_gather`): the strided view needs the storage offset,
    which the compiler cannot trace, and its backward writes through a strided view, which it cannot lower.
    """
    if torch.compiler.is_compiling():
        return rel_shift_gather(x) + additive.to(x.dtype)
    if not (torch.is_grad_enabled() and x.requires_grad):  # no autograd node
        return rel_shift(x) + additive.to(x.dtype)
    return _RelShiftBias.apply(x, additive)


def rel_shift_gather(x: torch.Tensor) -> torch.Tensor:
    """:func:`rel_shift` as a gather: ``out[..., i, j] = x[..., i, T - i + j]`` for every causal entry,
    a new tensor [..., T, K] of ``x``'s dtype (a future entry, j > M + i, repeats column K: mask it). The
    form ``torch.compile`` traces, forward and backward (a scatter-add), and fuses with the mask."""
    *lead, qlen, width = x.shape
    rows = torch.arange(qlen, device=x.device)[:, None]
    cols = torch.arange(width - 1, device=x.device)[None, :]
    index = (cols + qlen - rows).clamp(max=width - 1)  # [T, K]
    return x.gather(-1, index.expand(*lead, qlen, width - 1))


def biased_attention(q_content: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     r_k: torch.Tensor, mask: torch.Tensor, *, scale: float, dropout_p: float = 0.0) -> torch.Tensor:
    """``softmax(scale * q_content·k + rel_shift(q_pos·r_k) masked) @ v``: attention with the position
    term (b) + (d) of §3.3 (or Shaw's q·a) as an additive bias of the fused kernel.

    Args:
        q_content: [B, H, T, D] queries for the content term (q + u for "rel"), unscaled.
        q_pos: [B, H, T, D] queries for the position term (q + v for "rel"), already scaled.
        k, v: [B, H, K, D] keys and values over [memory + current segment].
        r_k: [H, D, K + 1] position keys for distances K ... 0 (the layout :func:`rel_shift` reads; no
            causal entry reads distance K's column, whose finite values are the caller's choice).
        mask: bool [T, K] or [B, 1, T, K] (with padding), True = not visible.
        scale: the score scale 1/sqrt(D) applied to the content term.
        dropout_p: attention dropout probability (0 in evaluation).

    One query per row (T = 1) without autograd or dropout, in float32 or float64, is
    :func:`one_query_attention`. Without autograd on a CPU the bias is the realigned view of the scores
    themselves, the mask added in place (no second [B, H, T, K] tensor), and the batch rows and heads
    run in blocks of bounded memory (:func:`txl.kernels.cpu.in_blocks`). Under autograd, while
    compiling, and on other devices (where the in-place form has not been measured) it is the new tensor
    of :func:`rel_shift_bias`.

    Returns:
        [B, H, T, D] attention output (every form equal up to float rounding).
    """
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q_content, q_pos, k, v, r_k))
    compiling = torch.compiler.is_compiling()
    if q_pos.size(2) == 1 and not grad and not compiling and dropout_p == 0.0 and q_pos.dtype in (torch.float32,
                                                                                                 torch.float64):
        return one_query_attention(q_content, q_pos, k, v, r_k[..., 1:], mask, scale=scale)  # (half: the kernel's
        # float32 sums, as for longer segments)
    additive = additive_mask(mask, q_pos.dtype)
    in_place = not grad and not compiling and q_pos.device.type == "cpu"

    def attend(rows: slice, heads: slice) -> torch.Tensor:
        scores = position_scores(q_pos[rows, heads], r_k[heads])
        added = additive if additive.dim() == 2 else additive[rows]
        bias = rel_shift(scores).add_(added) if in_place else rel_shift_bias(scores, added)
        return F.scaled_dot_product_attention(q_content[rows, heads], k[rows, heads], v[rows, heads], attn_mask=bias,
                                              dropout_p=dropout_p, scale=scale)

    if not in_place:
        return attend(slice(None), slice(None))
    bsz, heads, qlen, d_head = v.size(0), v.size(1), q_pos.size(2), v.size(3)
    return cpu.in_blocks(attend, (bsz, heads, qlen, d_head), v, qlen * r_k.size(-1) * q_pos.element_size())


def one_query_attention(q_content: torch.Tensor, q_pos: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
                        r_k: torch.Tensor | None, mask: torch.Tensor | None, *, scale: float,
                        columns: torch.Tensor | None = None,
                        own: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """:func:`biased_attention` for one query per row (T = 1: the rel-shift is the identity), without
    autograd: two small products and a softmax, which beat the fused kernel's blocking on a CPU. The
    one-token decoding step of every layer, eager, compiled and exported.

    The keys need not be in time order (a ring of slots): the score of key j takes its own column of
    ``r_k``, whatever distance that is.

    Args:
        q_content: [B, H, 1, D] (or [B, H, D]) query of the content term, unscaled; q_pos: the same
            shape, the query of the position term, scaled (unused without ``r_k``).
        k, v: [B, H, K, D] keys and values (views of a decoding state's buffers are read as they are).
        r_k: the position keys, or None for no position term ("rope"): without ``columns`` [H, D, K],
            column j that of key j's distance; with ``columns`` a table [H, D, P] of distances.
        mask: bool [T, K] or [B, 1, 1, K], True = not visible, or None (every key visible).
        scale: the content term's scale.
        columns: int64 [K] (or [K + 1] with ``own``): the column of ``r_k`` of each key's distance, the
            own key's last (a ring whose slots rotate: a gather of B x H x K scores, not of the table).
        own: the query's own key and value [B, H, 1, D], scored beside the K keys instead of being
            written among them first (a ring whose slots a graph only reads); its position key is
            ``r_k``'s column ``columns[-1]``.

    Returns:
        [B, H, 1, D] attention output, contiguous.
    """
    bsz, heads, d_head = q_content.size(0), q_content.size(1), q_content.size(-1)
    klen, rows = k.size(2), bsz * heads
    keys = k.reshape(rows, klen, d_head).transpose(1, 2)  # (a view for a state's [B, H, S, D] buffer slice)
    q_rows = q_content.reshape(rows, 1, d_head)
    own_bias = None
    if r_k is None:
        scores = torch.bmm(q_rows, keys)
        if scale != 1.0:
            scores.mul_(scale)
    else:  # one [B, D] x [D, K] product per head (a batched product over B*H would copy r_k B times)
        bias = torch.bmm(q_pos.reshape(bsz, heads, d_head).transpose(0, 1), r_k)  # [H, B, K or P]
        if columns is not None:
            bias = bias.index_select(2, columns)
        bias = bias.transpose(0, 1).reshape(rows, 1, -1)
        if own is not None:
            own_bias, bias = bias[..., klen:], bias[..., :klen]
        if torch.compiler.is_compiling():  # inductor fuses a product and a sum into its loops, not a baddbmm
            scores = torch.bmm(q_rows, keys) * scale + bias
        else:
            scores = torch.baddbmm(bias, q_rows, keys, alpha=scale)
    if mask is not None:
        scores.view(bsz, heads, 1, klen).masked_fill_(mask if mask.dim() == 4 else mask[-1:], float("-inf"))
    if own is not None:
        k_own, v_own = own
        own_score = torch.bmm(q_rows, k_own.reshape(rows, 1, d_head).transpose(1, 2)) * scale
        scores = torch.cat([scores, own_score if own_bias is None else own_score + own_bias], dim=-1)
    wide = scores if scores.dtype in (torch.float32, torch.float64) else scores.float()
    probs = torch.softmax(wide, dim=-1).to(v.dtype)
    out = torch.bmm(probs if own is None else probs[..., :klen], v.reshape(rows, klen, d_head))
    if own is not None:
        out = out + probs[..., klen:] * own[1].reshape(rows, 1, d_head)
    return out.view(bsz, heads, 1, d_head)


def attention_mask(qlen: int, mlen: int, same_length: bool, mem_len: int, device: torch.device | str) -> torch.Tensor:
    """Boolean mask [T, K] over keys [memory + current]; True marks a key the query must not see.

    Query i sits at key index ``mlen + i`` and sees keys ``j <= mlen + i`` (causal). With
    ``same_length`` and ``mem_len > 0`` it sees only the last ``mem_len`` keys up to and including
    itself (``j > mlen + i - mem_len``), so every query with enough history sees exactly ``mem_len``
    keys. The diagonal is never masked, so no row is fully masked.
    """
    klen = mlen + qlen
    ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + mlen)
    if same_length and mem_len > 0:
        mask = mask | torch.tril(ones, diagonal=mlen - mem_len)
    return mask


class MultiHeadAttention(nn.Module):
    """Masked multi-head attention over [memory + current segment], its positions given by a scheme.

    Queries, keys and values are ``h W_q``, ``h̃ W_kE``, ``h̃ W_v`` with ``h̃ = [SG(mem) ∘ h]`` (paper
    §3.2); how positions enter the scores is the business of ``pos``, the layer's
    :class:`~txl.model.positions.PositionScheme` module chosen by ``config.attn_type`` ("rel": the
    paper's §3.3, "shaw", "abs", "rope"), which owns the position parameters (for "rel" ``r_net``,
    W_kR, and u/v; for "shaw" ``r_emb``). The scores are scaled by ``1/sqrt(d_head)``.

    Parameters: ``qkv_net`` (W_q, W_kE, W_v stacked, no bias), ``o_net`` (no bias), ``layer_norm``, and
    ``pos``'s.

    Args:
        config: the model's :class:`~txl.model.TransformerXLConfig` (``d_model``, ``n_head``,
            ``d_head``, ``dropout``, ``dropatt``, ``pre_lnorm``).
        pos: this layer's position scheme module.
    """

    param_first = ("pos",)  # its parameters are drawn before the projections' (txl.model.parameters)

    def __init__(self, config, pos: nn.Module) -> None:
        super().__init__()
        c = config
        self.n_head, self.d_head, self.pre_lnorm = c.n_head, c.d_head, c.pre_lnorm
        self.scale = 1.0 / math.sqrt(c.d_head)
        self.qkv_net = Linear(c.d_model, 3 * c.n_head * c.d_head, bias=False)
        self.o_net = Linear(c.n_head * c.d_head, c.d_model, bias=False)
        self.layer_norm = nn.LayerNorm(c.d_model)
        self.drop = Dropout(c.dropout)
        self.dropatt = nn.Dropout(c.dropatt)
        self.pos = pos

    def forward(self, h: torch.Tensor, mem: torch.Tensor | None, positions, mask: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """Attend from the current segment to [memory + current segment].

        Args:
            h: [B, T, d_model] input of this layer for the current segment.
            mem: [B, M, d_model] memory of this layer (detached states of earlier segments) or None.
                Ignored when ``cache`` already holds the memory's keys and values.
            positions: the call's positional input from the scheme's ``segment`` (for "rel" R
                [K, d_model] for distances K-1 ... 0, or None with a ``cache`` whose
                ``segment_pos_keys`` already hold this key length's; for "rope" the cos and sin of
                the keys' positions and whether same_length bands the mask; None for "shaw" and "abs").
            mask: bool [T, K], True = not visible (see :func:`attention_mask`).
            cache: this layer's part of a :class:`~txl.model.decoding.DecodingState` (incremental
                decoding without autograd, a scheme with memory): the keys and values of the memory
                are read from it instead of being projected from ``mem``, and the last ``capacity``
                keys/values of this call are stored in it (why that is exact: :mod:`txl.model.decoding`).

        Returns:
            [B, T, d_model]: the sub-layer output after residual (and LayerNorm unless ``pre_lnorm``).
        """
        bsz, qlen, _ = h.shape
        hd = self.n_head * self.d_head
        if cache is not None and cache.state.length > 0:  # the memory's keys/values are in the cache
            x = self.layer_norm(h) if self.pre_lnorm else h
            q, k, v = (self._heads(t) for t in self.qkv_net(x).split(hd, dim=-1))  # rows W_q, W_kE, W_v
            q, k = self.pos.rotate(q, k, positions)
            k, v = cache.update(k, v, h)  # [memory + segment]
        else:
            mlen = 0 if mem is None else mem.size(1)
            cat = h if mlen == 0 else torch.cat([mem, h], dim=1)  # [B, K, d]
            x = self.layer_norm(cat) if self.pre_lnorm else cat
            q = self._heads(self.qkv_net(x[:, mlen:], slice(0, hd)))  # queries only for the segment: [B, H, T, D]
            # keys and values [B, H, K, D] each; a detached memory's rows need no input gradient (with
            # pre-LN they do: the LayerNorm's parameters see them)
            detached = mlen > 0 and not mem.requires_grad and not self.pre_lnorm
            kv = self.qkv_net(x, slice(hd, None), mlen if detached else 0)
            k, v = (self._heads(t) for t in kv.split(hd, dim=-1))
            q, k = self.pos.rotate(q, k, positions)
            if cache is not None:  # a state's first call: keep the last keys/values
                k, v = cache.update(k, v, cat)
        dropatt = self.dropatt.p if self.training else 0.0
        vec = self.pos.attend(q, k, v, positions, mask, cache, dropatt)
        vec = vec.transpose(1, 2).reshape(bsz, qlen, hd)  # [B, T, H*D]
        out = self.drop(self.o_net(vec))
        return h + out if self.pre_lnorm else self.layer_norm(h + out)

    def step(self, h: torch.Tensor, cache, key_mask: torch.Tensor | None = None, positions=None) -> torch.Tensor:
        """One decoding step of one new token per row: what :meth:`forward` computes for a one-token
        segment after the memory, without concatenating or copying the memory.

        The token's query, key and value go to ``cache.update``, which returns the slots to attend to (a
        state's layer or a graph's view of a ring: :meth:`~txl.model.decoding.LayerCache.update`);
        :func:`one_query_attention` scores the query against them in slot order with the scheme's terms
        (for "rel" and "shaw" a table of distances read at each slot's distance). Only ``key_mask`` hides a
        slot (with ``same_length`` the capacity is ``mem_len``, so the oldest key has already left, as the
        mask would drop it).

        Args:
            h: [B, 1, d_model] input of this layer for the new token (eval mode, no autograd).
            cache: this layer's :class:`~txl.model.decoding.LayerCache` (a state's, or a graph's view).
            key_mask: bool [B, 1, 1, K] or [1, K], True for slots a row must not attend to (the padding
                of memories of different lengths, see :func:`txl.model.decoding.slot_padding_mask`).
            positions: what the scheme's ``step_positions`` built for this step (None for "rel", "shaw").

        Returns:
            [B, 1, d_model]: the sub-layer output, as :meth:`forward`.
        """
        bsz, heads, d_head = h.size(0), self.n_head, self.d_head
        norm = self.layer_norm  # functional calls: a step is mostly call overhead
        x = F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps) if self.pre_lnorm else h
        q, k, v = self.qkv_net.forward(x).view(bsz, 3, heads, d_head).unbind(1)  # [B, H, D] each
        q, k = self.pos.step_rotate(q, k, positions)
        keys, values = cache.update(k.unsqueeze(2), v.unsqueeze(2), h)  # the slots, in slot order
        vec = self.pos.step_attend(q, keys, values, cache, key_mask)  # [B, H, 1, D]
        out = self.o_net.forward(vec.view(bsz, 1, heads * d_head))
        if self.pre_lnorm:
            return h + out
        return F.layer_norm(h + out, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H*D] -> [B, H, L, D]."""
        return x.view(x.size(0), x.size(1), self.n_head, self.d_head).transpose(1, 2)
